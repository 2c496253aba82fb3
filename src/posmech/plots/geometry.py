"""Figures of the positional geometry (P1, P8–P11): helices, three-panel comparison,
explained variance, canonical angles, sparsity, agreement.  Each takes arrays or tidy
tables and writes one PNG (150 dpi) with the claim ID in the title."""

from __future__ import annotations

import math
import os

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.ticker import MaxNLocator

from posmech.plots import save

Path_ = str | os.PathLike[str]


def _scatter3(ax: plt.Axes, P: np.ndarray, c: np.ndarray | str, title: str, s: float = 6, **kw: object) -> object:
    ax.plot(P[:, 0], P[:, 1], P[:, 2], lw=0.4, color="0.6" if not isinstance(c, str) else c, alpha=0.6)
    sc = ax.scatter(P[:, 0], P[:, 1], P[:, 2], c=c, s=s, depthshade=False, **kw)
    ax.set_xlabel("PC1", fontsize=7)
    ax.set_ylabel("PC2", fontsize=7)
    ax.set_zlabel("PC3", fontsize=7)
    ax.tick_params(labelsize=6)
    ax.set_title(title, fontsize=8)
    return sc


def helix(P: np.ndarray, positions: np.ndarray, title: str, path: Path_) -> None:
    """One 3-D scatter of ``P [n, 3]`` (top-3 principal-component coordinates) coloured by position."""
    fig = plt.figure(figsize=(6, 5))
    ax = fig.add_subplot(projection="3d")
    sc = _scatter3(ax, P, positions, title, cmap="viridis")
    fig.colorbar(sc, ax=ax, shrink=0.6, label="position")
    save(fig, path)


def helix_grid(panels: list[tuple[str, np.ndarray]], positions: np.ndarray, title: str, path: Path_) -> None:
    """A grid of 3-D helices, one per ``(label, P [n, 3])``, all coloured by position."""
    n = len(panels)
    cols = min(4, n)
    rows = math.ceil(n / cols)
    fig = plt.figure(figsize=(3.6 * cols, 3.3 * rows))
    sc = None
    for i, (label, P) in enumerate(panels):
        ax = fig.add_subplot(rows, cols, i + 1, projection="3d")
        sc = _scatter3(ax, P, positions, label, s=3, cmap="viridis")
    if sc is not None:
        fig.colorbar(sc, ax=fig.axes, shrink=0.5, label="position")
    fig.suptitle(title, fontsize=10)
    save(fig, path)


def comparison(panels: list[tuple[str, np.ndarray, np.ndarray]], labels: tuple[str, str], title: str, path: Path_) -> None:
    """P10's three panels: for each ``(basis name, A [n, 3], B [n, 3])`` both matrices
    projected on that basis; ``A`` (extended) in red, ``B`` (W_pos) in blue."""
    fig = plt.figure(figsize=(14, 4.6))
    for i, (basis, A, B) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1, projection="3d")
        _scatter3(ax, A, "tab:red", f"basis: {basis}", s=3, label=labels[0])
        ax.scatter(B[:, 0], B[:, 1], B[:, 2], c="tab:blue", s=3, depthshade=False, label=labels[1])
        if i == 0:
            ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(title, fontsize=10)
    save(fig, path)


def explained_variance(table: pd.DataFrame, title: str, path: Path_) -> None:
    """Explained-variance ratio of the top components, one line per matrix (``pca_table``)."""
    df = table.assign(matrix_label=np.where(table["layer"] < 0, "W_pos", "layer " + table["layer"].astype(str)))
    fig, ax = plt.subplots(figsize=(6.5, 4))
    sns.lineplot(data=df, x="component", y="explained_variance_ratio", hue="matrix_label", marker="o", ax=ax)
    ax.set_yscale("log")
    ax.set_ylabel("explained variance ratio")
    ax.legend(fontsize=7, title=None, ncol=2)
    ax.set_title(title, fontsize=9)
    save(fig, path)


def angles(table: pd.DataFrame, title: str, path: Path_) -> None:
    """Canonical angles (degrees) per layer, one line per angle index (``angles_table``);
    layers whose angles are undefined are shaded and labelled."""
    fig, ax = plt.subplots(figsize=(6.5, 4))
    sns.lineplot(data=table, x="layer", y="angle_deg", hue="angle_index", marker="o", palette="deep", ax=ax)
    ax.set_ylabel("canonical angle to W_pos (degrees)")
    ax.set_xlabel("layer (resid_pre; last = final residual)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(0, 90)
    if "defined" in table:  # layers whose top-k subspace has no spectral gap: no angles to draw
        for layer in table.loc[~table["defined"].astype(bool), "layer"].unique():
            ax.axvspan(layer - 0.4, layer + 0.4, color="0.9", zorder=0)
            ax.text(layer, 45, "undefined (no spectral gap)", rotation=90, ha="center", va="center", fontsize=7)
    ax.set_title(title, fontsize=9)
    save(fig, path)


def sparsity(table: pd.DataFrame, title: str, path: Path_) -> None:
    """Fraction of far-from-zero entries per layer, W_pos as a dashed line (``sparsity_table``)."""
    ext = table[table["matrix"] == "extended"]
    w = float(table.loc[table["matrix"] == "W_pos", "frac_far"].iloc[0])
    fig, ax = plt.subplots(figsize=(6.5, 4))
    ax.plot(ext["layer"], ext["frac_far"], "o-", label="extended (W_pos-scale threshold)")
    ax.plot(ext["layer"], ext["frac_far_own_scale"], "s--", alpha=0.7, label="extended (own-scale threshold)")
    ax.axhline(w, color="k", ls=":", label="W_pos")
    ax.set_xlabel("layer (resid_pre; last = final residual)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("fraction of entries far from 0")
    ax.legend(fontsize=7)
    ax.set_title(title, fontsize=9)
    save(fig, path)


def agreement(table: pd.DataFrame, title: str, path: Path_) -> None:
    """Agreement of per-token extended embeddings with their average, per layer."""
    long = table.melt(
        id_vars=["layer"], value_vars=["mean_cosine_to_average", "mean_pairwise_cosine"],
        var_name="statistic", value_name="cosine",
    )
    fig, ax = plt.subplots(figsize=(6.5, 4))
    sns.lineplot(data=long, x="layer", y="cosine", hue="statistic", marker="o", ax=ax)
    ax.set_xlabel("layer (resid_pre; last = final residual)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(min(0.0, float(long["cosine"].min()) - 0.05), 1.05)
    ax.set_title(title, fontsize=9)
    save(fig, path)
