"""The report of the CI-sized run: opened in headless Chromium, scorecard semantics on the
demo model, and Snakemake's native --report of the same run."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest

from posmech.analyses.taxonomy import SHARP_FALLBACK_RULE
from posmech.report.browser import check_page
from posmech.verdicts.scorecard import STATUSES, is_judged, load_published
from posmech.store.tables import read_table
from tests.conftest import require_system
from tests.workflow.conftest import REPO, snakemake

pytestmark = pytest.mark.workflow


def test_report_opens_in_chromium_with_every_image_and_link(ci_run):
    require_system("chromium")
    report = ci_run / "results/report"
    shot = report / "screenshot.png"
    res = check_page(report / "index.html", shot)
    assert res.console_errors == []
    assert res.broken_images == []
    assert res.broken_links == []
    figures = sorted(p for p in (report / "figures").rglob("*.png"))
    assert res.n_images == len(figures) >= 1  # every copied figure is shown, the training curve at least
    assert shot.stat().st_size > 20_000
    # at a glance (1280 px): before anything is opened the page fits in a few screens; a legend
    # for every status; every scorecard row with its status; the status chips filter the rows
    # (five screens since the S family, the null's legend and the order of formation joined the
    # open part: 4,225 px on the CI-sized run of 2026-11-28; four before)
    assert res.height_unopened <= 5 * 900, res.height_unopened
    assert res.height_unfolded > 3 * res.height_unopened
    assert set(res.legend) == {s.replace(" ", "-") for s in STATUSES}
    assert res.scorecard_rows > 0 and res.rows_without_status == []
    assert res.status_filter and all(shown == want and ok for shown, want, ok in res.status_filter.values())
    # at 1280 px: no figure wider than its column, no horizontal scrollbar (scorecard included)
    assert res.size[0] <= 1280 and not res.page_scrolls_sideways
    assert res.wide_elements == []
    assert not [e for e in res.scrolling_elements if "scorecard" in e or e.startswith("main")], res.scrolling_elements
    # figures are drawn for the report's column: none is shrunk below 85 % of its natural width
    for src, natural, shown in res.image_widths:
        assert shown >= 0.85 * min(natural, 1190), (src, natural, shown)


def test_demo_report_says_published_values_are_for_other_models(ci_run):
    html = (ci_run / "results/report/index.html").read_text()
    summary = json.loads((ci_run / "results/demo/training/summary.json").read_text())
    assert "None of this run's models (demo) is a model of the posts" in html
    assert re.search(rf'id="demo-demo-prev-head">{summary["best_previous_token_head"]}<', html)
    assert 'src="figures/demo/training/curve.png"' in html
    assert "<h2 id=\"run\">" in html and "bible" in html


def test_scorecard_shows_judged_rows_first_and_the_rest_compactly(ci_run):
    html = (ci_run / "results/report/index.html").read_text()
    card = pd.read_csv(ci_run / "results/report/scorecard.csv")
    judged = card[[is_judged(r) for r in card.to_dict("records")]]
    if len(judged):
        assert html.index('id="scorecard-judged"') < html.index('id="scorecard-compact"')
    compact = html[html.index('id="scorecard-compact"'):html.index('<h2 id="demo"')]
    # one line per claim and model, not one per quantity, each with its quantities' statuses
    rest = card[~card.index.isin(judged.index)]
    assert compact.count("<tr data-status=") == len(rest.groupby(["claim", "model"]))
    for (claim, model), g in rest.groupby(["claim", "model"]):
        want = " ".join(s.replace(" ", "-") for s in STATUSES if s in set(g.status))
        assert f'<tr data-status="{want}">\n<td><a href="#claim-{claim}">{claim}</a></td><td>{model}</td>' in compact


def test_scorecard_on_demo_never_passes_a_gpt2_number(ci_run):
    card = read_table(ci_run / "results/report/scorecard.csv")
    assert set(card.model) <= {"demo"}
    entries = {(e.claim, e.quantity): e for e in load_published(REPO / "resources/published.yaml")}
    for r in card.itertuples():
        e = entries.get((r.claim, r.quantity))
        if e is None:  # a finding's quantity the model lacks the object of: nothing to measure
            assert r.status in ("no published value", "missing", "nothing to measure")
        elif not e.any_model:
            assert r.status == "other model", r
        if r.status == "pass":
            assert r.reproduced != "—"
    # every row of every scorecard the run wrote appears in the report's scorecard
    rows = pd.concat([read_table(p) for p in (ci_run / "results/demo/scorecard").glob("*.csv")])
    got = set(zip(card.claim, card.quantity))
    assert set(zip(rows.claim, rows.quantity)) <= got


def test_report_rule_timing_is_recorded(ci_run):
    bench = pd.read_csv(ci_run / "benchmarks/report/report.tsv", sep="\t")
    assert bench["s"].iloc[-1] > 0  # the <30 s target is measured in docs/performance.md


def test_native_snakemake_report_of_the_same_run(ci_run):
    out = ci_run / "native-report.html"
    proc = snakemake(ci_run, "--report", str(out))
    assert proc.returncode == 0, proc.stderr[-4000:]
    text = out.read_text(errors="replace")
    assert "Scorecard" in text and "Demo model" in text
    assert "Models of this run: demo" in text  # the workflow description (workflow.rst), rendered


def test_findings_verdict_every_claim_and_lead_the_report(ci_run):
    """One verdict per claim of resources/findings.yaml on the CI model, never "not applicable",
    each "not measurable" with its reason; the grid opens the report; the head-roles table has
    one row per head."""
    from posmech.verdicts.findings import VERDICTS, load_findings

    table = pd.read_csv(ci_run / "results/report/findings.csv")
    claims = [f.claim for f in load_findings(REPO / "resources/findings.yaml")]
    assert sorted(table["claim"]) == sorted(claims) and set(table["model"]) == {"demo"}
    assert set(table["verdict"]) <= set(VERDICTS)
    unmeasured = table[table["verdict"] == "not measurable"]
    assert unmeasured["reason"].fillna("").str.len().gt(10).all()
    assert table.loc[table["verdict"] != "not measurable", "value"].notna().all()
    html = (ci_run / "results/report/index.html").read_text()
    assert html.index('id="findings"') < html.index('id="scorecard"')
    heads = read_table(ci_run / "results/demo/heads.csv")
    assert list(heads["head_name"]) == ["L0H0", "L0H1", "L1H0", "L1H1"]  # the CI model: 2 layers x 2 heads
    assert heads["previous_token"].notna().all() and heads["kernel_type"].notna().all()
    # every role with its score and its pass (the CI model is in the taxonomy, anatomy, kernels,
    # contextual and attention-only analyses)
    for role, score in (("previous_token", "prev_token_mass"), ("score_taxon", "taxon_dip"),
                        ("kernel_role", "etc_fraction"), ("l_role", "l_previous_mass")):
        assert heads[role].notna().all() and heads[score].notna().all(), role
    # the sharp head holds the role unless the taxonomy chose it by its fallback (no head above the
    # uniform baseline by the margin: 60 training steps may make none)
    chosen = read_table(ci_run / "results/demo/taxonomy/heads.csv")
    fallback = chosen.loc[chosen["role"] == "sharp", "rule"].iloc[0] == SHARP_FALLBACK_RULE
    assert (heads["p7_chosen"] == "sharp").sum() == (0 if fallback else 1)
    assert heads.loc[heads["p7_chosen"] != "none", "previous_token"].all()
    assert set(heads["l_role"]) <= {"previous", "look_back_two", "induction", "none"}
    layer0 = heads[heads["layer"] == 0]
    assert layer0["k7_class"].notna().all() and heads.loc[heads["layer"] > 0, "k7_class"].isna().all()
    # the cross-model head-roles view: below the scorecard, the sharp head in its row
    assert html.index('id="scorecard"') < html.index('id="head-roles"') < html.index('id="demo"')
    row = re.search(r'<tr data-role="p7_chosen=sharp">.*?</tr>', html).group(0)
    if fallback:
        assert "<code>" not in row and ">none</td>" in row
    else:
        assert f"<code>{heads.loc[heads['p7_chosen'] == 'sharp', 'head_name'].iloc[0]}</code>" in row


def test_the_ci_sweep_runs_only_the_followed_family_and_its_table_agrees_with_the_grid(ci_run):
    """config/ci.yaml's model saves three checkpoints (issue 30): each runs only the taxonomy
    family (its `dynamics` follows P6, P7), results/report/dynamics.csv has one row per point
    and followed quantity with the model itself last, its final point's findings are the
    grid's, and the report shows the section."""
    from posmech.verdicts.dynamics import DYNAMICS_COLUMNS
    from posmech.verdicts.findings import VERDICTS
    from tests.workflow.conftest import analyses_run

    import yaml

    cfg = yaml.safe_load((REPO / "config" / "ci.yaml").read_text())
    steps = cfg["models"]["demo"]["train"]["checkpoints"]
    for s in steps:
        ran = set(analyses_run(ci_run, f"demo@step{s}"))
        assert ran == {"checkpoint_model", "attention_statistics", "diagonal_taxonomy", "head_table"}, (s, ran)
        assert not (ci_run / f"results/demo@step{s}/activations").exists()  # nothing followed reads the cache
    t = pd.read_csv(ci_run / "results/report/dynamics.csv")
    assert list(t.columns) == DYNAMICS_COLUMNS
    points = t.drop_duplicates("checkpoint")
    assert list(points["revision"]) == [f"step{s}" for s in steps] + ["final"]
    assert list(points["step"]) == [*steps, cfg["models"]["demo"]["train"]["steps"]]
    assert list(points["checkpoint"]) == [f"demo@step{s}" for s in steps] + ["demo"]
    assert set(t["verdict"]) <= set(VERDICTS)
    # the followed findings, and the head-role counts: the model itself assigns kernel types and
    # L roles (its kernels and attn_only families ran), its checkpoints not (not followed)
    assert set(t["claim"]) == {"P6", "P7", "K3", "L1"}
    counts = t[t["claim"].isin(["K3", "L1"])]
    assert counts["quantity"].str.match(r"n_(kernel|l_role)_").all()
    assert (counts.loc[counts["revision"] != "final", "verdict"] == "not measurable").all()
    assert counts.loc[counts["revision"] != "final", "reason"].str.contains("did not run on this model").all()
    assert counts.loc[counts["revision"] == "final", "value"].notna().all()
    assert {"largest_prev_token_mass", "largest_prev_token_mass_layer", "n_previous_token_heads"} <= set(t["quantity"])
    grid = pd.read_csv(ci_run / "results/report/findings.csv").set_index("claim")
    final = t[(t["revision"] == "final") & (t["quantity"] == grid.loc["P6", "quantity"])].iloc[0]
    assert (final["verdict"], final["value"]) == (grid.loc["P6", "verdict"], grid.loc["P6", "value"])
    heads = read_table(ci_run / "results/demo/heads.csv")
    sharp = t[(t["revision"] == "final") & (t["quantity"] == "largest_prev_token_mass")].iloc[0]
    assert sharp["value"] == heads["prev_token_mass"].max() and sharp["label"] == \
        heads.loc[heads["prev_token_mass"].idxmax(), "head_name"]
    html = (ci_run / "results/report/index.html").read_text()
    assert "Training dynamics" in html and "dynamics.png" in html
