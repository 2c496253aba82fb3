"""Figures of the intervention rules (P5, P14, P15, P16): zoomed attention patterns of the
chosen heads before/after, and probability bars.  Each function takes the zoom windows /
tidy frames produced by :mod:`posmech.analyses.interventions` and writes one PNG."""

from __future__ import annotations

import colorsys
import os
from typing import Any

import matplotlib.colors as mcolors
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from posmech.analyses.interventions import knockout_verdict, layers_words
from posmech.plots import category_colours, save, seeded

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
    ax.tick_params(labelsize=7)
    return im


def _mass(M: np.ndarray) -> float:
    d = np.diagonal(M, -1)
    return float(d.mean()) if d.size else float("nan")


def _words(fig: Any, title: str, text: str) -> None:
    """A figure that says in words why there is nothing to draw."""
    ax = fig.add_subplot()
    ax.axis("off")
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=10, wrap=True)
    fig.suptitle(title, fontsize=9)


def _grouped_bars(ax: Any, d: pd.DataFrame, conditions: list[str]) -> None:
    """One bar per (condition, target): the conditions along x, the targets side by side
    within each (0.8 wide in all), coloured per target (the colour cycle, its saturation
    × 0.75) and labelled with the target (for a legend).  Each (condition, target) holds
    one probability, the bar's height: no average, no error bar."""
    repeated = d.duplicated(["condition", "target"])
    if repeated.any():
        c, t = d.loc[repeated, ["condition", "target"]].iloc[0]
        raise ValueError(f"induction_bars: several probabilities for condition {c}, target {t}")
    targets = list(dict.fromkeys(d["target"]))
    width = 0.8 / max(len(targets), 1)
    for j, (target, colour) in enumerate(zip(targets, category_colours(len(targets)))):
        h, l, s = colorsys.rgb_to_hls(*mcolors.to_rgb(colour))
        height = d[d["target"] == target].set_index("condition")["probability"].reindex(conditions)
        ax.bar(np.arange(len(conditions)) - 0.4 + width * (j + 0.5), height.to_numpy(), width=width,
               color=colorsys.hls_to_rgb(h, l, s * 0.75), label=str(target))
    ax.set_xticks(range(len(conditions)), conditions)
    ax.set_xlim(-0.5, len(conditions) - 0.5)


def knockout_patterns(zoom: Any, masses: dict[str, float], model: str, layers: list[int], period: int,
                      path: str | os.PathLike[str]) -> None:
    """P5: the sharp head's zoomed pattern intact / knocked out / knocked out + renormalised
    (red marks: knocked-out query rows); titles carry the pooled previous-token mass, and the
    title says "no effect" in words when the knock-out moves it by less than
    :data:`posmech.analyses.interventions.NO_EFFECT` (``knockout_verdict``).  With no layer
    below the sharp head, the intact pattern and a sentence saying so."""
    title = f"P5 · {model} {zoom.head}: every {period}th query cannot attend to its previous position"
    if not layers:
        fig, axes = plt.subplots(1, 2, figsize=(7.5, 3.4), layout="constrained", gridspec_kw={"width_ratios": [1, 1.1]})
        im = _heatmap(axes[0], zoom.matrices["intact"], zoom.start,
                      f"intact\nprev-token mass {masses.get('intact', float('nan')):.3f}")
        fig.colorbar(im, ax=axes[0], shrink=0.8, label="attention")
        axes[1].axis("off")
        axes[1].text(0.5, 0.5, f"Nothing to knock out: the sharp head\n{zoom.head} is in layer 0, so no earlier\n"
                     "layer can carry the previous position.", ha="center", va="center", fontsize=9,
                     transform=axes[1].transAxes)
        fig.suptitle(title, fontsize=9)
        save(fig, path)
        return
    conds = [c for c in CONDITION_TITLES if c in zoom.matrices]
    fig, axes = plt.subplots(1, len(conds), figsize=(2.8 * len(conds) + 0.9, 3.3), squeeze=False,
                             layout="constrained")
    im = None
    for ax, c in zip(axes[0], conds):
        im = _heatmap(ax, zoom.matrices[c], zoom.start,
                      f"{CONDITION_TITLES[c]}\nprev-token mass {masses.get(c, float('nan')):.3f}",
                      zoom.marks if c != "intact" else None)
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label="attention")
    title += f" in {layers_words(layers)}"
    verdict = knockout_verdict(masses.get("intact", float("nan")), masses.get("knockout", float("nan")), zoom.head,
                               layers)
    if verdict:  # say it in words rather than leave three equal panels unexplained
        title += f"\n{verdict}"
    fig.suptitle(title, fontsize=9)
    save(fig, path)


