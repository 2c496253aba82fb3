"""Figures of the diagonal taxonomy (P6, P7)."""

from __future__ import annotations

import os
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from posmech.plots import heatmap, save


ROLE_COLOURS = {"sharp": "tab:red", "early": "tab:orange", "": "tab:blue"}
ROLE_LABELS = {"sharp": "sharp (chosen)", "early": "early (chosen)", "": "other previous-token head"}


def taxonomy_figure(per_head: pd.DataFrame, chosen: pd.DataFrame, meta: dict[str, Any], model: str,
                    path: str | os.PathLike[str], top_n: int = 20) -> None:
    """Three panels, 8 in wide so the report shows them at full size: the P7 ratio on the
    layer × head grid (previous-token heads only) and offset-1 mean vs TransformerLens's
    head_detector (black: previous-token heads, grey: the others) across the top; below,
    across the width, the ranking of the sharpest heads (colours in its legend)."""
    L, H = int(per_head["layer"].max()) + 1, int(per_head["head"].max()) + 1
    grid = np.full((L, H), np.nan)
    for r in per_head[per_head["is_previous_token"]].itertuples():
        grid[r.layer, r.head] = r.ratio
    ranked = per_head[per_head["rank"].notna()].sort_values("rank").head(top_n)
    top_h = min(4.2, max(2.6, 0.3 * L + 1.4))
    rank_h = max(1.6, 0.2 * len(ranked) + 1.0)
    fig = plt.figure(figsize=(8, top_h + rank_h + 0.6), layout="constrained")
    gs = fig.add_gridspec(2, 2, height_ratios=[top_h, rank_h], width_ratios=[1, 1])
    ax0, ax2, ax1 = fig.add_subplot(gs[0, 0]), fig.add_subplot(gs[0, 1]), fig.add_subplot(gs[1, :])
    heatmap(ax0, grid, cmap="viridis_r", vmin=0, vmax=1, annot=grid if H <= 12 else None, fmt=".2f",
            annot_size=6 if H > 6 else 7, cbar_label="second / largest\nmean diagonal", cbar_shrink=0.9,
            linewidths=0.3, linecolor="white")
    ax0.set_facecolor("0.85")
    ax0.set(xlabel="head", ylabel="layer")
    ax0.set_title(f"P6: {meta['n_previous_token_heads']} of {len(per_head)} heads peak at offset −1\n"
                  "(colour: P7 ratio; grey: not previous-token)", fontsize=8)
    role = dict(zip(chosen["head_name"], chosen["role"]))
    if len(ranked):
        kinds = [role.get(h, "") if role.get(h, "") in ROLE_COLOURS else "" for h in ranked["head_name"]]
        ax1.barh(ranked["head_name"], ranked["ratio"], color=[ROLE_COLOURS[k] for k in kinds])
        ax1.invert_yaxis()
        for y, v in enumerate(ranked["ratio"]):
            ax1.text(v, y, f" {v:.2f}", va="center", fontsize=7)
        ax1.set_xlim(0, 1.45)  # room on the right for the legend
        ax1.tick_params(axis="y", labelsize=7)
        ax1.set_ylabel("head", fontsize=8)
        handles = [plt.Rectangle((0, 0), 1, 1, color=ROLE_COLOURS[k]) for k in ROLE_COLOURS if k in kinds]
        ax1.legend(handles, [ROLE_LABELS[k] for k in ROLE_COLOURS if k in kinds], fontsize=7, loc="center right")
    else:
        ax1.axis("off")
        ax1.text(0.5, 0.5, "no head of this model attends most\nto the previous position:\nnothing to rank",
                 ha="center", va="center", fontsize=9, transform=ax1.transAxes)
    ax1.set_xlabel("second / largest mean diagonal (lower = sharper)", fontsize=8)
    ax1.set_title(f"P7 ranking of the previous-token heads (sharpest {len(ranked)})", fontsize=9)
    for is_prev, colour, label in ((False, "0.6", "other heads"), (True, "black", "previous-token heads (P6)")):
        sub = per_head[per_head["is_previous_token"] == is_prev]
        ax2.scatter(sub["prev_token_mass"], sub["head_detector_score"], s=16, color=colour, label=label,
                    marker="o" if is_prev else "x")
    rho = meta.get("spearman_ratio_vs_head_detector")
    ax2.set_xlabel("mean attention on offset −1", fontsize=8)
    ax2.set_ylabel("head_detector score", fontsize=8)
    ax2.tick_params(labelsize=7)
    ax2.legend(fontsize=7)
    ax2.set_title(f"offset −1 vs head_detector; Spearman(−ratio,\ndetector) over P6 heads: "
                  f"{'n/a' if rho is None else f'{rho:.2f}'}", fontsize=8)
    fig.suptitle(f"P6/P7 diagonal taxonomy of {model} ({meta['n_documents']} documents)", fontsize=10)
    save(fig, path)
