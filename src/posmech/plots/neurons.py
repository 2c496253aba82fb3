"""Figures of the contextual-neuron analyses (C2, C3; seed post 004)."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from posmech.plots import save
from posmech.plots.check import visible_token


def contributions_figure(df: pd.DataFrame, ranking: pd.DataFrame, title: str, path: str | os.PathLike[str]) -> None:
    """C2: one panel per neuron (two per row, 8 in wide), its top (right, blue) and bottom (left, red) contributing
    tokens as horizontal bars (the C2 table), the neuron's rank by explained variance in the
    panel title."""
    neurons = list(dict.fromkeys(df["neuron"]))
    k = int(df["rank"].max())
    cols = min(2, len(neurons))
    nrows = math.ceil(len(neurons) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(8, nrows * (0.17 * 2 * k + 1.3)), squeeze=False,
                             layout="constrained")
    for ax in axes.flat[len(neurons):]:
        ax.set_visible(False)
    rank = dict(zip(ranking["neuron"], ranking["rank"]))
    expl = dict(zip(ranking["neuron"], ranking["explained"]))
    for ax, j in zip(axes.flat, neurons):
        d = df[df["neuron"] == j]
        top = d[d["side"] == "top"].sort_values("rank")
        bot = d[d["side"] == "bottom"].sort_values("rank", ascending=False)
        rows = pd.concat([bot, top.iloc[::-1]])
        y = np.arange(len(rows))
        ax.barh(y, rows["contribution"], color=["C3" if v < 0 else "C0" for v in rows["contribution"]])
        ax.set_yticks(y, [visible_token(str(t)) for t in rows["token"]], fontsize=7)
        ax.set_ylabel("token (␣ space, ⏎ newline)", fontsize=8)
        ax.axvline(0, color="k", lw=0.6)
        ax.set_title(f"neuron {j}: rank {rank.get(j, '?')} of {len(ranking)}\n"
                     f"explained {expl.get(j, float('nan')):.2f}", fontsize=8)
        ax.set_xlabel("token contribution", fontsize=8)
        ax.tick_params(axis="x", labelsize=7)
    fig.suptitle(title, fontsize=9)
    save(fig, path)


def fit_figure(traces: Sequence[dict], title: str, path: str | os.PathLike[str], start: int = 0) -> None:
    """C3: rows = neurons, columns = texts; real ``blocks.0.mlp.hook_pre`` (black) and the
    bag-of-tokens approximation (orange) along the text, Pearson r and sign agreement in
    each panel (``traces``: dicts with neuron, text, real, approx, pearson_r, sign_agreement);
    positions before ``start`` (left out of the metrics) shaded."""
    neurons = list(dict.fromkeys(t["neuron"] for t in traces))
    texts = list(dict.fromkeys(t["text"] for t in traces))
    fig, axes = plt.subplots(len(neurons), len(texts), figsize=(8, 2.4 * len(neurons) + 0.6),
                             squeeze=False, sharex="col")
    for t in traces:
        ax = axes[neurons.index(t["neuron"]), texts.index(t["text"])]
        x = np.arange(len(t["real"]))
        ax.plot(x, t["real"], color="k", lw=0.8, label="actual")
        ax.plot(x, t["approx"], color="C1", lw=0.8, label="approximation")
        ax.axhline(0, color="0.7", lw=0.5)
        if start > 0:
            ax.axvspan(-0.5, start - 0.5, color="0.9", lw=0)
        ax.set_title(f"neuron {t['neuron']} · {t['text'][:30]}\nr = {t['pearson_r']:.2f}, "
                     f"sign agreement {t['sign_agreement']:.2f}", fontsize=7)
        ax.tick_params(labelsize=7)
        ax.set_ylabel("pre-activation", fontsize=7)
    axes[0, 0].legend(fontsize=7)
    for ax in axes[-1]:
        ax.set_xlabel("position", fontsize=8)
    fig.suptitle(title, fontsize=9)
    save(fig, path)