def extended_patterns(zooms: list[Any], damage: dict[str, float], model: str, k: int,
                      path: str | os.PathLike[str], max_heads: int = 4) -> None:
    """P15: for at most ``max_heads`` measured heads (the earliest by layer and the last, the
    sharp head), the zoomed pattern intact and with the extended positional embeddings
    averaged in groups of ``k`` just before its layer, a colorbar per row; the head's damage
    in the title of its row."""
    zooms = [z for z in zooms if len(z.matrices) > 1]
    title = f"P15 · {model}: extended positional embeddings averaged just before each head's layer"
    if not zooms:
        fig = plt.figure(figsize=(6, 2))
        _words(fig, title, "No head was measured after an averaged layer: nothing to compare.")
        save(fig, path)
        return
    # the earliest heads and the last (by layer: the sharp head, whose small damage is the point)
    shown = zooms if len(zooms) <= max_heads else zooms[: max_heads - 1] + zooms[-1:]
    fig, axes = plt.subplots(len(shown), 2, figsize=(6.2, 2.55 * len(shown) + 0.5), squeeze=False, layout="constrained")
    for row, z in zip(axes, shown):
        after = next(c for c in z.matrices if c != "intact")
        _heatmap(row[0], z.matrices["intact"], z.start,
                 f"{z.head} intact\nprev-token mass (window) {_mass(z.matrices['intact']):.3f}")
        im = _heatmap(row[1], z.matrices[after], z.start,
                      f"{z.head}, averaged (k={k}) before layer {after.split('_L')[-1]}\n"
                      f"mass {_mass(z.matrices[after]):.3f}; damage {damage.get(z.head, float('nan')):.2f}")
        fig.colorbar(im, ax=row.tolist(), shrink=0.9, label="attention")
    more = f"\n(+{len(zooms) - len(shown)} more heads in extended_averaging.csv)" if len(zooms) > len(shown) else ""
    fig.suptitle(title + more, fontsize=9)
    save(fig, path)


def repeated_tokens(df: pd.DataFrame, zoom: Any | None, model: str, path: str | os.PathLike[str]) -> None:
    """P14: distribution of the sharp head's per-document previous-token mass on repeated
    vs other queries, and a zoomed pattern around a repeat (red marks: repeated queries)."""
    fig, axes = plt.subplots(1, 2, figsize=(8.2, 3.6), gridspec_kw={"width_ratios": [1, 1.2]}, layout="constrained")
    d = df.dropna(subset=["prev_mass"])
    order = ["other", "repeat"]
    with seeded(0):  # the jitter: identical runs, identical figures
        for i, q in enumerate(order):  # one point per document, jittered sideways by up to ±0.1
            y = d.loc[d["query_set"] == q, "prev_mass"].to_numpy()
            x = i + (np.random.uniform(-0.1, 0.1, len(y)) if len(y) > 1 else np.zeros(len(y)))
            axes[0].scatter(x, y, s=16, color="C0", alpha=0.7, linewidths=0, zorder=3)
    means = [d.loc[d["query_set"] == q, "prev_mass"].mean() for q in order]  # NaN (not drawn) without documents
    axes[0].plot(range(len(order)), means, linestyle="none", marker="_", color="black", markersize=6.77,
                 markeredgewidth=2.0)
    axes[0].set_xlim(-0.5, len(order) - 0.5)
    axes[0].set_ylim(-0.02, 1.02)
    axes[0].set_xlabel("the previous token is …", fontsize=8)
    axes[0].set_xticks([0, 1], ["a different token", "the same token"], fontsize=8)
    axes[0].set_ylabel("mean prev-token attention per document", fontsize=8)
    if zoom is not None:
        im = _heatmap(axes[1], zoom.matrices["intact"], zoom.start, "pattern around the first repeat", zoom.marks)
        fig.colorbar(im, ax=axes[1], shrink=0.8, label="attention")
    else:
        axes[1].axis("off")
        axes[1].text(0.5, 0.5, "no repeated consecutive tokens\nin the documents", ha="center", va="center")
    head = zoom.head if zoom is not None else ""
    fig.suptitle(f"P14 · {model} {head}: previous-token attention where the previous token repeats the current one",
                 fontsize=9)
    save(fig, path)


