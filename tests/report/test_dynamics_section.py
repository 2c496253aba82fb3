"""The training-dynamics figure and the report's "Training dynamics" section (issue 30), from a
synthetic dynamics.csv with known values (tests/report/dynamics_data.py)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from posmech.core.errors import PosmechError
from posmech.plots.check import read_check
from posmech.plots.dynamics import draw_dynamics, dynamics_figure, step_ticks
from posmech.report import html as rp
from posmech.report.dynamics_section import dynamics_html, pivot
from posmech.verdicts.dynamics import check_table
from posmech.store.tables import write_table
from tests.report.dynamics_data import synthetic_dynamics
from tests.report.test_html import fabricated_run  # noqa: F401 (the fixture)

QUANTITIES = ["largest_prev_token_mass", "largest_prev_token_mass_layer", "previous_token_head_etc",
              "prev_token_mass_ratio_knocked", "previous_token_head_kernel_type"]


def _panel(fig, words: str):
    hits = [ax for ax in fig.axes if words in ax.get_title()]
    assert len(hits) == 1, [ax.get_title() for ax in fig.axes]
    return hits[0]


def _markers(ax, marker: str) -> list:
    return [ln for ln in ax.lines if ln.get_marker() == marker and len(ln.get_xdata()) == 1]


def test_figure_has_a_symlog_panel_per_quantity_and_marks_every_verdict():
    import matplotlib.pyplot as plt

    fig = draw_dynamics(synthetic_dynamics())
    try:
        # four numeric quantities and the kernel type's strip panel; the sixth grid cell removed
        assert len(fig.axes) == len(QUANTITIES) == 5
        assert all(ax.get_xscale() == "symlog" for ax in fig.axes)
        score = _panel(fig, "largest previous-token mass")
        # step 0 is on the axis and left of step 50 (a log axis would drop it)
        assert score.get_xlim()[0] < 0 < 50 < score.get_xlim()[1]
        # a line per model through its 5 checkpoints; fails drawn open: demo 0.08, 0.12 and demo-attn 0.07, 0.31
        assert sum(len(ln.get_xdata()) == 5 for ln in score.lines) == 2
        circles = _markers(score, "o")
        assert len(circles) == 10
        open_ = sorted(round(float(ln.get_ydata()[0]), 2) for ln in circles if ln.get_markerfacecolor() == "white")
        assert open_ == [0.07, 0.08, 0.12, 0.31]
        # P5: not measurable at demo's steps 0 and 50 and at every demo-attn checkpoint: 7 crosses,
        # drawn at the bottom of the axes (no value), each in its model's colour
        p5 = _panel(fig, "knock-out")
        crosses = _markers(p5, "x")
        assert len(crosses) == 7 and not _markers(score, "x")
        assert {ln.get_transform() == p5.get_xaxis_transform() for ln in crosses} == {True}
        assert len({tuple(ln.get_color()) for ln in crosses}) == 2
        # the kernel type: one row per type, ordered local → uniform
        strip = _panel(fig, "kernel type")
        assert [t.get_text() for t in strip.get_yticklabels()] == ["local", "slow decay", "uniform"]
        # one legend: the models and the three marks
        assert len(fig.legends) == 1
        assert [t.get_text() for t in fig.legends[0].get_texts()][:2] == ["demo", "demo-attn"]
    finally:
        plt.close(fig)


def test_saved_figure_passes_the_figure_check(tmp_path):
    dynamics_figure(synthetic_dynamics(), tmp_path / "dynamics.png")
    check = read_check(tmp_path / "dynamics.png")
    assert check["problems"] == [] and check["min_font_pt"] >= 8


def test_step_ticks_stay_readable():
    assert step_ticks(np.array([0, 50, 100, 200, 300, 500, 1000, 2000.0])) == (
        50.0, [0.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0])
    pythia = np.array([0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000, 10000, 143000.0])
    thresh, ticks = step_ticks(pythia)  # five decades: powers of ten only
    assert thresh == 1.0 and ticks == [0.0, 1.0, 10.0, 100.0, 1e3, 1e4, 1e5]


def test_revisions_without_steps_are_drawn_in_order():
    import matplotlib.pyplot as plt

    t = synthetic_dynamics()
    t = t[t.model == "demo"].assign(step=np.nan, revision=lambda d: d["revision"].str.replace("step", "rev-"))
    fig = draw_dynamics(t)
    try:
        ax = fig.axes[0]
        assert ax.get_xscale() == "linear" and ax.get_xlabel() == "revision"
        assert [x.get_text() for x in ax.get_xticklabels()] == ["rev-0", "rev-50", "rev-200", "rev-500", "final"]
    finally:
        plt.close(fig)


def _cells(html: str, model: str, quantity: str) -> list[str]:
    row = re.search(rf'<tr data-model="{model}" data-quantity="{quantity}">(.*?)</tr>', html).group(1)
    return [re.sub(r"<span.*?</span>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row)][1:]  # after claim


def test_section_after_the_demo_models_with_values_and_verdicts(fabricated_run):
    kwargs = {k: v for k, v in fabricated_run.items() if k not in ("dir", "counts")}
    write_table(synthetic_dynamics(), "results/report/dynamics.csv")
    dynamics_figure(synthetic_dynamics(), "results/report/dynamics.png")
    rp.build(**kwargs, dynamics="results/report/dynamics.csv", dynamics_figure="results/report/dynamics.png")
    html = Path("results/report/index.html").read_text(encoding="utf-8")
    assert html.index('id="demo"') < html.index('<section id="dynamics">') < html.index('id="family-P"')
    assert '<a href="#dynamics">Training dynamics</a>' in html
    # visible without opening anything: per model, where the followed heads go and when they form
    headline = html[html.index('<ul class="dyn-headline">'):html.index('<details class="dyn-body">')]
    assert "<strong>demo</strong>: largest previous-token mass 0.08 → 0.93, half of it first at step 200" in headline
    # the figure and the table are copied next to the report and linked
    assert '<img src="figures/report/dynamics.png"' in html and Path("results/report/figures/report/dynamics.png").is_file()
    assert 'href="figures/report/dynamics.csv"' in html and Path("results/report/figures/report/dynamics.csv").is_file()
    section = html[html.index('<section id="dynamics">'):]
    section = section[:section.index("</section>")]
    heads = re.findall(r"<th[^>]*>([^<]*)</th>", section[:section.index("</thead>")])
    assert heads == ["model", "claim", "quantity", "0", "50", "200", "500", "2000 (final)"]
    assert _cells(section, "demo", "largest_prev_token_mass") == ["0.08 ✗", "0.12 ✗", "0.55 ✓", "0.88 ✓", "0.93 ✓"]
    assert _cells(section, "demo-attn", "largest_prev_token_mass")[1] == "0.31 ✗"
    assert _cells(section, "demo", "prev_token_mass_ratio_knocked") == ["n/m", "n/m", "0.7 ✗", "0.4 ✓", "0.3 ✓"]
    assert _cells(section, "demo-attn", "prev_token_mass_ratio_knocked") == ["n/m"] * 5
    assert _cells(section, "demo-attn", "previous_token_head_kernel_type") == [
        "uniform ✓", "slow_decay ✓", "local ✓", "local ✓", "local ✓"]
    # the head behind a value and the reason are in the cell
    assert '<span class="lab">L1H1</span>' in section and "score 0.12 vs 0.5" in section
    assert section.count("<tr data-model=") == 2 * 5
    assert "demo (5 checkpoints), demo-attn (5 checkpoints)" in section
    # every followed quantity is said in words
    qlist = section[section.index('<ul class="dyn-q">'):]
    assert qlist[:qlist.index("</ul>")].count("<li><strong>") == 5 and "<code>prev_token_mass_ratio_knocked</code>): the sharpest" in section


def test_the_sweeps_checkpoints_are_not_named_among_the_runs_models(fabricated_run):
    """The config the report reads lists the checkpoints (`<model>@<revision>`, added by the
    workflow); only the Run section's config shows them: the models named above it (the
    banner, the head roles) are the run's models, of which a checkpoint is a point."""
    kwargs = {k: v for k, v in fabricated_run.items() if k not in ("dir", "counts")}
    models = {"demo": {}, "demo@step50": {"checkpoint_of": "demo", "step": 50}}  # none of the posts' models
    rp.build(**{**kwargs, "config": {**kwargs["config"], "models": models}})
    html = Path("results/report/index.html").read_text(encoding="utf-8")
    assert "None of this run's models (demo)" in html
    before_run = html[:html.index('id="run"')]  # the Run section shows the config as the run resolved it
    assert "demo@step50" not in before_run and "demo@step50" in html[html.index('id="run"'):]


