"""Figures of the sinks family (S1-S4): each head's alpha[0] (Gu et al.'s mean attention on the
first token), the layers' mean alpha[k] over the first keys, ALiBi slopes against alpha[0], and
the residual stream's largest magnitudes over the median per layer."""

from __future__ import annotations

import os
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from posmech.plots import save

#: keys drawn in the alpha[k] panel: the first ones, where a sink shows
N_KEYS_SHOWN = 16


def _value(card: list[dict[str, Any]], quantity: str) -> str:
    for r in card:
        if r["quantity"] == quantity:
            return "n/m" if r["value"] is None else f"{r['value']:.3g}"
    return "—"


def sink_heads(heads: pd.DataFrame, alpha: np.ndarray, card: list[dict[str, Any]], title: str,
               path: str | os.PathLike[str] | None) -> None:
    """Left: mean alpha[0] per head (layer × head), each cell annotated with it; middle: the
    mean over heads and samples of alpha[k] for the first keys, one line per layer; right
    (ALiBi only): each head's mean alpha[0] against its slope."""
    L, H = int(heads["layer"].max()) + 1, int(heads["head"].max()) + 1
    M = np.full((L, H), np.nan)
    M[heads["layer"].to_numpy(int), heads["head"].to_numpy(int)] = heads["alpha0_mean"].to_numpy(float)
    alibi = heads["slope"].notna().any()
    fig, axes = plt.subplots(1, 3 if alibi else 2, figsize=(12 if alibi else 10, 3.6),
                             gridspec_kw={"wspace": 0.45})
    ax = axes[0]
    im = ax.imshow(M, vmin=0, vmax=1, cmap="viridis", aspect="auto", interpolation="nearest")
    if L * H <= 64:
        for l in range(L):
            for h in range(H):
                ax.text(h, l, f"{M[l, h]:.2f}", ha="center", va="center", fontsize=8,
                        color="black" if M[l, h] > 0.6 else "white")
    ax.set(xlabel="head", ylabel="layer", title=f"mean alpha[0]; sink ratio {_value(card, 'sink_ratio')}, "
                                                   f"layers 0-1 {_value(card, 'early_sink_ratio')}")
    ax.set_xticks(range(H))
    ax.set_yticks(range(L))
    ax.title.set_fontsize(8)
    fig.colorbar(im, ax=ax).set_label("alpha[0]")
    ax = axes[1]
    n = min(N_KEYS_SHOWN, alpha.shape[-1])
    for l in range(alpha.shape[0]):
        ax.plot(np.arange(n), alpha[l, :, :n].mean(0), marker="o", ms=3, label=f"layer {l}")
    ax.set(xlabel="key position k", ylabel="mean alpha[k]", title="first keys (mean over heads and samples)")
    ax.title.set_fontsize(8)
    ax.legend(fontsize=8)
    if alibi:
        ax = axes[2]
        ax.scatter(np.log2(heads["slope"].astype(float)), heads["alpha0_mean"], c=heads["layer"], cmap="viridis",
                   s=18)
        ax.set(xlabel="log2 of the ALiBi slope (right: steeper)", ylabel="mean alpha[0]",
               title=f"first-token share {_value(card, 'first_token_head_share')}, "
                     f"Spearman {_value(card, 'alpha0_slope_spearman')}")
        ax.title.set_fontsize(8)
    fig.suptitle(title, fontsize=9)
    save(fig, path)


def massive_activations(acts: pd.DataFrame, summary: pd.DataFrame, title: str,
                        path: str | os.PathLike[str] | None) -> None:
    """Left: each sample's max |h| / median |h| per layer (dots) and their median (line), log
    scale; right: per layer, the share of samples whose largest magnitude is on token 0 and the
    share held by the layer's most frequent top dimension (named on the bar)."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.4))
    rated = acts.dropna(subset=["ratio"])
    a.scatter(rated["layer"], rated["ratio"], s=6, alpha=0.4, label="one sample")
    s = summary.dropna(subset=["ratio_median"])
    a.plot(s["layer"], s["ratio_median"], marker="o", color="tab:red", label="median over samples")
    if rated["ratio"].max() >= 100 * rated["ratio"].min():  # two decades or more: a log scale
        a.set_yscale("log")
    a.set(xlabel="layer", ylabel="max |h| / median |h|", title="residual stream after each block")
    a.set_xticks(summary["layer"].to_numpy(int))
    a.title.set_fontsize(8)
    a.legend(fontsize=7)
    x = summary["layer"].to_numpy(int)
    b.bar(x - 0.2, summary["first_token_share"], width=0.4, label="top on token 0")
    b.bar(x + 0.2, summary["top_dim_share"], width=0.4, label="top in the layer's top dimension")
    for xi, d, v in zip(x, summary["top_dim"], summary["top_dim_share"]):
        b.text(xi + 0.2, float(v) + 0.02, f"d{int(d)}", ha="center", fontsize=7)
    b.set(xlabel="layer", ylabel="share of samples", ylim=(0, 1.15), title="where the largest |h| sits")
    b.set_xticks(x)
    b.title.set_fontsize(8)
    b.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    save(fig, path)
