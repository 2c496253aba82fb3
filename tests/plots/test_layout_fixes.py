"""Figures a reader found laid out wrong in the report (issue 46), drawn and saved as the
rules draw them, their layout read back from the drawn figure: the L1 random-token figure's
title clear of its panel titles, the training-dynamics legend above the first panels and its
counts never below 0, the K2 kernel heat map's keys outside the softmax masked grey."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

import posmech.plots as plots  # noqa: E402
from posmech.plots.check import read_check, title_overlaps  # noqa: E402


def _saving(monkeypatch, module) -> list:
    """Keep every figure ``module`` saves, with the renderer :func:`posmech.plots.save` drew
    it with (closing the figure takes its canvas away)."""
    saved = []

    def spy(fig, path, *a, **kw):
        canvas = fig.canvas
        plots.save(fig, path, *a, **kw)
        saved.append((fig, canvas.get_renderer()))

    monkeypatch.setattr(module, "save", spy)
    return saved


def _boxes_overlap(a, b) -> bool:
    return min(a.x1, b.x1) > max(a.x0, b.x0) and min(a.y1, b.y1) > max(a.y0, b.y0)


def test_a_figure_title_over_a_panel_title_is_caught():
    from posmech.plots.check import figure_problems

    fig, ax = plt.subplots(figsize=(3, 3))
    ax.plot([0, 1], [0, 1])
    ax.set(xlabel="x", ylabel="y", title="a panel title\non three\nlines")
    fig.suptitle("a figure title\non two lines", y=0.85)  # placed by hand over the panel's title
    fig.subplots_adjust(top=0.7)
    problems = figure_problems(fig)["problems"]
    assert any("figure's title overlaps 'a panel title' title" in p for p in problems), problems
    fig.suptitle("a figure title\non two lines", y=1.0, va="bottom")  # above it
    fig.draw_without_rendering()  # title_overlaps reads the figure as last drawn
    assert not title_overlaps(fig) and figure_problems(fig)["problems"] == []
    plt.close(fig)


def test_l1_random_token_title_clears_both_panel_titles(tmp_path, monkeypatch):
    """Two heat maps of fixed aspect under a two-line title, three-line panel titles: the
    constrained layout read the panel titles where they were before the aspect moved them,
    and the figure title printed over both (save draws such a figure once more)."""
    from posmech.plots import attn_only

    saved = _saving(monkeypatch, attn_only)
    T = 13
    M = np.tril(np.random.default_rng(0).random((T, T)))
    M /= M.sum(1, keepdims=True)
    masses = {"previous": {"previous": 0.982, "offset_2": 0.0, "offset_3": 0.012, "self": 0.005, "bos": 0.0},
              "look_back_two": {"previous": 0.264, "offset_2": 0.191, "offset_3": 0.119, "self": 0.2, "bos": 0.16}}
    attn_only.random_token_patterns({"previous": M, "look_back_two": M},
                                    {"previous": "L0H0", "look_back_two": "L0H3 (none: below threshold)"},
                                    masses, "demo-attn", 500, True, tmp_path / "l1.png")
    fig, renderer = saved[0]
    title = fig._suptitle.get_window_extent(renderer)
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert len(panels) == 2 and all(ax.get_title().count("\n") == 2 for ax in panels)
    for ax in panels:
        assert not _boxes_overlap(title, ax.title.get_window_extent(renderer)), ax.get_title()
        assert title.y0 >= ax.title.get_window_extent(renderer).y1 - 1
    assert title_overlaps(fig, renderer) == []
    assert read_check(tmp_path / "l1.png")["problems"] == []


def _dynamics_with_counts() -> pd.DataFrame:
    """The synthetic dynamics table and two counts per role (heads whose kernel is slow decay),
    one of them 0 at the first checkpoints: the axis must not run below 0 heads."""
    from tests.report.dynamics_data import REVISIONS, STEPS, synthetic_dynamics

    rows = []
    for model, counts in (("demo", [0, 1, 6, 6, 7]), ("demo-attn", [0, 2, 6, 6, 6])):
        for rev, step, n in zip(REVISIONS, STEPS, counts):
            rows.append({"model": model, "revision": rev, "step": step,
                         "checkpoint": model if rev == "final" else f"{model}@{rev}", "claim": "K3",
                         "quantity": "n_kernel_slow_decay", "value": float(n), "label": "",
                         "verdict": "holds" if n else "fails", "reason": ""})
    return pd.concat([synthetic_dynamics(), pd.DataFrame(rows)], ignore_index=True)


def test_dynamics_legend_is_above_the_first_panels_and_counts_start_at_zero(tmp_path, monkeypatch):
    from posmech.plots import dynamics

    saved = _saving(monkeypatch, dynamics)
    dynamics.dynamics_figure(_dynamics_with_counts(), tmp_path / "dynamics.png")
    fig, renderer = saved[0]
    assert len(fig.legends) == 1
    legend = fig.legends[0].get_window_extent(renderer)
    # the legend (titled with the figure's title) above every panel of the first row, their titles included
    top_row = max(ax.get_position().y1 for ax in fig.axes)
    first = [ax for ax in fig.axes if abs(ax.get_position().y1 - top_row) < 1e-6]
    assert first and all(legend.y0 >= ax.title.get_window_extent(renderer).y1 - 1 for ax in first)
    assert fig.legends[0].get_title().get_text().startswith("Training dynamics")
    # a count never below 0: its axis starts there; a point at 0 drawn whole (unclipped)
    count = [ax for ax in fig.axes if "heads: slow decay" in ax.get_title()]
    assert len(count) == 1
    lo, hi = count[0].get_ylim()
    assert lo >= 0 and hi >= 7
    assert all(t >= 0 for t in count[0].get_yticks() if lo <= t <= hi)
    assert not any(line.get_clip_on() for line in count[0].lines)
    # a quantity that is not a count keeps room below its values for the not-measurable marks
    knock = [ax for ax in fig.axes if "knock-out" in ax.get_title()][0]
    assert knock.get_ylim()[0] < 0.3
    assert read_check(tmp_path / "dynamics.png")["problems"] == []


def test_every_count_quantity_says_so():
    from posmech.verdicts.dynamics import quantity

    for name in ("n_previous_token_heads", "count(kernel_types)", "count(layer0_local_heads)", "n_kernel_local",
                 "n_l_role_previous"):
        assert quantity(name).count, name
    for name in ("largest_prev_token_mass", "previous_token_head_etc", "largest_prev_token_mass_layer"):
        assert not quantity(name).count, name


def test_k2_kernel_heatmap_masks_the_keys_before_the_first_key(tmp_path, monkeypatch):
    """Keys 0 .. k0 − 1 are outside the softmax (kernels.k0): masked grey like the keys after
    the query, not drawn in the colour of zero attention; a sliding window's keys too."""
    from posmech.plots import MASKED, kernels

    saved = _saving(monkeypatch, kernels)
    k0, n_max = 2, 12
    pos = np.arange(k0, n_max + 1)
    K = np.zeros((len(pos), n_max + 1))
    for r, n in enumerate(pos):
        K[r, k0: n + 1] = 1.0 / (n + 1 - k0)
    window = np.maximum(k0, pos - 4 + 1)  # a 4-key sliding window
    kernels.kernel_heatmaps({"L0H0": K, "L0H1": K}, pos, k0, n_max, "K2 m: kernels", tmp_path / "k2.png",
                            {"L0H0": "uniform", "L0H1": "uniform"}, {"L0H1": window})
    fig, _ = saved[0]
    panels = [ax for ax in fig.axes if ax.images]
    assert [ax.get_title() for ax in panels] == ["L0H0 (uniform)", "L0H1 (uniform)"]
    full, windowed = (np.ma.masked_invalid(np.ma.asarray(ax.images[0].get_array())) for ax in panels)
    assert full.mask[:, :k0].all()  # before k0: masked, every query
    assert (~full.mask[:, k0]).all()  # k0 itself drawn
    assert full.mask[0, k0 + 1:].all()  # after the first query
    for r, n in enumerate(pos):  # the window: keys before n - 3 masked
        assert windowed.mask[r, : window[r]].all() and not windowed.mask[r, window[r]: n + 1].any()
    cmap = panels[0].images[0].get_cmap()
    assert np.allclose(cmap(np.ma.masked_invalid([np.nan]))[0][:3], matplotlib.colors.to_rgb(MASKED))
    assert "before k0 = 2" in fig._suptitle.get_text() and "masked" in fig._suptitle.get_text()
    assert read_check(tmp_path / "k2.png")["problems"] == []