def test_counts_per_role_are_said_in_words():
    from posmech.verdicts.dynamics import quantity

    assert quantity("n_kernel_slow_decay").words == "the number of heads whose positional kernel is of type slow decay " \
        "(the head-roles table's column)"
    assert quantity("n_l_role_induction").title == "heads: induction"


def test_no_section_without_the_table(fabricated_run):
    html = Path("results/report/index.html").read_text(encoding="utf-8")
    assert 'id="dynamics"' not in html and "Training dynamics" not in html


def test_pivot_leaves_a_checkpoint_a_model_lacks_empty_and_rejects_repeats():
    t = synthetic_dynamics()
    t = check_table(t[~((t.model == "demo-attn") & (t.revision == "step50"))])
    columns, rows = pivot(t)
    assert columns == ["0", "50", "200", "500", "2000 (final)"]
    attn = next(r for r in rows if r["model"] == "demo-attn" and r["quantity"] == "previous_token_head_etc")
    assert "50" not in attn["cells"] and attn["cells"]["0"]["text"] == "30 ✓"
    assert '<td class="none" title="no run at this checkpoint"></td>' in str(dynamics_html(t, None, None))
    with pytest.raises(PosmechError, match="share model 'demo'"):
        pivot(pd.concat([t, t.iloc[:1]]))


def test_a_table_without_its_columns_or_with_unknown_verdicts_is_refused():
    with pytest.raises(PosmechError, match=r"no column\(s\) \['label'"):
        check_table(synthetic_dynamics().drop(columns=["label"]))
    with pytest.raises(PosmechError, match="verdict"):
        check_table(synthetic_dynamics().assign(verdict="pass"))
