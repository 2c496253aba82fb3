"""The figure check (posmech.plots.check) on figures built to have exactly one defect each
(the defects a reader found in the report), and on their corrected versions."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from posmech.plots import plain_log, save  # noqa: E402
from posmech.plots.check import figure_problems, read_check, visible_token  # noqa: E402


def _labelled(ax):
    ax.set_xlabel("key position")
    ax.set_ylabel("query position")
    return ax


def _problems(fig) -> list[str]:
    out = figure_problems(fig)["problems"]
    plt.close(fig)
    return out


def _heatmap(text_of) -> plt.Figure:
    """A 3 × 3 heat map with values up to 0.998, each cell annotated with ``text_of(v)``."""
    M = np.array([[0.998, 0.0, 0.0], [0.5, 0.5, 0.0], [0.25, 0.25, 0.5]])
    fig, ax = plt.subplots(figsize=(3, 3))
    ax.imshow(M, vmin=0, vmax=1)
    for q in range(3):
        for k in range(3):
            ax.text(k, q, text_of(M[q, k]), ha="center", va="center", fontsize=7)
    _labelled(ax)
    return fig


def test_annotation_that_drops_the_leading_digit_is_caught():
    bad = _problems(_heatmap(lambda v: f"{v:.2f}"[1:] if v < 1 else "1"))
    assert len(bad) == 1 and "'.00'" in bad[0] and "0.998" in bad[0]
    assert _problems(_heatmap(lambda v: f"{v:.2f}")) == []


def test_annotation_on_a_posmech_heatmap_is_read_back():
    from posmech.plots import heatmap

    fig, ax = plt.subplots(figsize=(3, 3))
    heatmap(ax, np.array([[0.123, 0.9], [0.5, np.nan]]), cmap="viridis", vmin=0, vmax=1,
            annot=np.array([["0.12", "0.10"], ["0.50", ""]]), annot_size=7, cbar_label="value")
    ax.set(xlabel="head", ylabel="layer")
    bad = _problems(fig)
    assert len(bad) == 1 and "'0.10'" in bad[0] and "0.9" in bad[0]


def test_small_text_is_caught_and_wide_figures_count_their_shrink():
    fig, ax = plt.subplots(figsize=(3, 3))
    _labelled(ax).set_title("tiny", fontsize=4.5)
    assert any("4.5 pt" in p for p in _problems(fig))
    fig, ax = plt.subplots(figsize=(16, 3))  # ~1950 px tight: shown at 0.61, 9 pt reads as 5.5
    _labelled(ax).tick_params(labelsize=9)
    ax.xaxis.label.set_fontsize(14)
    ax.yaxis.label.set_fontsize(14)
    assert any("shrink 0.6" in p and "9 pt" in p for p in _problems(fig))


def test_blank_token_tick_label_is_caught_and_visible_token_fixes_it():
    tokens = ["the", " ", "\n", "and"]
    for labels, n_bad in (([t.strip() and t for t in tokens], 1), ([visible_token(t) for t in tokens], 0)):
        fig, ax = plt.subplots(figsize=(3, 3))
        ax.barh(range(4), [1, 2, 3, 4])
        ax.set_yticks(range(4), labels)
        ax.set(xlabel="contribution", ylabel="token")
        assert len([p for p in _problems(fig) if "blank tick labels" in p]) == n_bad
    assert visible_token(" the") == "␣the" and visible_token("\n") == "⏎" and visible_token("") == "∅"


def test_unlabelled_axis_is_caught():
    fig, ax = plt.subplots(figsize=(3, 3))
    ax.plot([0, 1], [0, 1])
    ax.set_xlabel("step")
    bad = _problems(fig)
    assert len(bad) == 1 and "y axis has tick labels but no axis label" in bad[0]


def test_shared_x_labels_hidden_above_an_empty_panel_are_caught():
    """K8's defect: a 2 × 3 grid of 4 panels with sharex hides the x tick labels of the
    top-right panels, whose bottom neighbours are switched off."""
    fig, axes = plt.subplots(2, 3, figsize=(7, 4), sharex=True)
    for ax in axes.ravel()[:4]:
        ax.plot([1, 2], [1, 2])
        ax.set_ylabel("Z")
    for ax in axes.ravel()[4:]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("n")
    bad = _problems(fig)
    assert sum("no panel in its column shows their labels" in p for p in bad) == 2


def test_log_axis_under_two_decades_needs_plain_labels():
    def fig_with(plain: bool):
        fig, ax = plt.subplots(figsize=(3, 3))
        ax.plot([1, 5, 10, 32], [3.0, 2.5, 2.4, 2.6], "o-")
        ax.set_xscale("log")
        if plain:
            plain_log(ax.xaxis, [1, 5, 10, 32])
        ax.set(xlabel="group size k", ylabel="loss")
        return fig

    bad = _problems(fig_with(False))
    assert any("under two decades" in p for p in bad)
    assert _problems(fig_with(True)) == []


def test_save_stores_the_check_in_the_png(tmp_path):
    fig, ax = plt.subplots(figsize=(3, 3))
    ax.plot([0, 1], [0, 1])
    ax.set_title("no labels")
    save(fig, tmp_path / "f.png")
    stored = read_check(tmp_path / "f.png")
    assert len(stored["problems"]) == 2 and stored["width_px"] > 300 and stored["min_font_pt"] >= 6
    with pytest.raises(KeyError, match="no 'posmech-figure-check' metadata"):
        plt.imsave(tmp_path / "plain.png", np.zeros((2, 2)))
        read_check(tmp_path / "plain.png")


def test_masked_cells_must_be_grey_and_said():
    M = np.tril(np.ones((4, 4)) * 0.5)
    M[np.triu_indices(4, 1)] = np.nan

    def fig_with(bad, title):
        fig, ax = plt.subplots(figsize=(3, 3))
        cmap = plt.get_cmap("viridis")
        if bad:
            cmap = cmap.with_extremes(bad=bad)
        ax.imshow(M, cmap=cmap, vmin=0, vmax=1)
        _labelled(ax).set_title(title)
        return fig

    assert any("transparent" in p for p in _problems(fig_with(None, "pattern")))  # matplotlib's default
    assert any("low end" in p for p in _problems(fig_with(plt.get_cmap("viridis")(0.0), "pattern (masked)")))
    assert any("no text" in p for p in _problems(fig_with("0.85", "pattern")))
    assert _problems(fig_with("0.85", "pattern (grey: masked)")) == []


def test_save_draws_once_and_writes_what_savefig_tight_writes(tmp_path, monkeypatch):
    """plots.save draws a figure laid out by tight_layout once (rendered at 150 dpi, the
    check and the tight box read off that draw, the box found on the drawn pixels, those
    pixels written), where savefig(bbox_inches="tight") draws it three times; the PNG is what
    that savefig writes, up to the few pixels by which the artists' extents (a text's line
    height) exceed their ink and the anti-aliasing at that sub-pixel shift: the drawing has
    savefig.pad_inches of margin on every side.  A text past the figure's edge, even wholly
    (nothing of it drawn inside), is not cut off: that figure is rendered again, onto its box."""
    from PIL import Image

    def figure(note_at: float | None = None):
        fig, axes = plt.subplots(1, 2, figsize=(4, 2))
        for ax in axes:
            im = ax.imshow(np.arange(12.0).reshape(3, 4))
            fig.colorbar(im, ax=ax).set_label("value")
            _labelled(ax).set_title("a panel")
        fig.tight_layout()
        if note_at is not None:
            fig.text(note_at, 0.5, "a note right of the figure", fontsize=8)
        return fig

    fig = figure()
    fig.savefig(tmp_path / "plain.png", dpi=150, bbox_inches="tight")
    plt.close(fig)
    draws = []
    original = matplotlib.figure.Figure.draw
    monkeypatch.setattr(matplotlib.figure.Figure, "draw", lambda self, r: draws.append(1) or original(self, r))
    save(figure(), tmp_path / "saved.png")
    assert len(draws) == 1
    with Image.open(tmp_path / "plain.png") as a, Image.open(tmp_path / "saved.png") as b:
        A, B = (np.asarray(im.convert("L")).astype(int) for im in (a, b))

    def ink(M):  # first and last rows, then columns, with anything darker than the white ground
        rows, cols = np.flatnonzero((M < 255).any(1)), np.flatnonzero((M < 255).any(0))
        return rows[0], M.shape[0] - 1 - rows[-1], cols[0], M.shape[1] - 1 - cols[-1]

    pad = round(plt.rcParams["savefig.pad_inches"] * 150)
    assert all(abs(m - pad) <= 1 for m in ink(B)), ink(B)
    assert all(abs(x - y) <= 4 for x, y in zip(A.shape, B.shape)), (A.shape, B.shape)
    # the drawing inside the margins: the same pixels, but at the text's anti-aliased edges
    a0, a1, a2, a3 = ink(A)
    b0, b1, b2, b3 = ink(B)
    A, B = A[a0: A.shape[0] - a1, a2: A.shape[1] - a3], B[b0: B.shape[0] - b1, b2: B.shape[1] - b3]
    h, w = min(A.shape[0], B.shape[0]), min(A.shape[1], B.shape[1])
    assert np.abs(A[:h, :w] - B[:h, :w]).mean() < 8  # grey levels of 255, mean over the drawing
    for note_at in (0.9, 1.05):  # across the right edge; wholly past it
        draws.clear()
        save(figure(note_at), tmp_path / "note.png")
        assert len(draws) == 2
        with Image.open(tmp_path / "note.png") as im:
            assert im.size[0] > 4 * 150 + 30  # the note is in the PNG
