"""The report's self-check block (issue 29): expected vs obtained verdict per (claim, model),
disagreements marked and listed first, shown only when the config has ``selfcheck.cases: true``."""

from __future__ import annotations

import re

import pandas as pd

from posmech.verdicts import findings as fd
from posmech.report import html as rp
from posmech.report.selfcheck_table import CAPTION, selfcheck_html

from .test_html import fabricated_run  # noqa: F401  (fixture)

FINDINGS = pd.DataFrame([
    {"claim": "P5", "model": "relay", "verdict": "holds", "value": 0.12, "reason": "0.12 <= 0.5"},
    {"claim": "P5", "model": "direct", "verdict": "holds", "value": 0.97, "reason": "0.97 <= 0.99 (flipped)"},
    {"claim": "K9", "model": "direct", "verdict": "not measurable", "value": None, "reason": "nothing to fit"},
])
EXPECTED = {"relay": {"P5": "holds"}, "direct": {"P5": "fails", "K9": "not measurable", "C1": "not measurable"}}


def rows(html: str) -> list[str]:
    return re.findall(r'<tr class="(\w+)">(.*?)</tr>', html)


def test_every_expected_pair_with_its_obtained_verdict_disagreements_first():
    html = str(selfcheck_html(FINDINGS, EXPECTED))
    assert CAPTION in html and 'id="selfcheck"' in html
    assert "2 of 4 expected verdicts obtained; <strong>2 disagree</strong>" in html
    got = [(cls, re.findall(r">([^<>]+)</t[dh]>", r)) for cls, r in rows(html)]
    # the two disagreements first (by claim): P5 on direct (fails expected, holds obtained), C1 missing from the table
    assert [(c, cells[:4]) for c, cells in got] == [
        ("disagrees", ["direct", "fails", "holds", "0.97"]),
        ("disagrees", ["direct", "not measurable", "(missing)", "DISAGREES: not in the findings table"]),
        ("agrees", ["relay", "holds", "holds", "0.12"]),  # then by claim (P before K), then model
        ("agrees", ["direct", "not measurable", "not measurable", "agrees"]),
    ]
    assert ">P5</a>" in rows(html)[0][1] and "0.97 &lt;= 0.99 (flipped)" in rows(html)[0][1]
    assert '<details class="fold" id="fold-selfcheck" open>' in html  # opened when something disagrees


def test_all_agreeing_is_folded_and_no_expected_verdicts_show_nothing():
    ok = {"relay": {"P5": "holds"}, "direct": {"K9": "not measurable"}}
    html = str(selfcheck_html(FINDINGS, ok))
    assert "2 of 2 expected verdicts obtained: all agree" in html and 'class="disagrees"' not in html
    assert '<details class="fold" id="fold-selfcheck">' in html
    assert str(selfcheck_html(FINDINGS, None)) == "" and str(selfcheck_html(FINDINGS, {})) == ""


def test_the_report_shows_the_block_only_with_selfcheck_cases(fabricated_run, tmp_path, monkeypatch):  # noqa: F811
    """With ``selfcheck.cases: true`` the report compares the findings with the hand-built
    cases' expected verdicts (posmech.verdicts.selfcheck.expected_verdicts, here two of them)."""
    from posmech.verdicts import selfcheck as sc

    monkeypatch.setattr(sc, "expected_verdicts", lambda: {"gpt2": {"P5": "holds"}, "demo": {"P5": "fails"}})
    page = fabricated_run["dir"] / "results/report/index.html"
    assert 'id="selfcheck"' not in page.read_text()  # the fixture's config has no selfcheck section
    assert 'id="published-models"' in page.read_text()  # the note on which model each published value belongs to
    findings = tmp_path / "findings.csv"
    table = FINDINGS.assign(model=["gpt2", "demo", "demo"]).reindex(columns=fd.FINDINGS_COLUMNS + fd.TWIN_COLUMNS)
    table.assign(twin_of="").to_csv(findings, index=False)
    kwargs = {k: v for k, v in fabricated_run.items() if k not in ("dir", "counts")}
    kwargs["config"] = {**kwargs["config"], "selfcheck": {"cases": True}}
    rp.build(**{**kwargs, "findings": str(findings)})
    text = page.read_text()
    assert text.index('id="findings"') < text.index('id="selfcheck"') < text.index('id="scorecard"')
    assert '<a href="#selfcheck">Self-check</a>' in text
    assert "1 of 2 expected verdicts obtained; <strong>1 disagree</strong>" in text
    # hand-built models: the posts' published numbers do not concern them, and the note about them is not shown
    assert 'id="published-models"' not in text and "Which model do the published values refer to?" not in text
