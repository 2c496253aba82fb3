"""Figures of the diagonal taxonomy (P6, P7)."""

from __future__ import annotations

import os
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from posmech.plots import save


def taxonomy_figure(per_head: pd.DataFrame, chosen: pd.DataFrame, meta: dict[str, Any], model: str,
                    path: str | os.PathLike[str], top_n: int = 20) -> None:
    """Three panels: P7 ratio on the layer × head grid (previous-token heads only), the
    ranking of the sharpest heads, and offset-1 mean vs TransformerLens's head_detector."""
    L, H = int(per_head["layer"].max()) + 1, int(per_head["head_index"].max()) + 1
    grid = np.full((L, H), np.nan)
    for r in per_head[per_head["is_previous_token"]].itertuples():
        grid[r.layer, r.head_index] = r.ratio
    fig, axes = plt.subplots(1, 3, figsize=(16, max(4.0, 0.35 * L + 2)))
    sns.heatmap(grid, ax=axes[0], cmap="viridis_r", vmin=0, vmax=1, annot=H <= 16, fmt=".2f",
                annot_kws={"fontsize": 6}, cbar_kws={"label": "second / largest mean diagonal"},
                linewidths=0.3, linecolor="white")
    axes[0].set_facecolor("0.85")
    axes[0].set(xlabel="head", ylabel="layer", title=f"P6: {meta['n_previous_token_heads']} of {len(per_head)} heads "
                "peak at offset −1 (grey: not previous-token)")
    role = dict(zip(chosen["head"], chosen["role"]))
    ranked = per_head[per_head["rank"].notna()].sort_values("rank").head(top_n)
    colors = [{"sharp": "tab:red", "early": "tab:orange"}.get(role.get(h, ""), "tab:blue") for h in ranked["head"]]
    axes[1].barh(ranked["head"], ranked["ratio"], color=colors)
    axes[1].invert_yaxis()
    axes[1].set(xlabel="second / largest mean diagonal (lower = sharper)",
                title="P7 ranking (red: sharp, orange: early)")
    for y, v in enumerate(ranked["ratio"]):
        axes[1].text(v, y, f" {v:.2f}", va="center", fontsize=7)
    sns.scatterplot(data=per_head, x="prev_token_mass", y="head_detector_score", hue="is_previous_token",
                    ax=axes[2], s=25)
    rho = meta.get("spearman_ratio_vs_head_detector")
    axes[2].set(xlabel="mean attention on offset −1", ylabel="TransformerLens head_detector score",
                title=f"Spearman(−ratio, head_detector) over P6 heads: {'n/a' if rho is None else f'{rho:.2f}'}")
    fig.suptitle(f"P6/P7 diagonal taxonomy of {model} ({meta['n_documents']} documents)")
    fig.tight_layout()
    save(fig, path)
