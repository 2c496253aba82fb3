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

from posmech.analyses.anatomy import TAXA, Thresholds, centre_rows, offsets, row_windows
from posmech.plots import MASKED, save

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
    column at −1)."""
    n_rows = len(panels)
    fig, axes = plt.subplots(n_rows, 4, figsize=(8.0, 2.3 * n_rows + 0.6), squeeze=False,
                             gridspec_kw={"width_ratios": [1, 1, 1, 0.8]})
    for r, (head, role, raw, masked, pattern) in enumerate(panels):
        n = raw.shape[0]
        sl = slice(start, start + size) if zoom else slice(0, n)
        lo, hi = (start, start + size) if zoom else (0, n)
        extent = [lo - 0.5, hi - 0.5, hi - 0.5, lo - 0.5]
        for c, M in enumerate((raw, masked)):
            im = _diverging(axes[r, c], M[sl, sl], extent, lo == 0)
            _colorbar(fig, im, axes[r, c], "score − row median", extend="both")
        P = pattern[sl, sl].astype(np.float64)
        P = np.where(np.triu(np.ones_like(P, dtype=bool), 1), np.nan, P)
        cmap = plt.get_cmap("viridis").with_extremes(bad=MASKED)
        pmax = float(np.nanpercentile(P, 99.5)) if np.isfinite(P).any() else 1.0
        im = axes[r, 2].imshow(P, cmap=cmap, vmin=0, vmax=max(pmax, 1e-6), extent=extent, interpolation="nearest")
        _colorbar(fig, im, axes[r, 2], "attention")
        Z = row_windows(raw, window)[sl]
        cmap = plt.get_cmap("RdBu_r").with_extremes(bad=MASKED)
        o = offsets(window)
        im = axes[r, 3].imshow(Z, cmap=cmap, norm=TwoSlopeNorm(0.0, -2.5, 2.5), aspect="auto", interpolation="nearest",
                               extent=[o[0] - 0.5, o[-1] + 0.5, hi - 0.5, lo - 0.5])
        _colorbar(fig, im, axes[r, 3], "(score − median) / spread", extend="both")
        for c in range(4):
            ax = axes[r, c]
            name = COLUMNS[c].format(W=window)
            ax.set_title(f"{head} ({role}):\n{name}" if c == 0 else f"\n{name}", fontsize=6.5)
            ax.set_xlabel("key offset k − q" if c == 3 else "key position", fontsize=6, labelpad=1)
            ax.set_ylabel("query position q", fontsize=6, labelpad=1)
            ax.tick_params(labelsize=6, length=2, pad=1)
            if not zoom and size < n and c < 3:
                ax.add_patch(Rectangle((start - 0.5, start - 0.5), size, size, fill=False, ec="red", lw=1.0))
    fig.suptitle(title + "  (grey: masked, a key after its query)", fontsize=8)
    fig.tight_layout(pad=0.4, w_pad=0.3, h_pad=0.6, rect=(0, 0, 1, 1 - 0.3 / fig.get_figheight()))
    save(fig, path)


def _colorbar(fig: Any, im: Any, ax: Any, label: str | None, **kw: Any) -> None:
    cb = fig.colorbar(im, ax=ax, fraction=0.05, pad=0.02, **kw)
    cb.ax.tick_params(labelsize=6, length=2, pad=1)
    if label:
        cb.set_label(label, fontsize=6, labelpad=1)


SMALL = {"font.size": 7, "axes.titlesize": 8, "axes.labelsize": 7, "xtick.labelsize": 6, "ytick.labelsize": 6}


def taxa_figure(taxa: pd.DataFrame, profiles: pd.DataFrame, thresholds: Thresholds, chosen: dict[str, str],
                title: str, path: str | os.PathLike[str]) -> None:
    """See :func:`_taxa_figure` (drawn 8 in wide, the report's column)."""
    with plt.rc_context(SMALL):
        _taxa_figure(taxa, profiles, thresholds, chosen, title, path)


def _taxa_figure(taxa: pd.DataFrame, profiles: pd.DataFrame, thresholds: Thresholds, chosen: dict[str, str],
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