def induction_bars(df: pd.DataFrame, patterns: dict[str, np.ndarray], window: tuple[int, int], labels: list[str],
                   model: str, head: str, scale: float, path: str | os.PathLike[str]) -> None:
    """P16: probability of each target under the four conditions (top), and the sharp head's
    pattern on the repeated triple before/after the redirect (bottom; token labels on the
    axes, one colour scale).  When every probability is under 1 %, the bar panel says so in
    words (the model does not predict the repeat at all) instead of drawing empty bars."""
    order = ["baseline", "redirect", "scale", "redirect_scale"]
    names = {"baseline": "baseline", "redirect": "redirect", "scale": f"output ×{scale:g}",
             "redirect_scale": f"redirect + ×{scale:g}"}
    d = df.assign(condition=df["condition"].map(names))
    empty = bool(len(d)) and float(d["probability"].max()) < 0.01
    fig = plt.figure(figsize=(8, 4.9 if empty else 7.2), layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=[0.22 if empty else 1, 1.25])
    ax0 = top.subplots()
    if empty:
        ax0.axis("off")
        ax0.text(0.5, 0.5, f"Every target gets < 1 % (max {d['probability'].max():.1e}) in every condition:\n"
                 f"{model} does not complete the repeated phrase, so there is no induction to redirect.",
                 ha="center", va="center", fontsize=9, transform=ax0.transAxes)
    else:
        _grouped_bars(ax0, d, [names[o] for o in order])
        ax0.set_ylim(0, 1.08)
        ax0.set_xlabel("")
        ax0.set_ylabel("probability of the next word\n(variants summed)", fontsize=8)
        ax0.tick_params(axis="x", labelsize=8)
        ax0.legend(title="target", fontsize=8, title_fontsize=8)
        for cont in ax0.containers:
            ax0.bar_label(cont, fmt="%.2f", fontsize=7)
    ax0.set_title("next-word probabilities at the end of the prompt", fontsize=9)
    a, b = window
    axes = bottom.subplots(1, 2)
    im = None
    for ax, c in zip(axes, ("baseline", "redirect")):
        M = patterns[c][a:b, a:b]
        im = ax.imshow(M, vmin=0, vmax=1, cmap="viridis", interpolation="nearest")
        ax.set_xticks(range(b - a), labels, rotation=45, ha="right", rotation_mode="anchor", fontsize=8)
        ax.set_yticks(range(b - a), labels, fontsize=8)
        ax.set_xlabel("key token", fontsize=8)
        ax.set_ylabel("query token", fontsize=8)
        ax.set_title(f"{head} pattern: {c}", fontsize=9)
    bottom.colorbar(im, ax=axes.tolist(), shrink=0.8, label="attention")
    fig.suptitle(f"P16 · {model}: induction after redirecting {head}'s attention and scaling its output ×{scale:g}",
                 fontsize=9)
    save(fig, path)
