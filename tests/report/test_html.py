"""The HTML report from fabricated inputs, and the headless-Chromium page checker."""

from __future__ import annotations

import json
import re
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from markupsafe import escape

from posmech.plots import save
from posmech.report import html as rp
from posmech.verdicts import scorecard as sc
from posmech.report.browser import check_page
from posmech.store.tables import read_table, scorecard_rows, write_table
from tests.conftest import require_system

REPO = Path(__file__).resolve().parents[2]


def _figure(path: str, title: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([0, 1, 2], [1, 0, 2])
    ax.set_title(title)
    save(fig, path)


def _scorecard(model: str, rule: str, rows: list[dict]) -> str:
    path = f"results/{model}/scorecard/{rule}.csv"
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_table(scorecard_rows([{**r, "model": model} for r in rows]), path)
    return path


def _head_roles() -> list[str]:
    """The head-roles tables (rule head_table) of the two models, from per-analysis tables with
    known roles: gpt2 (2 x 2 heads here) has two previous-token heads, L1H1 the sharp one, and a
    local and a uniform kernel in layer 0, and a slowly decaying kernel in L1H0 that its
    zero-score kernel already has (as an ALiBi bias gives; no role); demo's taxonomy finds no
    previous-token head (its sharp head is the fallback's: no role) and its kernels did not run."""
    from posmech.analyses.taxonomy import SHARP_FALLBACK_RULE
    from posmech.verdicts.heads import head_table

    names = ["L0H0", "L0H1", "L1H0", "L1H1"]
    taxonomy = {
        "gpt2": pd.DataFrame({"head_name": names, "is_previous_token": [False, False, True, True],
                              "prev_token_mass": [0.05, 0.1, 0.45, 0.91], "prev_token_excess": [-0.05, 0.0, 0.35, 0.81],
                              "ratio": [0.9, 0.8, 0.4, 0.01], "rank": [None, None, 2, 1]}),
        "demo": pd.DataFrame({"head_name": names, "is_previous_token": False, "prev_token_mass": [0.2, 0.1, 0.3, 0.25],
                              "prev_token_excess": 0.0, "ratio": 0.9, "rank": None}),
    }
    chosen = {"gpt2": pd.DataFrame({"role": ["sharp", "early"], "head_name": ["L1H1", "L1H0"], "rule": "rank"}),
              "demo": pd.DataFrame({"role": ["sharp"], "head_name": ["L1H0"], "rule": [SHARP_FALLBACK_RULE]})}
    etc = pd.DataFrame({"head_name": names, "n": 30, "etc_mean": [2.0, 29.0, 15.0, 12.0],
                        "etc_fraction": [0.07, 0.97, 0.5, 0.41], "kernel_type": ["local", "uniform", "slow_decay",
                                                                                   "slow_decay"],
                        "zero_score_kernel_type": ["uniform", "uniform", "slow_decay", "uniform"]})
    paths = []
    for m in ("gpt2", "demo"):
        path = f"results/{m}/heads.csv"
        write_table(head_table(m, taxonomy=taxonomy[m], chosen=chosen[m], etc=etc if m == "gpt2" else None, n=30),
                    path)
        paths.append(path)
    return paths


@pytest.fixture
def fabricated_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """A working directory shaped like a run of two models (gpt2 and a trained demo)."""
    monkeypatch.chdir(tmp_path)
    _figure("results/gpt2/taxonomy/diagonals.png", "P6 diagonals")
    _figure("results/demo/taxonomy/diagonals.png", "P6 diagonals demo")
    _figure("results/demo/training/curve.png", "training")
    _figure("results/gpt2/kernels/etc.png", "K4 ETC")
    table = "results/gpt2/kernels/etc.csv"
    write_table(pd.DataFrame({"claim": "K4", "model": "gpt2", "head": ["L0H3", "L0H5"], "etc": [1.5, 900.0]}),
                table, {"position": 1000})
    caption = tmp_path / "captions" / "diagonals.rst"
    caption.parent.mkdir()
    caption.write_text("**P6**: mean attention per diagonal offset of ``{{ snakemake.wildcards.model }}`` "
                       "over {{ snakemake.config['taxonomy']['n_prompts'] }} prompts.\n")
    etc_caption = tmp_path / "captions" / "etc.rst"
    etc_caption.write_text("Effective token count per head (K4).\n")
    scorecards = [
        _scorecard("gpt2", "diagonal_taxonomy", [
            {"claim": "P6", "quantity": "n_prev_token_heads_post", "value": 67,
             "artifact": "results/gpt2/taxonomy/diagonals.png"},
            {"claim": "P7", "quantity": "sharpest_prev_token_head_post", "value": ["L5H6"]},
        ]),
        _scorecard("gpt2", "etc_table", [
            {"claim": "K4", "quantity": "layer0_local_heads", "value": ["L0H3", "L0H4", "L0H7"],
             "artifact": table},
            {"claim": "K1", "quantity": "positional_kernels", "value": 144, "detail": "kernels of 144 heads",
             "artifact": "results/gpt2/kernels/etc.png"},
        ]),
        _scorecard("demo", "diagonal_taxonomy", [
            {"claim": "P6", "quantity": "n_prev_token_heads_post", "value": 3,
             "artifact": "results/demo/taxonomy/diagonals.png"},
        ]),
    ]
    summary = "results/demo/training/summary.json"
    Path(summary).write_text(json.dumps({
        "model": "demo", "heldout_loss": 1.34, "heldout_loss_unit": "nats per token (character)",
        "train_seconds": 12.0, "previous_token_scores": [[0.1, 0.2], [0.93, 0.3]],
        "best_previous_token_head": "L1H0", "best_previous_token_score": 0.93,
        "best_induction_head": "L1H1", "best_induction_score": 0.8, "induction_score_with_read_head_ablated": 0.1,
        "induction_reads_head": "L0H1", "p_correct_repeated": 0.9, "p_correct_first_copy": 0.01,
        "best_look_back_two_head": "L0H0", "best_look_back_two_score": 0.2,
    }))
    manifests = []
    for m in ("gpt2", "demo"):
        p = f"resources/models/{m}/manifest.json"
        Path(p).parent.mkdir(parents=True)
        Path(p).write_text(json.dumps({"name": m, "kind": "hub", "source": m, "revision": "main",
                                       "resolved_revision": "abc123", "weights_sha256_16": "f00d"}))
        manifests.append(p)
    heads = _head_roles()
    Path("benchmarks/diagonal_taxonomy").mkdir(parents=True)
    Path("benchmarks/diagonal_taxonomy/gpt2.tsv").write_text(
        "s\th:m:s\tmax_rss\tmax_vms\n12.5\t0:00:12\t812.3\t900\n")
    flags = {
        "results/gpt2/taxonomy/diagonals.png": {"rule": "diagonal_taxonomy", "wildcards": {"model": "gpt2"},
                                                "caption": str(caption), "category": "P: previous-token heads"},
        "results/demo/taxonomy/diagonals.png": {"rule": "diagonal_taxonomy", "wildcards": {"model": "demo"},
                                                "caption": str(caption), "category": "P: previous-token heads"},
        "results/gpt2/kernels/etc.png": {"rule": "etc_heatmap", "wildcards": {"model": "gpt2"},
                                         "caption": str(etc_caption), "category": "K: kernels"},
        table: {"rule": "etc_table", "wildcards": {"model": "gpt2"}, "caption": str(etc_caption),
                "category": "K: kernels"},
    }
    kwargs = dict(
        html="results/report/index.html", figures_dir="results/report/figures",
        scorecard_csv="results/report/scorecard.csv", published=str(REPO / "resources" / "published.yaml"),
        scorecards=scorecards,
        figures=["results/gpt2/taxonomy/diagonals.png", "results/demo/taxonomy/diagonals.png",
                 "results/gpt2/kernels/etc.png", "results/demo/training/curve.png"],
        tables=[table], summaries=[summary], manifests=manifests, tokens=[], flags=flags,
        config={"models": {"gpt2": {}, "demo": {}}, "taxonomy": {"n_prompts": 37}}, benchmarks="benchmarks",
        claims=str(REPO / "docs" / "claims.md"), heads=heads,
    )
    counts = rp.build(**kwargs)
    return {"dir": tmp_path, "counts": counts, **kwargs}


def _row(card: pd.DataFrame, claim: str, quantity: str, model: str) -> pd.Series:
    sel = card[(card.claim == claim) & (card.quantity == quantity) & (card.model == model)]
    assert len(sel) == 1
    return sel.iloc[0]


def test_scorecard_of_fabricated_run(fabricated_run):
    card = read_table("results/report/scorecard.csv")
    assert _row(card, "P6", "n_prev_token_heads_post", "gpt2").status == "pass"  # |67 - 69| <= 5
    assert _row(card, "P7", "sharpest_prev_token_head_post", "gpt2").status == "fail"  # L5H6, not L4H11
    assert _row(card, "P7", "diagonal_ratio_post", "gpt2").status == "missing"  # claim covered, no value
    assert _row(card, "P6", "n_prev_token_heads_post", "demo").status == "other model"
    assert _row(card, "K4", "layer0_local_heads", "gpt2").status == "pass"
    # etc_table is registered for gpt2 and the published K5 entry names it: expected -> missing
    assert _row(card, "K5", "kernel_consistency", "gpt2").status == "missing"
    assert _row(card, "K1", "positional_kernels", "gpt2").status == "qualitative"
    assert _row(card, "K3", "kernel_types", "gpt2").status == "missing"  # qualitative or not: no row
    assert fabricated_run["counts"]["pass"] == 2
    assert not ((card.status == "pass") & (card.reproduced == "—")).any()


def test_scorecard_csv_columns_keep_their_types_in_plain_pandas(fabricated_run):
    """A researcher's ``pandas.read_csv``: the seed post stays text, the values have one typed
    column per kind (a number, or JSON for head sets and mappings), integers stay integers."""
    plain = pd.read_csv("results/report/scorecard.csv")
    assert set(plain["source"].dropna()) <= {"post 000", "post 001", "post 003", "post 004"}
    assert "post 000" in set(plain["source"])
    p6 = _row(plain, "P6", "n_prev_token_heads_post", "gpt2")
    assert p6.reproduced_number == 67 and json.loads(p6.reproduced_json) == 67 and p6.published_number == 69
    k4 = _row(plain, "K4", "layer0_local_heads", "gpt2")
    assert pd.isna(k4.reproduced_number) and json.loads(k4.reproduced_json) == ["L0H3", "L0H4", "L0H7"]
    assert plain["reproduced_number"].dtype == float and plain["published_number"].dtype == float
    missing = _row(plain, "P7", "diagonal_ratio_post", "gpt2")
    assert pd.isna(missing.reproduced_json) and pd.isna(missing.reproduced_number)
    documented = Path(REPO / "docs" / "artifacts.md").read_text()
    section = documented[documented.index("- `scorecard.csv`"):]
    for column in plain.columns:
        assert f"`{column}`" in section, f"scorecard.csv column {column!r} is not documented in docs/artifacts.md"


def test_html_has_scorecard_first_captions_and_run(fabricated_run):
    html = Path("results/report/index.html").read_text()
    assert html.index('id="scorecard"') < html.index('id="demo"') < html.index('id="family-P"') < html.index('id="run"')
    # the plain statement about which models the published values refer to
    assert "belong to the model each was measured on" in html and "gpt2" in html
    # judged rows (gpt2) first; the demo's rows compactly, with what it does
    judged = html[html.index('id="scorecard-judged"'):html.index('id="scorecard-compact"')]
    compact = html[html.index('id="scorecard-compact"'):html.index('id="demo"')]
    assert "<td>gpt2</td>" in judged and "<td>demo</td>" not in judged
    assert "<td>demo</td>" in compact and "<code>n_prev_token_heads_post</code> = 3" in compact
    # every row says its status: the demo's P6 row is other model (gpt2's value), in one chip
    demo_p6 = compact[compact.index('<td><a href="#claim-P6">P6</a></td><td>demo</td>') - 40:][:400]
    assert 'data-status="other-model"' in demo_p6 and '<span class="status s-other-model">' in demo_p6
    # a legend explains every status, and the chips count the rows per status
    legend = html[html.index('id="status-legend"'):html.index("</dl>", html.index('id="status-legend"'))]
    for status in sc.STATUSES:
        assert f'data-status="{status.replace(" ", "-")}"' in legend and str(escape(sc.STATUS_MEANINGS[status])) in legend
    assert f'data-status="pass" aria-pressed="false">pass: {fabricated_run["counts"]["pass"]}<' in html
    # the families, the run and the claims catalogue are folded; figures are thumbnails that enlarge
    assert re.search(r'<details class="fold family" id="fold-family-P"><summary><h2 id="family-P">', html)
    assert '<details class="fold" id="fold-run"><summary><h2 id="run">' in html
    assert '<a href="figures/gpt2/kernels/etc.png" class="enlarge"><img src="figures/gpt2/kernels/etc.png"' in html
    # claim IDs link to the claims catalogue rendered at the end, which links to the posts
    assert 'href="#claim-P6"' in html and '<tr id="claim-P6">' in html
    assert html.index('id="run"') < html.index('id="claims"')
    assert "https://www.lesswrong.com/posts/zRA8B2FJLtTYRgie6/" in html
    # caption rendered from rst with wildcards and config (like Snakemake's report)
    assert "over 37 prompts" in html and "<strong>P6</strong>" in html
    # the demo model's curve and the previous-token head it found
    assert re.search(r'id="demo-demo-prev-head">L1H0<', html)
    assert 'src="figures/demo/training/curve.png"' in html
    # scorecard links go to the figure in the report; the table is shown and linked
    assert 'href="#figure-results-gpt2-taxonomy-diagonals-png"' in html
    assert 'href="figures/gpt2/kernels/etc.csv"' in html and "L0H5" in html
    assert Path("results/report/figures/gpt2/kernels/etc.meta.json").is_file()  # the table's metadata travels with it
    # the table shares its caption with the K4 figure: the caption is printed once, the table points to it
    assert html.count("Effective token count per head (K4).") == 1
    assert 'The table behind <a href="#figure-results-gpt2-kernels-etc-png">the figure above</a>' in html
    # run section: wall time from the benchmark file, model revisions, versions
    assert "diagonal_taxonomy" in html and "12.5" in html and "abc123" in html and "transformer_lens" in html
    for f in fabricated_run["figures"] + fabricated_run["tables"]:
        assert (Path("results/report/figures") / Path(f).relative_to("results")).is_file()
    # K figures sit in the K section, P figures in the P section
    k_sec = html[html.index('id="family-K"'):html.index('id="family-C"')]
    assert "etc.png" in k_sec and "diagonals.png" not in k_sec


def test_every_thumbnail_names_its_model_and_twins_are_marked(fabricated_run):
    """The same figure of a model, its random-init twin and a checkpoint look alike at thumbnail
    size: every thumbnail's label (and its image's alt text) names the model of its
    results/{model}/ path, a twin's carries a "random-init twin of <model>" badge and a dashed
    frame, a checkpoint's says which; a twin follows its model; a table's fold names its model."""
    kwargs = {k: v for k, v in fabricated_run.items() if k not in ("dir", "counts")}
    extra = {"results/demo-twin/taxonomy/diagonals.png": "demo-twin",
             "results/pythia-3k/taxonomy/diagonals.png": "pythia-3k",
             "results/demo@step300/taxonomy/diagonals.png": "demo@step300"}
    flags = dict(kwargs["flags"])
    for path, model in extra.items():
        _figure(path, f"P6 diagonals {model}")
        flags[path] = {**flags["results/demo/taxonomy/diagonals.png"], "wildcards": {"model": model}}
    models = {"gpt2": {}, "demo": {"train": {}}, "pythia-3k": {"source": "EleutherAI/pythia-70m", "revision": "step3000"},
              "demo@step300": {"checkpoint_of": "demo", "step": 300, "train": {}},
              "demo-twin": {"twin_of": "demo", "seed": 0}}
    rp.build(**{**kwargs, "figures": [*kwargs["figures"], *extra], "flags": flags,
                "config": {**kwargs["config"], "models": models}})
    html = Path("results/report/index.html").read_text()
    families = html[html.index('id="fold-family-P"'):html.index('id="fold-run"')]
    thumbs = re.findall(r'<figure id="figure-[^"]*"( class="twin")? data-model="([^"]*)">\s*<a href="([^"]*)" '
                        r'class="enlarge"><img src="[^"]*" alt="([^"]*)"></a>\s*<figcaption><p class="short '
                        r'model-label">(.*?)<br>', families)
    assert len(thumbs) == 6, thumbs  # 5 diagonals (gpt2, demo, its twin, a revision, a checkpoint) + gpt2's etc
    for twin, model, href, alt, label in thumbs:
        assert href.split("/")[1] == model, (href, model)  # figures/<model>/…: the model of its path
        assert f'<span class="model-name">{escape(model)}</span>' in label and model in alt
        assert bool(twin) == (model == "demo-twin") == ("random-init twin of demo" in label)
    labels = {model: label for _, model, _, _, label in thumbs}
    assert '<span class="badge twin">random-init twin of demo</span>' in labels["demo-twin"]
    assert "(random-init twin of demo)" in html and "badge twin" not in labels["demo"]
    assert '<span class="badge ckpt">revision step3000</span>' in labels["pythia-3k"]
    assert '<span class="badge ckpt">step 300 of demo</span>' in labels["demo@step300"]
    assert "badge" not in labels["gpt2"]
    # the same figure of every model together, in the config's order, each twin right after its model
    order = [model for _, model, href, _, _ in thumbs if href.endswith("diagonals.png")]
    assert order == ["gpt2", "demo", "demo-twin", "pythia-3k", "demo@step300"]
    # a table's fold names its model too
    assert re.search(r'table <code>etc.csv</code> of <span class="model-name">gpt2</span>', html)


def test_report_opens_cleanly_in_chromium_from_a_copied_folder(fabricated_run, tmp_path_factory):
    require_system("chromium")
    import shutil

    copy = tmp_path_factory.mktemp("copied") / "report"
    shutil.copytree("results/report", copy)
    shutil.rmtree("results")  # the copy must not depend on the run's results/
    res = check_page(copy / "index.html", copy / "screenshot.png")
    assert res.ok, (res.console_errors, res.broken_images, res.broken_links)
    assert res.n_images == 4 and res.n_links >= 5
    assert (copy / "screenshot.png").stat().st_size > 10_000 and (copy / "screenshot-unfolded.png").is_file()
    # at a glance: the unopened page is short, opening everything makes it much longer
    assert res.height_unopened < 4 * 900 and res.height_unfolded > res.height_unopened + 1000
    assert res.legend == [s.replace(" ", "-") for s in sc.STATUSES]
    assert res.scorecard_rows >= 3 and res.rows_without_status == []
    # each chip shows exactly the rows with its status
    assert res.status_filter and all(shown == want and ok for shown, want, ok in res.status_filter.values()), \
        res.status_filter
    # at 1280 px nothing is wider than its column and the scorecard does not scroll sideways
    assert res.size[0] <= 1280 and not res.page_scrolls_sideways
    assert res.wide_elements == [] and res.scrolling_elements == []


def test_page_checker_finds_broken_images_links_and_console_errors(tmp_path):
    require_system("chromium")
    _figure(str(tmp_path / "ok.png"), "ok")
    page = tmp_path / "bad.html"
    page.write_text(
        '<!DOCTYPE html><html><head><title>bad</title><link rel="icon" href="data:,"></head><body>'
        '<img src="ok.png"><img src="nope.png"><a href="#here" id="here">ok</a>'
        '<a href="#nowhere">bad anchor</a><a href="missing.csv">bad file</a><a href="ok.png">ok file</a>'
        '<script>console.error("boom")</script></body></html>'
    )
    res = check_page(page)
    assert res.wide_elements == [] and not res.page_scrolls_sideways
    assert res.broken_images == ["nope.png"]
    assert sorted(b.split(":")[0] for b in res.broken_links) == ["#nowhere", "missing.csv"]
    assert any("boom" in e for e in res.console_errors)
    assert not res.ok


def test_page_checker_measures_layout_at_1280_px(tmp_path):
    """A too-wide image, a table scrolling in its box and a page scrolling sideways are
    all reported; an image narrower than its column is shown at its natural width."""
    require_system("chromium")
    fig, ax = plt.subplots(figsize=(20, 2))  # 3000 px at 150 dpi
    ax.plot([0, 1])
    save(fig, tmp_path / "wide.png")
    _figure(str(tmp_path / "small.png"), "small")
    cells = "".join(f"<td>{'x' * 40}</td>" for _ in range(60))
    page = tmp_path / "wide.html"
    page.write_text(
        '<!DOCTYPE html><html><head><title>w</title><link rel="icon" href="data:,"><style>'
        "main { max-width: 1000px; padding: 0 20px; } .box { overflow-x: auto; }</style></head><body><main>"
        '<img src="small.png"><img src="wide.png" id="wide">'
        f'<div class="box" id="box"><table id="t"><tr>{cells}</tr></table></div>'
        '<div style="width: 3000px">too wide</div></main></body></html>'
    )
    res = check_page(page)
    assert any(w.startswith("img#wide") for w in res.wide_elements), res.wide_elements
    assert not any("small.png" in w for w in res.wide_elements)
    assert "div#box" in res.scrolling_elements and res.page_scrolls_sideways
    shown = {src: (nat, w) for src, nat, w in res.image_widths}
    assert shown["small.png"][0] == shown["small.png"][1] > 0


def test_findings_grid_leads_the_report(fabricated_run):
    """With rule findings' table the report opens with the grid: before the scorecard, one cell
    per claim and model coloured by verdict, the reason in its title."""
    from posmech.core.config import load_schema
    from posmech.verdicts import findings as fd
    from posmech.store.tables import write_table

    kwargs = {k: v for k, v in fabricated_run.items() if k not in ("dir", "counts")}
    found = fd.load_findings(REPO / "resources" / "findings.yaml")
    # the schema with the thresholds the analyses declare of their own (P17, P18's, the S claims')
    schema = load_schema(REPO / "workflow" / "schemas" / "config.schema.yaml")
    thr = {k: v["default"] for k, v in schema["properties"]["findings"]["properties"].items()}
    table = fd.findings_table(found, thr, kwargs["scorecards"], ["gpt2", "demo"])
    write_table(table, "results/report/findings.csv")
    rp.build(**kwargs, findings="results/report/findings.csv")
    html = Path("results/report/index.html").read_text(encoding="utf-8")
    assert html.index('id="findings"') < html.index('id="scorecard"')
    assert html.count('<td class="v-') == len(found) * 2  # every finding (40) on both models
    # P6 on demo: diagonal_taxonomy ran, but this fabricated scorecard lacks the finding's quantity
    p6 = table[(table.claim == "P6") & (table.model == "demo")].iloc[0]
    assert p6.verdict == "not measurable" and "wrote no row 'prev_token_head_fraction'" in p6.reason
    assert "wrote no row &#x27;prev_token_head_fraction&#x27;" in html  # the reason is the cell's title


def test_head_roles_across_models_below_the_scorecard(fabricated_run):
    """The cross-model head-roles view: after the findings grid and the scorecard, before the
    demo section; per role the heads of each model that hold it, best first with their score;
    'none' where the analysis ran and no head passes, '—' where it did not run."""
    html = Path("results/report/index.html").read_text(encoding="utf-8")
    assert html.index('id="scorecard"') < html.index('id="head-roles"') < html.index('id="demo"')
    assert '<a href="#head-roles">Head roles</a>' in html
    view = html[html.index('<section id="head-roles">'):html.index("</section>", html.index('id="head-roles"'))]
    rows = {m.group(1): m.group(2) for m in re.finditer(r'<tr data-role="([^"]+)">(.*?)</tr>', view)}
    cells = {k: re.findall(r"<td[^>]*>(.*?)</td>", v) for k, v in rows.items()}
    text = {k: [re.sub(r"<[^>]+>", "", c) for c in v] for k, v in cells.items()}  # [gpt2, demo]
    # previous-token heads, best first (mass at offset -1 above the uniform baseline); demo has none
    assert text["previous_token=True"] == ["L1H1 0.81 L1H0 0.35", "none"]
    # the sharp head: the taxonomy's choice on gpt2; on demo its fallback head holds no role
    assert text["p7_chosen=sharp"] == ["L1H1 0.01", "none"]
    # kernel roles on gpt2 only; L1H0's slow decay is its zero-score kernel's (no role), and a
    # uniform kernel, what a random head has, is no role
    assert text["kernel_role=local"] == ["L0H0 0.07", "—"]
    assert text["kernel_role=slow_decay"] == ["L1H1 0.41", "—"]
    assert not any(k.startswith("kernel_type=") or k.endswith("=uniform") for k in rows)
    # roles no model's analysis assigns are left out
    assert "k7_class=contextual" not in rows and "l_role=induction" not in rows
    # the tables behind it are copied next to the report and linked
    assert 'href="figures/gpt2/heads.csv"' in html and Path("results/report/figures/demo/heads.csv").is_file()


def test_head_roles_view_counts_what_it_does_not_write_out():
    from posmech.report.head_roles import MAX_SHOWN, roles_html

    n = MAX_SHOWN + 3
    table = pd.DataFrame({"model": "m", "layer": 1, "head": range(n), "head_name": [f"L1H{h}" for h in range(n)],
                          "kernel_role": "slow_decay", "etc_fraction": [0.3 - h / 1000 for h in range(n)]})
    html = str(roles_html({"m": table}))
    cell = re.search(r'<tr data-role="kernel_role=slow_decay">.*?</tr>', html).group(0)
    assert cell.count("<code>") == MAX_SHOWN and "+3 more" in cell
    assert f"L1H{n - 1} 0.292" in cell  # every head in the hover, best first (smaller ETC / n_keys)
    assert "No model" in str(roles_html({}))


def test_the_demo_paragraph_names_each_previous_token_measure(fabricated_run):
    """The training summary's held-out previous-token score and the head-roles table's
    previous-token mass of the same head are two measures (issue 46, item 3): each under its name."""
    html = Path("results/report/index.html").read_text(encoding="utf-8")
    para = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", html[html.index('id="demo-demo"'):html.index("</p>", html.index(
        'id="demo-demo"'))]))
    assert ("L1H0 (held-out previous-token score 0.930; its previous-token mass on the analysis documents, as in the "
            "head roles: 0.300)") in para
    assert "mean attention to the previous position" not in para
    # the held-out look-back-two score has no threshold; demo's heads.csv has no L roles
    assert "Best held-out look-back-two score: L0H0 (0.200; no threshold)." in para


