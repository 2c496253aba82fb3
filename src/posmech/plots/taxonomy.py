"""Figures of the diagonal taxonomy (P6, P7)."""

from __future__ import annotations

import os
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from posmech.plots import save, sns


def taxonomy_figure(per_head: pd.DataFrame, chosen: pd.DataFrame, meta: dict[str, Any], model: str,
                    path: str | os.PathLike[str], top_n: int = 20) -> None:
    """Three panels, 8 in wide so the report shows them at full size: the P7 ratio on the
    layer × head grid (previous-token heads only) across the top; below, the ranking of the
    sharpest heads and offset-1 mean vs TransformerLens's head_detector."""
    L, H = int(per_head["layer"].max()) + 1, int(per_head["head_index"].max()) + 1
    grid = np.full((L, H), np.nan)
    for r in per_head[per_head["is_previous_token"]].itertuples():
        grid[r.layer, r.head_index] = r.ratio
    ranked = per_head[per_head["rank"].notna()].sort_values("rank").head(top_n)
    grid_h = min(5.0, 0.32 * L + 1.2)
    rank_h = max(2.6, 0.2 * len(ranked) + 1.0)
    fig = plt.figure(figsize=(8, grid_h + rank_h + 0.6), layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=[grid_h, rank_h])
    ax0 = top.subplots()
    sns.heatmap(grid, ax=ax0, cmap="viridis_r", vmin=0, vmax=1, annot=H <= 16, fmt=".2f",
                annot_kws={"fontsize": 7}, cbar_kws={"label": "second / largest\nmean diagonal", "shrink": 0.9},
                linewidths=0.3, linecolor="white", square=H <= 16)
    ax0.set_facecolor("0.85")
    ax0.set(xlabel="head", ylabel="layer")
    ax0.set_title(f"P6: {meta['n_previous_token_heads']} of {len(per_head)} heads peak at offset −1 "
                  "(coloured by their P7 ratio; grey: not previous-token)", fontsize=9)
    ax1, ax2 = bottom.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.1]})
    role = dict(zip(chosen["head"], chosen["role"]))
    if len(ranked):
        colors = [{"sharp": "tab:red", "early": "tab:orange"}.get(role.get(h, ""), "tab:blue") for h in ranked["head"]]
        ax1.barh(ranked["head"], ranked["ratio"], color=colors)
        ax1.invert_yaxis()
        for y, v in enumerate(ranked["ratio"]):
            ax1.text(v, y, f" {v:.2f}", va="center", fontsize=7)
        ax1.set_xlim(0, 1.15)
        ax1.tick_params(axis="y", labelsize=7)
    else:
        ax1.axis("off")
        ax1.text(0.5, 0.5, "no head of this model attends most\nto the previous position:\nnothing to rank",
                 ha="center", va="center", fontsize=9, transform=ax1.transAxes)
    ax1.set_xlabel("second / largest mean diagonal\n(lower = sharper)", fontsize=8)
    ax1.set_title("P7 ranking (red: sharp, orange: early)", fontsize=9)
    sns.scatterplot(data=per_head, x="prev_token_mass", y="head_detector_score", hue="is_previous_token",
                    ax=ax2, s=20)
    rho = meta.get("spearman_ratio_vs_head_detector")
    ax2.set_xlabel("mean attention on offset −1", fontsize=8)
    ax2.set_ylabel("head_detector score", fontsize=8)
    ax2.legend(title="previous-token head", fontsize=7, title_fontsize=7)
    ax2.set_title(f"Spearman(−ratio, detector), P6 heads: {'n/a' if rho is None else f'{rho:.2f}'}", fontsize=9)
    fig.suptitle(f"P6/P7 diagonal taxonomy of {model} ({meta['n_documents']} documents)", fontsize=10)
    save(fig, path)
