"""Figures of the score anatomy (P12: raw / masked scores and pattern triptychs) and the
score taxa (P13: features of every head, median score profiles)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.colors import TwoSlopeNorm
from matplotlib.patches import Rectangle
from matplotlib.ticker import FixedLocator

from posmech.analyses.anatomy import TAXA, centre_rows, offsets, row_windows
from posmech.plots import MASKED, save
from posmech.settings.anatomy import AnatomyTaxaSettings

TAXON_COLOURS = {TAXA[0]: "tab:blue", TAXA[1]: "tab:red", TAXA[2]: "0.6"}
COLUMNS = ("raw scores (future incl.)", "masked scores", "pattern (softmax)", "row window q−{W}…q+{W}")


def _diverging(ax: Any, M: np.ndarray, extent: list[float], first_key: bool) -> Any:
    """Row-centred scores on a diverging map centred at 0, symmetric at the 99th percentile
    of |x| (over keys > 0 when the panel shows key 0: the first token's scores, often an
    attention sink, would otherwise set the range); masked entries (NaN) light grey."""
    C = centre_rows(M)
    R = C[:, 1:] if first_key and C.shape[1] > 1 else C
    vmax = float(np.nanpercentile(np.abs(R), 99)) if np.isfinite(R).any() else 1.0
    vmax = vmax if vmax > 0 else 1.0
    cmap = plt.get_cmap("RdBu_r").with_extremes(bad=MASKED)
    return ax.imshow(C, cmap=cmap, norm=TwoSlopeNorm(0.0, -vmax, vmax), extent=extent, interpolation="nearest",
                     origin="upper")


def score_triptychs(
    panels: Sequence[tuple[str, str, np.ndarray, np.ndarray, np.ndarray]], start: int, size: int, zoom: bool,
    title: str, path: str | os.PathLike[str], window: int = 5,
) -> None:
    """One row per head ``(head, role, raw, masked, pattern)`` (full ``[n, n]`` matrices):
    the post's triptych — raw scores, masked scores, pattern — and a fourth panel, each
    query's P13 row window (raw scores at keys ``q−W..q+W``, centred and divided by their
    spread: :func:`~posmech.analyses.anatomy.row_windows`); ``zoom``: the ``size × size``
    window at ``start`` (axes in document positions), else the whole matrix with the window
    outlined in red.  Scores are centred per row (minus the row's median over its shown,
    unmasked entries) so the diverging colour map shows the structure along each row; the
    fourth panel shows the structure at the diagonal that a strong trend along the keys
    hides there (a dark diagonal: a dark column at 0; a bright sub-diagonal: a bright
    column at −1).  The four panels of a row share their query axis (numbered on the first).

    Laid out by :func:`_triptych_layout` (fixed sizes in inches, widths from the measured tick
    labels), not ``tight_layout``, and saved at the figure's own size: a layout pass over
    these 32 axes costs about as much as drawing them, seconds of CPU."""
    n_rows = len(panels)
    fig = plt.figure(figsize=(8.0, 2.3 * n_rows + 0.6))  # the height follows from the layout
    grid = [[None] * 4 for _ in range(n_rows)]
    bars = [[None] * 4 for _ in range(n_rows)]
    for r, (head, role, raw, masked, pattern) in enumerate(panels):
        n = raw.shape[0]
        sl = slice(start, start + size) if zoom else slice(0, n)
        lo, hi = (start, start + size) if zoom else (0, n)
        extent = [lo - 0.5, hi - 0.5, hi - 0.5, lo - 0.5]
        axes = grid[r]
        for c in range(4):
            axes[c] = fig.add_axes((0, 0, 0.1, 0.1), sharey=axes[0] if c else None)
        bars[r] = [fig.add_axes((0, 0, 0.01, 0.1)) for _ in range(4)]
        for c, M in enumerate((raw, masked)):
            im = _diverging(axes[c], M[sl, sl], extent, lo == 0)
            _colorbar(fig, im, bars[r][c], "score − row median", extend="both")
        P = pattern[sl, sl].astype(np.float64)
        P = np.where(np.triu(np.ones_like(P, dtype=bool), 1), np.nan, P)
        cmap = plt.get_cmap("viridis").with_extremes(bad=MASKED)
        pmax = float(np.nanpercentile(P, 99.5)) if np.isfinite(P).any() else 1.0
        im = axes[2].imshow(P, cmap=cmap, vmin=0, vmax=max(pmax, 1e-6), extent=extent, interpolation="nearest")
        _colorbar(fig, im, bars[r][2], "attention")
        Z = row_windows(raw, window)[sl]
        cmap = plt.get_cmap("RdBu_r").with_extremes(bad=MASKED)
        o = offsets(window)
        im = axes[3].imshow(Z, cmap=cmap, norm=TwoSlopeNorm(0.0, -2.5, 2.5), aspect="auto", interpolation="nearest",
                            extent=[o[0] - 0.5, o[-1] + 0.5, hi - 0.5, lo - 0.5])
        _colorbar(fig, im, bars[r][3], "(score − median) / spread", extend="both")
        for c, ax in enumerate(axes):
            name = COLUMNS[c].format(W=window)
            ax.set_title(f"{head} ({role}):\n{name}" if c == 0 else f"\n{name}", fontsize=TITLE_PT, pad=TITLE_PAD_PT,
                         y=1.0)  # at the top (no ticks there): draws skip finding a place above top ticks
            ax.set_xlabel("key offset k − q" if c == 3 else "key position", fontsize=LABEL_PT, labelpad=1)
            ax.tick_params(labelsize=LABEL_PT, length=2, pad=1)
            if c == 0:
                ax.set_ylabel("query position q", fontsize=LABEL_PT, labelpad=1)
            else:
                ax.tick_params(labelleft=False)
            if not zoom and size < n and c < 3:
                ax.add_patch(Rectangle((start - 0.5, start - 0.5), size, size, fill=False, ec="red", lw=1.0))
    text = fig.suptitle(title + "  (grey: masked, a key after its query)", fontsize=8)
    _triptych_layout(fig, grid, bars, text)
    save(fig, path, tight=False)


TITLE_PT, LABEL_PT, TITLE_PAD_PT = 6.5, 6.0, 4.0


def _triptych_layout(fig: Any, grid: list[list[Any]], bars: list[list[Any]], suptitle: Any) -> None:
    """Place the triptych's panels and colour bars where ``tight_layout`` would, from sizes
    known in advance (titles, axis labels, x tick labels: lines of text at their font size)
    and the widths of the first column's y tick labels and of each column's colour-bar tick
    labels, measured (their number depends on the panels' height: measured again at each
    new height until they no longer widen).  The first three panels of a row are square
    (``imshow``'s equal aspect), the fourth 0.8 as wide, each colour bar as tall as its
    panel; the panels fill the figure's width and the figure's height follows from them.
    The suptitle is wrapped onto two lines when one does not fit the width."""
    W = fig.get_figwidth()
    n_rows = len(grid)
    pt = 1 / 72
    line = 1.2 * pt  # a line of text, inches per point of font size
    pad = 0.05  # inches: at the figure's edges and between a panel's decorations and the next panel
    title_h = 2 * TITLE_PT * line + TITLE_PAD_PT * pt
    ticks_w = (2 + 1) * pt  # tick length and pad
    below = ticks_w + LABEL_PT * line + 1 * pt + LABEL_PT * line  # x ticks, their labels, x label (pad 1 pt)
    label_w = LABEL_PT * line + 1 * pt  # a rotated axis label and its pad
    bar_gap, bar_w = 0.05, 0.08
    ratios = (1.0, 1.0, 1.0, 0.8)
    renderer = fig.canvas.get_renderer()
    if suptitle.get_window_extent(renderer).width / fig.dpi > W - 2 * pad:
        suptitle.set_text(_wrap_in_two(suptitle.get_text()))
    top = pad + suptitle.get_window_extent(renderer).height / fig.dpi + pad

    def width(labels: list[Any]) -> float:
        """The widest of the shown ``labels``, inches (the text alone: not yet placed)."""
        sizes = [renderer.get_text_width_height_descent(t.get_text(), t.get_fontproperties(),
                                                        ismath="TeX" if "$" in t.get_text() else False)[0]
                 for t in labels if t.get_visible() and t.get_text().strip()]
        return max(sizes, default=0.0) / renderer.dpi

    widths = [0.0] * 5  # y tick labels of the first column; tick labels of each column's colour bars
    unit = (W - 2 * pad) / (sum(ratios) + 1.0)
    for _ in range(5):
        H = top + n_rows * (title_h + unit + below + 2 * pad)
        fig.set_size_inches(W, H)
        for r in range(n_rows):  # the final height, provisional x: the tick counts follow from the height
            for ax in grid[r] + bars[r]:
                ax.set_position((0, 0, 0.1, unit / H))
            for ax in grid[r] + bars[r]:
                _place_as_drawn(ax, renderer)
        measured = [max(width(row[0].get_yticklabels()) for row in grid)]
        measured += [max(width(row[c].get_yticklabels()) for row in bars) for c in range(4)]
        if all(m <= w + 1e-9 for m, w in zip(measured, widths)):
            break
        widths = [max(m, w) for m, w in zip(measured, widths)]
        left = pad + label_w + widths[0] + ticks_w
        fixed = left + sum(bar_gap + bar_w + ticks_w + widths[1 + c] + label_w + pad for c in range(4))
        unit = (W - fixed) / sum(ratios)
    pitch = title_h + unit + below + 2 * pad
    x = pad + label_w + widths[0] + ticks_w
    for c in range(4):
        w = unit * ratios[c]
        for r in range(n_rows):
            y0 = H - top - r * pitch - pad - title_h - unit
            grid[r][c].set_position((x / W, y0 / H, w / W, unit / H))
            bars[r][c].set_position(((x + w + bar_gap) / W, y0 / H, bar_w / W, unit / H))
        x += w + bar_gap + bar_w + ticks_w + widths[1 + c] + label_w + pad
    suptitle.set_y(1 - pad / H)
    suptitle.set_va("top")
    for ax in (a for row in grid + bars for a in row):  # the ticks the locators give at the final size, fixed:
        _place_as_drawn(ax, renderer)
        ax.yaxis.set_major_locator(FixedLocator(ax.get_yticks()))  # each draw and the check would ask again
        ax.xaxis.set_major_locator(FixedLocator(ax.get_xticks()))


def _place_as_drawn(ax: Any, renderer: Any) -> None:
    """Give ``ax`` the box a draw gives it (its aspect; a colour bar: less its extension
    triangles, by its axes locator), so its tick locators see the length they will draw."""
    locator = ax.get_axes_locator()
    ax.apply_aspect(locator(ax, renderer) if locator else None)


def _wrap_in_two(text: str) -> str:
    """``text`` on two lines, broken at the space nearest its middle."""
    mid = len(text) // 2
    spaces = [i for i, ch in enumerate(text) if ch == " "]
    if not spaces:
        return text
    i = min(spaces, key=lambda j: abs(j - mid))
    return text[:i].rstrip() + "\n" + text[i:].lstrip()


def _colorbar(fig: Any, im: Any, cax: Any, label: str | None, **kw: Any) -> None:
    cb = fig.colorbar(im, cax=cax, **kw)
    cb.ax.tick_params(labelsize=6, length=2, pad=1)
    if label:
        cb.set_label(label, fontsize=6, labelpad=1)


SMALL = {"font.size": 7, "axes.titlesize": 8, "axes.labelsize": 7, "xtick.labelsize": 6, "ytick.labelsize": 6}


def taxa_figure(taxa: pd.DataFrame, profiles: pd.DataFrame, thresholds: AnatomyTaxaSettings, chosen: dict[str, str],
                title: str, path: str | os.PathLike[str]) -> None:
    """See :func:`_taxa_figure` (drawn 8 in wide, the report's column)."""
    with plt.rc_context(SMALL):
        _taxa_figure(taxa, profiles, thresholds, chosen, title, path)


def _taxa_figure(taxa: pd.DataFrame, profiles: pd.DataFrame, thresholds: AnatomyTaxaSettings, chosen: dict[str, str],
                 title: str, path: str | os.PathLike[str]) -> None:
    """Top left: every head's median dip vs median bump (colour: taxon; dashed: thresholds;
    classified and chosen heads labelled). Top right: the taxon of every head on the layer ×
    head grid. Bottom: median normalised score profiles (row-centred, divided by the row's
    spread) around the diagonal, one line per head, coloured by taxon."""
    fig = plt.figure(figsize=(8.0, 7.2))
    grid_spec = fig.add_gridspec(2, 2, width_ratios=[1.25, 1], height_ratios=[1, 1])
    axes = [fig.add_subplot(grid_spec[0, 0]), fig.add_subplot(grid_spec[0, 1]), fig.add_subplot(grid_spec[1, :])]
    ax = axes[0]
    for taxon in TAXA:
        sel = taxa[taxa["taxon"] == taxon]
        ax.scatter(sel["dip"], sel["bump"], s=22, color=TAXON_COLOURS[taxon], label=f"{taxon} ({len(sel)})",
                   alpha=0.85, edgecolor="none")
    ax.axvline(thresholds.dip_min, color=TAXON_COLOURS[TAXA[0]], ls="--", lw=0.8)
    ax.axhline(thresholds.bump_min, color=TAXON_COLOURS[TAXA[1]], ls="--", lw=0.8)
    for r in taxa.itertuples():
        if r.taxon != TAXA[2] or r.head_name in chosen:
            label = r.head_name + (f" ({chosen[r.head_name]})" if r.head_name in chosen else "")
            ax.annotate(label, (r.dip, r.bump), fontsize=6, xytext=(2, 2), textcoords="offset points")
    ax.set(xlabel="median dip at offset 0 (row spreads)", ylabel="median bump at offset −1 (row spreads)",
           title="features of every head (dashed: dip_min, bump_min)")
    ax.legend(fontsize=7, loc="best")
    L, H = int(taxa["layer"].max()) + 1, int(taxa["head"].max()) + 1
    grid = np.zeros((L, H))
    for r in taxa.itertuples():
        grid[r.layer, r.head] = TAXA.index(r.taxon)
    from matplotlib.colors import ListedColormap

    axes[1].imshow(grid, cmap=ListedColormap([TAXON_COLOURS[t] for t in TAXA]), vmin=-0.5, vmax=2.5,
                   aspect="auto", interpolation="nearest")
    for r in taxa.itertuples():
        if r.head_name in chosen:
            axes[1].text(r.head, r.layer, chosen[r.head_name][0].upper(), ha="center", va="center", fontsize=7,
                         color="white" if r.taxon != TAXA[2] else "black")
    axes[1].set(xlabel="head", ylabel="layer", title="taxon per head (S: sharp, E: early)",
                xticks=range(H), yticks=range(L))
    axes[1].tick_params(labelsize=6)
    ax = axes[2]
    taxon_of = dict(zip(taxa["head_name"], taxa["taxon"]))
    few = profiles["head_name"].nunique() <= 12
    for head, prof in profiles.groupby("head_name", sort=False):
        t = taxon_of[head]
        shown = t != TAXA[2] or head in chosen or few
        ax.plot(prof["offset"], prof["median"], color=TAXON_COLOURS[t], lw=1.4 if shown else 0.6,
                alpha=0.9 if shown else 0.35, zorder=3 if shown else 1, marker="o" if few else None, ms=3,
                label=f"{head} ({t})" if few or head in chosen else None)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=6, loc="best")
    ax.axvline(0, color="k", lw=0.5)
    ax.axvline(-1, color="k", lw=0.5, ls=":")
    ax.set(xlabel="key offset from the query (0: itself, −1: previous token; > 0: future keys, masked in the pattern)",
           ylabel="median row-centred score / row spread", title="median score profile around the diagonal")
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    save(fig, path)
