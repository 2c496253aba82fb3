"""The figure helpers that replaced seaborn (posmech.plots.heatmap, lines_by) on inputs with
known answers, and the figures that use them drawn without importing seaborn or
scipy.stats (each analysis job paid ~1.4 CPU s for seaborn's import, which pulls in
scipy.stats: docs/performance-log.md)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from posmech.plots import DEEP, category_colours, heatmap, lines_by, relative_luminance  # noqa: E402


def test_heatmap_cells_annotations_and_ticks():
    fig, ax = plt.subplots(figsize=(3, 3))
    data = pd.DataFrame([[0.0, 1.0, np.nan], [0.5, 0.25, 1.0]], index=[3, 4], columns=["a", "b", "c"])
    mesh = heatmap(ax, data, cmap="viridis", vmin=0, vmax=1, annot=data, fmt=".2f", cbar_label="v")
    fig.canvas.draw()
    # row 0 at the top, one unit per cell, the NaN cell undrawn (masked)
    assert ax.get_xlim() == (0, 3) and ax.get_ylim() == (2, 0)
    assert mesh.get_array().mask.tolist() == [[False, False, True], [False, False, False]]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b", "c"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["3", "4"]
    assert list(ax.get_xticks()) == [0.5, 1.5, 2.5]
    # five annotations (none on the NaN cell), at the cell centres, formatted
    texts = {(t.get_position(), t.get_text()): t.get_color() for t in ax.texts}
    assert set(texts) == {((0.5, 0.5), "0.00"), ((1.5, 0.5), "1.00"), ((0.5, 1.5), "0.50"), ((1.5, 1.5), "0.25"),
                          ((2.5, 1.5), "1.00")}
    # viridis: dark purple at 0 (white text), yellow at 1 (dark text)
    assert texts[((0.5, 0.5), "0.00")] == "w" and texts[((1.5, 0.5), "1.00")] == ".15"
    assert not any(s.get_visible() for s in ax.spines.values())
    cbar = [a for a in fig.axes if a is not ax][0]
    assert cbar.get_ylabel() == "v"
    plt.close(fig)


def test_heatmap_thins_tick_labels_that_would_not_fit():
    fig, ax = plt.subplots(figsize=(2, 2))
    heatmap(ax, np.zeros((40, 40)), cmap="viridis", vmin=0, vmax=1)
    shown = [t.get_text() for t in ax.get_yticklabels()]
    assert 1 < len(shown) < 40
    step = int(shown[1]) - int(shown[0])
    assert step > 1 and shown == [str(i) for i in range(0, 40, step)]
    plt.close(fig)


def test_relative_luminance_of_black_white_and_grey():
    assert relative_luminance("black") == 0.0 and relative_luminance("white") == pytest.approx(1.0)
    assert relative_luminance("0.5") == pytest.approx(0.2140, abs=1e-4)  # sRGB 0.5 is darker than half


def test_lines_by_one_line_per_level_sorted_nan_dropped():
    fig, ax = plt.subplots()
    df = pd.DataFrame({"x": [2, 1, 3, 1, 2, 3], "y": [20.0, 10.0, np.nan, 1.0, 2.0, 3.0],
                       "k": ["b", "b", "b", "a", "a", "a"]})
    lines_by(ax, df, "x", "y", "k", ["a", "b"], colours=list(DEEP))
    a, b = ax.lines
    assert a.get_label() == "a" and list(a.get_xdata()) == [1, 2, 3] and list(a.get_ydata()) == [1.0, 2.0, 3.0]
    assert b.get_label() == "b" and list(b.get_xdata()) == [1, 2] and list(b.get_ydata()) == [10.0, 20.0]
    assert matplotlib.colors.to_hex(a.get_color()) == DEEP[0].lower()
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["a", "b"]
    assert ax.get_legend().get_title().get_text() == "k" and ax.get_xlabel() == "x" and ax.get_ylabel() == "y"
    plt.close(fig)


def test_lines_by_refuses_to_average_silently():
    fig, ax = plt.subplots()
    df = pd.DataFrame({"x": [1, 1], "y": [1.0, 2.0], "k": ["a", "a"]})
    with pytest.raises(ValueError, match="several rows for k=a, x=1;"):
        lines_by(ax, df, "x", "y", "k")
    plt.close(fig)


def test_category_colours_stay_distinct_past_the_colour_cycle():
    for n in (3, 10, 13, 25):
        colours = [matplotlib.colors.to_hex(c) for c in category_colours(n)]
        assert len(set(colours)) == n


#: draws every figure that used seaborn, on small inputs, then reports the modules loaded
_DRAW = textwrap.dedent("""
    import sys, types
    import numpy as np, pandas as pd
    from posmech.plots import training_curve
    from posmech.plots import geometry as pg, interventions as piv, kernels as pk, taxonomy as ptax
    out = sys.argv[1]
    per = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "head_name": ["L0H0", "L0H1", "L1H0", "L1H1"],
                        "ratio": [np.nan, 0.5, 0.2, np.nan], "is_previous_token": [False, True, True, False],
                        "prev_token_mass": [0.1, 0.5, 0.9, 0.2], "head_detector_score": [0.1, 0.4, 0.8, 0.3],
                        "rank": [np.nan, 2, 1, np.nan]})
    chosen = pd.DataFrame({"head_name": ["L1H0"], "role": ["sharp"]})
    ptax.taxonomy_figure(per, chosen, {"n_previous_token_heads": 2, "n_documents": 3,
                                       "spearman_ratio_vs_head_detector": None}, "m", f"{out}/taxonomy.png")
    etc = per[["layer", "head"]].assign(etc_mean=[1.0, 2.0, 5.0, 9.0], n_keys=10,
                                        kernel_type=["local", "slow_decay", "uniform", "undefined"])
    pk.etc_heatmap({"m": etc}, {"m": 9}, f"{out}/etc.png")
    rep = pd.DataFrame({"query_set": ["other", "other", "repeat"], "prev_mass": [0.2, 0.4, 0.9]})
    zoom = types.SimpleNamespace(head="L1H0", matrices={"intact": np.tril(np.ones((6, 6))) / 6}, start=2,
                                 marks=np.arange(6) % 2 == 0)
    piv.repeated_tokens(rep, zoom, "m", f"{out}/repeated.png")
    bars = pd.DataFrame({"condition": ["baseline", "baseline", "redirect", "redirect", "scale", "scale",
                                       "redirect_scale", "redirect_scale"], "target": ["a", "b"] * 4,
                         "probability": [0.5, 0.1, 0.2, 0.6, 0.7, 0.05, 0.1, 0.8]})
    pats = {c: np.tril(np.ones((5, 5))) / 5 for c in ("baseline", "redirect")}
    piv.induction_bars(bars, pats, (0, 5), list("abcde"), "m", "L1H0", 2.0, f"{out}/induction.png")
    angles = pd.DataFrame({"layer": [0, 0, 1, 1], "angle_index": [1, 2, 1, 2], "angle_deg": [1.0, 2.0, 40.0, 60.0],
                           "defined": True})
    pg.angles(angles, "angles", f"{out}/angles.png")
    pca = pd.DataFrame({"layer": [-1, -1, 0, 0, 1, 1], "component": [1, 2] * 3,
                        "explained_variance_ratio": [0.6, 0.3, 0.6, 0.3, 0.8, 0.1]})
    pg.explained_variance(pca, "explained", f"{out}/explained.png")
    pg.agreement(pd.DataFrame({"layer": [0, 1], "mean_cosine_to_average": [1.0, 0.9],
                               "mean_pairwise_cosine": [1.0, 0.8]}), "agreement", f"{out}/agreement.png")
    training_curve(pd.DataFrame({"step": [0, 10], "train_loss": [3.0, 2.0], "heldout_loss": [3.1, 2.5]}),
                   {"model": "m", "heldout_loss": 2.5, "best_previous_token_head": "L1H0",
                    "best_previous_token_score": 0.9}, f"{out}/training.png")
    from posmech.analyses.taxonomy import rank_correlations  # the taxonomy job's statistics
    import posmech.analyses.geometry  # noqa: F401  (imported by every geometry job)
    print(" ".join(m for m in ("seaborn", "scipy.stats", "scipy.linalg") if m in sys.modules))
""")


def test_figures_draw_without_seaborn_or_scipy_stats(tmp_path):
    done = subprocess.run([sys.executable, "-c", _DRAW, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [], f"imported: {done.stdout}"
    names = {"taxonomy", "etc", "repeated", "induction", "angles", "explained", "agreement", "training"}
    assert {p.stem for p in tmp_path.glob("*.png")} == names
