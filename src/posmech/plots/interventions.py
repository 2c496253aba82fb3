"""Figures of the intervention rules (P5, P14, P15, P16): zoomed attention patterns of the
chosen heads before/after, and probability bars.  Each function takes the zoom windows /
tidy frames produced by :mod:`posmech.analyses.interventions` and writes one PNG."""

from __future__ import annotations

import os
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from posmech.plots import save

CONDITION_TITLES = {
    "intact": "intact",
    "knockout": "prev. position knocked out",
    "knockout_renormalised": "knocked out, renormalised",
}


def _heatmap(ax: Any, M: np.ndarray, start: int, title: str, marks: np.ndarray | None = None) -> Any:
    n = M.shape[0]
    im = ax.imshow(M, vmin=0, vmax=1, cmap="viridis", interpolation="nearest",
                   extent=(start - 0.5, start + n - 0.5, start + n - 0.5, start - 0.5))
    if marks is not None:
        for q in np.flatnonzero(marks):
            ax.plot([start - 0.5], [start + q], marker=">", color="red", markersize=4, clip_on=False)
    ax.set_title(title, fontsize=8)
    ax.set_xlabel("key position", fontsize=7)
    ax.set_ylabel("query position", fontsize=7)
    ax.tick_params(labelsize=6)
    return im


def _mass(M: np.ndarray) -> float:
    d = np.diagonal(M, -1)
    return float(d.mean()) if d.size else float("nan")


def knockout_patterns(zoom: Any, masses: dict[str, float], model: str, layers: list[int], period: int,
                      path: str | os.PathLike[str]) -> None:
    """P5: the sharp head's zoomed pattern intact / knocked out / knocked out + renormalised
    (red marks: knocked-out query rows); titles carry the pooled previous-token mass."""
    conds = [c for c in CONDITION_TITLES if c in zoom.matrices]
    fig, axes = plt.subplots(1, len(conds), figsize=(3.4 * len(conds) + 0.8, 3.6), squeeze=False,
                             layout="constrained")
    im = None
    for ax, c in zip(axes[0], conds):
        im = _heatmap(ax, zoom.matrices[c], zoom.start,
                      f"{CONDITION_TITLES[c]}\nprev-token mass {masses.get(c, float('nan')):.3f}",
                      zoom.marks if c != "intact" else None)
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label="attention")
    lay = (f"layers {layers[0]}–{layers[-1]}" if len(layers) > 1 else f"layer {layers[0]}") if layers else "no layer"
    fig.suptitle(f"P5 · {model} {zoom.head}: every {period}th query cannot attend to its previous position in {lay}",
                 fontsize=9)
    save(fig, path)


def extended_patterns(zooms: list[Any], damage: dict[str, float], model: str, k: int,
                      path: str | os.PathLike[str]) -> None:
    """P15: for each measured head, its zoomed pattern intact and with the extended positional
    embeddings averaged in groups of ``k`` just before its layer."""
    zooms = [z for z in zooms if len(z.matrices) > 1]
    if not zooms:
        fig, ax = plt.subplots(figsize=(5, 2))
        ax.axis("off")
        ax.text(0.5, 0.5, "no head measured after an averaged layer", ha="center")
        fig.suptitle(f"P15 · {model}", fontsize=9)
        save(fig, path)
        return
    fig, axes = plt.subplots(len(zooms), 2, figsize=(7.5, 3.4 * len(zooms)), squeeze=False, layout="constrained")
    im = None
    for row, z in zip(axes, zooms):
        after = next(c for c in z.matrices if c != "intact")
        im = _heatmap(row[0], z.matrices["intact"], z.start,
                      f"{z.head} intact\nprev-token mass (window) {_mass(z.matrices['intact']):.3f}")
        im = _heatmap(row[1], z.matrices[after], z.start,
                      f"{z.head}, averaged (k={k}) before layer {after.split('_L')[-1]}\n"
                      f"prev-token mass (window) {_mass(z.matrices[after]):.3f}; "
                      f"damage {damage.get(z.head, float('nan')):.2f}")
    fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.6, label="attention")
    fig.suptitle(f"P15 · {model}: extended positional embeddings averaged just before each head's layer",
                 fontsize=9)
    save(fig, path)


def repeated_tokens(df: pd.DataFrame, zoom: Any | None, model: str, path: str | os.PathLike[str]) -> None:
    """P14: distribution of the sharp head's per-document previous-token mass on repeated
    vs other queries, and a zoomed pattern around a repeat (red marks: repeated queries)."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8), gridspec_kw={"width_ratios": [1, 1.2]}, layout="constrained")
    d = df.dropna(subset=["prev_mass"])
    order = ["other", "repeat"]
    sns.stripplot(data=d, x="query_set", y="prev_mass", order=order, ax=axes[0], size=4, alpha=0.7)
    sns.pointplot(data=d, x="query_set", y="prev_mass", order=order, ax=axes[0], color="black",
                  linestyle="none", errorbar=None, markers="_")
    axes[0].set_ylim(-0.02, 1.02)
    axes[0].set_xlabel("the previous token is …", fontsize=8)
    axes[0].set_xticks([0, 1], ["a different token", "the same token"], fontsize=8)
    axes[0].set_ylabel("mean prev-token attention per document", fontsize=8)
    if zoom is not None:
        im = _heatmap(axes[1], zoom.matrices["intact"], zoom.start, "pattern around the first repeat", zoom.marks)
        fig.colorbar(im, ax=axes[1], shrink=0.8)
    else:
        axes[1].axis("off")
        axes[1].text(0.5, 0.5, "no repeated consecutive tokens\nin the documents", ha="center", va="center")
    head = zoom.head if zoom is not None else ""
    fig.suptitle(f"P14 · {model} {head}: previous-token attention where the previous token repeats the current one",
                 fontsize=9)
    save(fig, path)


def induction_bars(df: pd.DataFrame, patterns: dict[str, np.ndarray], window: tuple[int, int], labels: list[str],
                   model: str, head: str, scale: float, path: str | os.PathLike[str]) -> None:
    """P16: probability of each target under the four conditions, and the sharp head's
    pattern on the repeated triple before/after the redirect (token labels on the axes)."""
    fig, axes = plt.subplots(1, 3, figsize=(12, 4), gridspec_kw={"width_ratios": [1.4, 1, 1]}, layout="constrained")
    order = ["baseline", "redirect", "scale", "redirect_scale"]
    names = {"baseline": "baseline", "redirect": "redirect", "scale": f"output ×{scale:g}",
             "redirect_scale": f"redirect + ×{scale:g}"}
    d = df.assign(condition=df["condition"].map(names))
    sns.barplot(data=d, x="condition", y="probability", hue="target", order=[names[o] for o in order], ax=axes[0])
    axes[0].set_ylim(0, 1)
    axes[0].tick_params(axis="x", labelsize=7)
    for cont in axes[0].containers:
        axes[0].bar_label(cont, fmt="%.2f", fontsize=6)
    a, b = window
    for ax, c in zip(axes[1:], ("baseline", "redirect")):
        M = patterns[c][a:b, a:b]
        ax.imshow(M, vmin=0, vmax=1, cmap="viridis", interpolation="nearest")
        ax.set_xticks(range(b - a), labels, rotation=90, fontsize=6)
        ax.set_yticks(range(b - a), labels, fontsize=6)
        ax.set_title(f"{head} pattern: {c}", fontsize=8)
    fig.suptitle(f"P16 · {model}: induction after redirecting {head}'s attention and scaling its output ×{scale:g}",
                 fontsize=9)
    save(fig, path)
