"""Figures of the posembed rules, W_pos averaged in groups of k (P2–P4;
:mod:`posmech.analyses.posembed`)."""

from __future__ import annotations

import os

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from posmech.plots import plain_log, save


def averaging_figure(df: pd.DataFrame, model: str, path: str | os.PathLike[str]) -> None:
    """P2: held-out loss vs k; P3: each prompt target's probability vs k.  When the model
    gives every target under 1 % even intact, the P3 panel says so in words (there is no
    repeat-copying to disturb) instead of drawing lines along zero."""
    fig, axes = plt.subplots(1, 2, figsize=(8.4, 3.6), layout="constrained")
    loss = df[df["quantity"] == "loss"].sort_values("k")
    ks = sorted(int(k) for k in df["k"].unique())
    axes[0].plot(loss["k"], loss["value"], marker="o")
    axes[0].set(xscale="log", xlabel="group size k (log scale, ticks at the k measured)",
                ylabel="next-token loss (nats / token)")
    plain_log(axes[0].xaxis, ks)
    axes[0].set_title("P2: held-out loss, W_pos averaged\nin groups of k", fontsize=9)
    probs = df[df["quantity"] == "probability"].assign(series=lambda d: d["prompt"] + " → " + d["target"])
    axes[1].set_title("P3: repeat-string prompt probabilities", fontsize=9)
    if len(probs) and float(probs["value"].max()) < 0.01:
        axes[1].axis("off")
        axes[1].text(0.5, 0.5, f"{model} gives every target < 1 %\n(max {probs['value'].max():.1e}) even with W_pos\n"
                     "intact: it does not continue the\nrepeat, so averaging has nothing to break",
                     ha="center", va="center", fontsize=9, transform=axes[1].transAxes)
    else:
        # distinct markers and dashes: series with equal values stay visible on top of each other
        markers, dashes = "osD^v<>p", ["-", "--", ":", "-."]
        for i, (series, g) in enumerate(probs.groupby("series", sort=False)):
            g = g.sort_values("k")
            axes[1].plot(g["k"], g["value"], marker=markers[i % len(markers)], ls=dashes[i % len(dashes)],
                         markersize=7 - 1.2 * (i % 4), markerfacecolor="none" if i % 2 else None, label=series,
                         color=f"C{i % 10}", lw=1.2)
        axes[1].set(xscale="log", ylim=(-0.02, 1.02), xlabel="group size k (log scale, ticks at the k measured)",
                    ylabel="probability (variants summed)")
        plain_log(axes[1].xaxis, ks)
        axes[1].legend(fontsize=7, title="prompt → target (markers differ:\nequal values overlap)",
                       title_fontsize=7)
    fig.suptitle(f"P2/P3 on {model}", fontsize=10)
    save(fig, path)


def attention_figure(panels: list[tuple[str, np.ndarray, np.ndarray]], start: int, k: int, model: str,
                     path: str | os.PathLike[str], max_heads: int = 4) -> None:
    """P4: for the first ``max_heads`` heads (the sharp head first), the window of its
    attention pattern intact and with W_pos averaged, two heads per row, one colour scale."""
    shown = panels[:max_heads]
    cols = 2 if len(shown) > 1 else 1
    rows = (len(shown) + cols - 1) // cols
    fig, axes = plt.subplots(rows, 2 * cols, figsize=(3.9 * cols + 0.7, 2.2 * rows + 0.8), squeeze=False,
                             layout="constrained")
    im = None
    for i, (head, intact, avg) in enumerate(shown):
        size = intact.shape[0]
        ticks = np.arange(0, size, max(1, size // 4))
        for j, (mat, label) in enumerate(((intact, "intact"), (avg, f"W_pos averaged, k={k}"))):
            ax = axes[i // cols, 2 * (i % cols) + j]
            im = ax.imshow(mat, cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
            ax.set_xticks(ticks, ticks + start, fontsize=7)
            ax.set_yticks(ticks, ticks + start, fontsize=7)
            ax.set_xlabel("key position", fontsize=7)
            ax.set_ylabel("query position", fontsize=7)
            ax.set_title(f"{head}: {label}", fontsize=8)
    for ax in axes.ravel()[2 * len(shown):]:
        ax.axis("off")
    fig.colorbar(im, ax=axes, shrink=min(0.9, 0.45 + 0.15 * rows), label="attention")
    more = f" (+{len(panels) - len(shown)} more heads in attention.h5)" if len(panels) > len(shown) else ""
    fig.suptitle(f"P4: attention of {model}'s chosen heads, positions {start}–{start + panels[0][1].shape[0] - 1}"
                 f"{more}", fontsize=9)
    save(fig, path)
