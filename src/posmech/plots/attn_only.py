"""Figures of the attention-only family (L1-L5), in the style of the 001 post: mean attention
heatmaps over random-token sequences (BOS + 12 tokens), and score / pattern curves at one
query with three lines — position only (red), token only (green), both (blue)."""

from __future__ import annotations

import os
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from posmech.plots import MASKED, save

COLORS = {"position_only": "tab:red", "token_only": "tab:green", "both": "tab:blue"}
LABELS = {"position_only": "position only", "token_only": "token only", "both": "both (normal)"}


def _heatmap(ax: Any, M: np.ndarray, title: str, bos: bool) -> Any:
    """``M`` (attention, 0-1) in percent; cells of at least 5 % carry their value rounded to
    a whole percent; masked cells (key after query, or NaN) grey."""
    T = M.shape[0]
    P = np.where(np.triu(np.ones((T, T), dtype=bool), 1), np.nan, np.asarray(M, dtype=float)) * 100
    cmap = plt.get_cmap("viridis").with_extremes(bad=MASKED)
    im = ax.imshow(P, vmin=0, vmax=100, cmap=cmap, interpolation="nearest")
    ticks = list(range(T))
    names = ["BOS" if (bos and i == 0) else str(i) for i in ticks]
    ax.set_xticks(ticks, names, fontsize=6, rotation=90)
    ax.set_yticks(ticks, names, fontsize=6)
    for q in range(T):
        for k in range(q + 1):
            v = P[q, k]
            if v >= 5:
                ax.text(k, q, f"{v:.0f}", ha="center", va="center", fontsize=6,
                        color="black" if v > 60 else "white")
    ax.set_xlabel("key position", fontsize=7)
    ax.set_ylabel("query position", fontsize=7)
    ax.set_title(title, fontsize=8)
    return im


def random_token_patterns(mats: dict[str, np.ndarray], roles: dict[str, str], masses: dict[str, dict[str, float]],
                          model: str, n: int, bos: bool, path: str | os.PathLike[str]) -> None:
    """L1 (the post's Figures 1 and 6): mean pattern of the previous-token and the
    look-back-two head over ``n`` random-token sequences; titles carry the masses."""
    fig, axes = plt.subplots(1, len(mats), figsize=(3.6 * len(mats) + 0.6, 3.9), squeeze=False,
                             layout="constrained")
    im = None
    for ax, (role, M) in zip(axes[0], mats.items()):
        m = masses[role]
        parts = [f"{k.replace('offset_', '−')} {v:.3f}" for k, v in m.items() if k != "induction_score"]
        sub = ", ".join(parts[:3]) + ("\n" + ", ".join(parts[3:]) if parts[3:] else "")
        im = _heatmap(ax, M, f"{role.replace('_', '-')} head {roles[role]}\n{sub}", bos)
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label="mean attention, % (mean of softmaxes)")
    fig.suptitle(f"L1 · {model}: mean attention patterns over {n} random-token sequences\n"
                 "(cells: mean attention in whole %, shown from 5 %; grey: masked, a key after its query)", fontsize=9)
    save(fig, path)


def decomposition_curves(df: pd.DataFrame, head: str, role: str, claim: str, query: int, model: str,
                         bos: bool, path: str | os.PathLike[str]) -> None:
    """L2 / L5 (the post's Figures 2-3 and 7-8): scores (left) and patterns (right) of ``head``
    at ``query`` for every key ``<= query`` under the three inputs (mean over sequences;
    shaded: ± one sd of the score)."""
    d = df[(df["head_name"] == head) & (df["query"] == query)]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(7.8, 3.3), layout="constrained")
    for v, color in COLORS.items():
        g = d[d["variant"] == v].sort_values("key")
        a1.plot(g["key"], g["score_mean"], "o-", color=color, label=LABELS[v], markersize=3)
        a1.fill_between(g["key"], g["score_mean"] - g["score_sd"], g["score_mean"] + g["score_sd"], color=color,
                        alpha=0.15, linewidth=0)
        a2.plot(g["key"], g["pattern_mean"], "o-", color=color, label=LABELS[v], markersize=3)
    keys = list(range(query + 1))
    names = ["BOS" if (bos and k == 0) else str(k) for k in keys]
    for ax, lab in ((a1, "attention score (pre-softmax)"), (a2, "attention (mean of softmaxes)")):
        ax.set_xticks(keys, names, fontsize=7)
        ax.set_xlabel(f"key position (query {query})", fontsize=8)
        ax.set_ylabel(lab, fontsize=8)
        ax.grid(alpha=0.3)
    a2.set_ylim(-0.02, 1.02)
    a1.legend(fontsize=7)
    n = int(d["n_sequences"].max()) if len(d) else 0
    fig.suptitle(f"{claim} · {model} {role.replace('_', '-')} head {head}: scores and patterns at query {query} "
                 f"({n} random-token sequences)", fontsize=9)
    save(fig, path)


def position_only_pattern(M: np.ndarray, head: str, model: str, bos: bool, path: str | os.PathLike[str],
                          how: str = "token embeddings zeroed") -> None:
    """L3 (the post's Figure 4): the previous-token head's pattern with position-only input
    (``how``: the input in words, per position scheme)."""
    fig, ax = plt.subplots(figsize=(5.0, 4.4), layout="constrained")
    im = _heatmap(ax, M, f"row 1: [{M[1, 0]:.4f}, {M[1, 1]:.4f}];  min over q ≥ 2 of P[q, q−1]: "
                  f"{min(M[q, q - 1] for q in range(2, M.shape[0])):.4f}", bos)
    fig.colorbar(im, ax=ax, shrink=0.8, label="attention, %")
    fig.suptitle(f"L3 · {model} {head}: position-only pattern ({how})\n"
                 "(cells: attention in whole %, shown from 5 %; grey: masked, a key after its query)", fontsize=9)
    save(fig, path)


def bos_induction(df: pd.DataFrame, head: str, model: str, path: str | os.PathLike[str]) -> None:
    """L4 (the post's Figure 5): the induction head's attention row at the final [A] with and
    without BOS (mean over samples; bars ± sd), P([B]) in the panel titles."""
    conds = [("with_bos", "[BOS] A B R1..R7 A"), ("without_bos", "A B R1..R7 A (A at position 0)")]
    fig, axes = plt.subplots(1, 2, figsize=(7.8, 3.4), layout="constrained", sharey=True)
    for ax, (c, title) in zip(axes, conds):
        g = df[(df["condition"] == c) & (df["quantity"] == "attention")].sort_values("key_position")
        pb = df[(df["condition"] == c) & (df["quantity"] == "p_B")]["value"].iloc[0]
        ax.bar(g["key_position"], g["value"], yerr=g["sd"], color="tab:blue", capsize=2, error_kw={"lw": 0.6})
        ax.set_xticks(g["key_position"], g["key_label"], fontsize=7, rotation=45)
        ax.set_xlabel("key (the token at that position)", fontsize=8)
        ax.set_ylim(0, 1)
        ax.set_ylabel("attention at the final [A]", fontsize=8)
        ax.set_title(f"{title}\nP([B]) = {pb:.3g}", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    n = int(df["n_samples"].max())
    fig.suptitle(f"L4 · {model} induction head {head}: attention row at the last query ({n} samples)", fontsize=9)
    save(fig, path)
