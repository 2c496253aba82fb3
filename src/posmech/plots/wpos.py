"""Figures of the W_pos interventions (P2–P4; :mod:`posmech.analyses.wpos`)."""

from __future__ import annotations

import os

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from posmech.plots import save


def averaging_figure(df: pd.DataFrame, model: str, path: str | os.PathLike[str]) -> None:
    """P2: held-out loss vs k; P3: each prompt target's probability vs k."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    loss = df[df["quantity"] == "loss"]
    axes[0].plot(loss["k"], loss["value"], marker="o")
    axes[0].set(xscale="log", xlabel="group size k", ylabel="next-token loss (nats / token)",
                title="P2: held-out loss with W_pos averaged in groups of k")
    probs = df[df["quantity"] == "probability"].assign(series=lambda d: d["prompt"] + " → " + d["target"])
    sns.lineplot(data=probs, x="k", y="value", hue="series", marker="o", ax=axes[1])
    axes[1].set(xscale="log", ylim=(-0.02, 1.02), xlabel="group size k", ylabel="probability (variants summed)",
                title="P3: repeat-string prompt probabilities")
    fig.suptitle(f"P2/P3 on {model}")
    fig.tight_layout()
    save(fig, path)


def attention_figure(panels: list[tuple[str, np.ndarray, np.ndarray]], start: int, k: int, model: str,
                     path: str | os.PathLike[str]) -> None:
    """P4: per head (rows), the window of its attention pattern intact and with W_pos averaged."""
    fig, axes = plt.subplots(len(panels), 2, figsize=(9, 4.2 * len(panels)), squeeze=False)
    for row, (head, intact, avg) in enumerate(panels):
        size = intact.shape[0]
        ticks = np.arange(0, size, max(1, size // 5))
        for col, (mat, label) in enumerate(((intact, "intact"), (avg, f"W_pos averaged, k={k}"))):
            ax = axes[row, col]
            ax.imshow(mat, cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
            ax.set_xticks(ticks, ticks + start)
            ax.set_yticks(ticks, ticks + start)
            ax.set(xlabel="key position", ylabel="query position", title=f"{head}: {label}")
    fig.suptitle(f"P4: attention of {model}'s chosen heads, positions {start}–{start + panels[0][1].shape[0] - 1}")
    fig.tight_layout()
    save(fig, path)