def _l_roles_table(offset2: list[float], roles: list[str]) -> pd.DataFrame:
    names = ["L0H0", "L0H1", "L0H2", "L0H3"]
    return pd.DataFrame({"model": "m", "layer": 0, "head": range(4), "head_name": names,
                         "prev_token_mass": [0.9, 0.2, 0.2, 0.3], "previous_token": [True, False, False, False],
                         "l_previous_mass": [0.98, 0.18, 0.18, 0.26], "l_offset2_mass": offset2,
                         "l_induction_score": [0.0, 0.0, 0.0, 0.0], "l_role": roles})


def test_a_best_head_below_threshold_is_shown_as_such():
    """A role decided by a threshold that no head passes: 'none', then its best candidate, marked
    below threshold (the head holding another role is no candidate); a role held shows its holder."""
    from posmech.report.head_roles import ROLES, best_candidate, roles_html

    table = _l_roles_table([0.5, 0.14, 0.16, 0.19], ["previous", "none", "none", "none"])
    html = str(roles_html({"m": table}))
    row = re.search(r'<tr data-role="l_role=look_back_two">.*?</tr>', html).group(0)
    cell = re.sub(r"<[^>]+>", "", re.findall(r"<td[^>]*>.*?</td>", row)[0])
    assert cell == "none (best L0H3 0.19, below threshold)"  # not L0H0 (0.5): it is the previous-token head
    assert "attn_only.role_min_score.look_back_two" in row
    role = next(r for r in ROLES if r.value == "look_back_two")
    assert best_candidate(table, role) == ("L0H3", 0.19)
    held = str(roles_html({"m": _l_roles_table([0.0, 0.14, 0.25, 0.19], ["previous", "none", "look_back_two", "none"])}))
    row = re.search(r'<tr data-role="l_role=look_back_two">.*?</tr>', held).group(0)
    assert "below threshold" not in row and "L0H2</code> 0.25" in row
    # the previous-token role (P6) has no score threshold: its 'none' names no head
    nobody = str(roles_html({"m": table.assign(previous_token=False)}))
    row = re.search(r'<tr data-role="previous_token=True">.*?</tr>', nobody).group(0)
    assert re.sub(r"<[^>]+>", "", re.findall(r"<td[^>]*>.*?</td>", row)[0]) == "none"


