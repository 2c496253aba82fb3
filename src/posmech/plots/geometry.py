"""Figures of the positional geometry (P1, P8–P11): helices, three-panel comparison,
explained variance, canonical angles, sparsity, agreement.  Each takes arrays or tidy
tables and writes one PNG (150 dpi) with the claim ID in the title."""

from __future__ import annotations

import math
import os

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import MaxNLocator

from posmech.plots import DEEP, category_markers, lines_by, readable_log, save

Path_ = str | os.PathLike[str]


def _scatter3(ax: plt.Axes, P: np.ndarray, c: np.ndarray | str, title: str, s: float = 6, **kw: object) -> object:
    ax.plot(P[:, 0], P[:, 1], P[:, 2], lw=0.4, color="0.6" if not isinstance(c, str) else c, alpha=0.6)
    sc = ax.scatter(P[:, 0], P[:, 1], P[:, 2], c=c, s=s, depthshade=False, **kw)
    ax.set_xlabel("PC1", fontsize=8, labelpad=-2)
    ax.set_ylabel("PC2", fontsize=8, labelpad=-2)
    ax.set_zlabel("PC3", fontsize=8, labelpad=-2)
    ax.tick_params(labelsize=6, pad=0)
    # shrink the cube inside its box so the axis labels (PC3 above all) stay inside the figure
    ax.set_box_aspect(None, zoom=0.82)
    ax.set_title(title, fontsize=9)
    return sc


def helix(P: np.ndarray, positions: np.ndarray, title: str, path: Path_) -> None:
    """One 3-D scatter of ``P [n, 3]`` (top-3 principal-component coordinates) coloured by
    position; the colorbar sits clear of the PC3 axis label."""
    fig = plt.figure(figsize=(6.4, 5))
    ax = fig.add_subplot(projection="3d")
    sc = _scatter3(ax, P, positions, title, cmap="viridis")
    fig.colorbar(sc, ax=ax, shrink=0.6, pad=0.1, label="position")
    save(fig, path)


def helix_grid(panels: list[tuple[str, np.ndarray]], positions: np.ndarray, title: str, path: Path_) -> None:
    """A grid of 3-D helices, one per ``(label, P [n, 3])``, all coloured by position, with
    one colorbar to the right of the grid."""
    n = len(panels)
    cols = min(3, n)
    rows = math.ceil(n / cols)
    height = 2.6 * rows + 0.8
    fig = plt.figure(figsize=(2.6 * cols + 0.8, height))
    grid = fig.add_gridspec(rows, cols + 1, width_ratios=[1] * cols + [0.06], wspace=0.15, hspace=0.25,
                            top=1 - 0.85 / height, bottom=0.2 / height, left=0.02, right=0.93)
    sc = None
    for i, (label, P) in enumerate(panels):
        ax = fig.add_subplot(grid[i // cols, i % cols], projection="3d")
        sc = _scatter3(ax, P, positions, label, s=3, cmap="viridis")
    if sc is not None:
        cax = fig.add_subplot(grid[:, -1])
        fig.colorbar(sc, cax=cax, label="position")
        pos = cax.get_position()
        cax.set_position([pos.x0, pos.y0 + pos.height * 0.2, pos.width, pos.height * 0.6])
    fig.suptitle(title, fontsize=10)
    save(fig, path)


def comparison(panels: list[tuple[str, np.ndarray, np.ndarray]], labels: tuple[str, str], title: str, path: Path_) -> None:
    """P10's three panels: for each ``(basis name, A [n, 3], B [n, 3])`` both matrices
    projected on that basis; ``A`` (extended) in red, ``B`` (W_pos) in blue."""
    fig = plt.figure(figsize=(9.6, 3.7))
    for i, (basis, A, B) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1, projection="3d")
        _scatter3(ax, A, "tab:red", f"basis: {basis}", s=3, label=labels[0])
        ax.scatter(B[:, 0], B[:, 1], B[:, 2], c="tab:blue", s=3, depthshade=False, label=labels[1])
        if i == 0:
            ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(title, fontsize=10)
    save(fig, path)


def merged_curves(table: pd.DataFrame, key: str, x: str, y: str, atol: float = 1e-9) -> pd.DataFrame:
    """``table`` with curves (rows grouped by ``key``) that are identical merged into one whose
    ``key`` joins their labels with " = " (e.g. ``W_pos = layer 0``): a curve drawn exactly on
    top of another hides it."""
    curves: list[tuple[list[str], pd.DataFrame]] = []
    for label, g in table.groupby(key, sort=False):
        g = g.sort_values(x)
        for labels, h in curves:
            if len(h) == len(g) and np.allclose(h[y].to_numpy(), g[y].to_numpy(), rtol=0, atol=atol) \
                    and (h[x].to_numpy() == g[x].to_numpy()).all():
                labels.append(str(label))
                break
        else:
            curves.append(([str(label)], g))
    return pd.concat([g.assign(**{key: " = ".join(labels)}) for labels, g in curves], ignore_index=True)


def explained_variance(table: pd.DataFrame, title: str, path: Path_) -> None:
    """Explained-variance ratio of the top components, one line per matrix (``pca_table``);
    matrices with the same spectrum (layer 0 is W_pos) share one labelled line."""
    df = table.assign(matrix_label=np.where(table["layer"] < 0, "W_pos", "layer " + table["layer"].astype(str)))
    df = merged_curves(df, "matrix_label", "component", "explained_variance_ratio", atol=1e-9)
    labels = list(dict.fromkeys(df["matrix_label"]))
    fig, ax = plt.subplots(figsize=(6.5, 4))
    lines_by(ax, df, "component", "explained_variance_ratio", "matrix_label", labels,
             markers=category_markers(len(labels)))
    ax.set_yscale("log")
    readable_log(ax.yaxis)
    ax.set_ylabel("explained variance ratio")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(fontsize=7, title=None, ncol=2)
    ax.set_title(title, fontsize=9)
    save(fig, path)


def angles(table: pd.DataFrame, title: str, path: Path_) -> None:
    """Canonical angles (degrees) per layer, one line per angle index (``angles_table``);
    layers whose angles are undefined are shaded and labelled."""
    fig, ax = plt.subplots(figsize=(6.5, 4))
    levels = sorted(table["angle_index"].unique())
    lines_by(ax, table, "layer", "angle_deg", "angle_index", levels, colours=list(DEEP))
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
    lines_by(ax, long, "layer", "cosine", "statistic")
    ax.set_xlabel("layer (resid_pre; last = final residual)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(min(0.0, float(long["cosine"].min()) - 0.05), 1.05)
    ax.set_title(title, fontsize=9)
    save(fig, path)
