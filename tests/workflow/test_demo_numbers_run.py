"""``make demo-numbers`` on a real run (issue 46, item 2): the numbers the docs' blocks quote
are the run's, read from its outputs (the CI-sized run here: ``make demo``'s DAG on a tiny
model), and the report's demo paragraph names each previous-token measure with its value."""

from __future__ import annotations

import json
import re

import pytest

from posmech.core import names
from posmech.pipeline import demo_numbers as dn
from posmech.store.tables import read_table
from tests.workflow.conftest import REPO

pytestmark = pytest.mark.workflow


def test_the_blocks_quote_the_runs_numbers(ci_run):
    data = dn.collect(ci_run / "results", REPO / "config" / "ci.yaml")
    run = dn.Run(data)
    assert run.trained() == ["demo"]
    s = json.loads((ci_run / "results/demo/training/summary.json").read_text())
    readme = "\n".join(dn.readme_table(run))
    assert (f"| {s['best_previous_token_head']} {dn.f3(s['best_previous_token_score'])} | {s['best_induction_head']} "
            f"{dn.f3(s['best_induction_score'])} (") in readme
    assert readme.split("\n")[2].endswith(f"| {dn.f3(s['heldout_loss'])} |")
    heads = read_table(ci_run / "results/demo/heads.csv")
    rules = "\n".join(dn.p_rules(run))
    sharp = heads[heads["p7_chosen"] == "sharp"]
    if len(sharp):  # a sharp previous-token head above the uniform baseline (the CI model's 60 steps may grow none)
        sharp = sharp.iloc[0]
        assert (f"the sharp head is {sharp['head_name']}, diagonal ratio {dn.f3(sharp['diagonal_ratio'])}; its "
                f"previous-token mass {dn.f3(sharp['prev_token_mass'])}") in rules
    else:
        assert "no head of `demo` is a previous-token head above the uniform baseline" in rules
    findings = read_table(ci_run / "results/report/findings.csv")
    mine = findings[findings["model"] == "demo"]
    counts = "\n".join(dn.findings_counts(run))
    assert f"- `demo` ({len(mine)} claims): holds {(mine['verdict'] == 'holds').sum()} (" in counts
    # every block of the shipped docs is written from this run without an error
    texts = dn.written(run)
    assert all(dn.VARIES in t for p, t in texts.items() if p.name == "README.md")


def test_the_demo_paragraph_names_each_measure(ci_run):
    html = (ci_run / "results/report/index.html").read_text()
    s = json.loads((ci_run / "results/demo/training/summary.json").read_text())
    heads = read_table(ci_run / "results/demo/heads.csv")
    best = s["best_previous_token_head"]
    mass = float(heads.loc[heads["head_name"] == best, "prev_token_mass"].iloc[0])
    start = html.index('id="demo-demo"')
    para = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", html[start:html.index("</p>", start)]))
    assert (f"{best} ({names.HELDOUT_PREV_SCORE} {s['best_previous_token_score']:.3f}; its {names.PREV_TOKEN_MASS} "
            f"on the analysis documents, as in the head roles: {mass:.3f})") in para
    assert f"Best {names.HELDOUT_LOOK_BACK_TWO}: {s['best_look_back_two_head']}" in para