def test_the_demo_paragraph_marks_a_look_back_two_candidate_below_threshold(tmp_path):
    from posmech.report.html import demo_sections

    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"model": "m", "best_previous_token_head": "L0H0", "best_previous_token_score": 0.89,
                                   "best_look_back_two_head": "L0H3", "best_look_back_two_score": 0.218}))
    table = _l_roles_table([0.0, 0.14, 0.16, 0.19], ["previous", "none", "none", "none"])
    d = demo_sections([str(summary)], {}, {"m": table})[0]
    assert d["prev_mass"] == 0.9 and d["look_back"] == {"head": "L0H3", "score": 0.19, "below": True}
    d = demo_sections([str(summary)], {}, {"m": table.assign(l_role=["previous", "none", "none", "look_back_two"])})[0]
    assert d["look_back"] == {"head": "L0H3", "score": 0.19, "below": False}
    assert demo_sections([str(summary)], {})[0]["look_back"] is None  # no head-roles table


def test_a_shuffled_twin_is_badged_as_one():
    """A twin's badge names its null (config `twins.weights`): `random-init twin of m` by
    default, `shuffled twin of m` for a shuffled one; a model that is no twin has no badge."""
    from posmech.report.html import Asset, model_label, model_marks

    models = {"m": {"source": "/m"}, "m-twin": {"twin_of": "m", "seed": 0},
              "n-twin": {"twin_of": "n", "seed": 0, "twin_weights": "shuffled"}}
    assert model_marks("m-twin", models)["twin_kind"] == "random-init"
    marks = model_marks("n-twin", models)
    assert (marks["twin_of"], marks["twin_kind"]) == ("n", "shuffled")
    assert model_marks("m", models)["twin_of"] == ""
    a = Asset(source="results/n-twin/x.png", href="", anchor="", kind="figure", family="", title="", caption_html="")
    a.model, a.twin_of, a.twin_kind = "n-twin", "n", "shuffled"
    assert "shuffled twin of n</span>" in str(model_label(a))
