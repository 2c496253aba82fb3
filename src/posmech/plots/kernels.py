"""Figures of positional kernels and Effective Token Count (K2, K4, K5)."""

from __future__ import annotations

import math
import os

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from posmech.plots import MASKED, heatmap, save

TYPE_LETTER = {"local": "L", "slow_decay": "S", "uniform": "U", "undefined": "?"}


def etc_heatmap(tables: dict[str, pd.DataFrame], n: dict[str, int], path: str | os.PathLike[str]) -> None:
    """K4: log ETC over layers × heads, one panel per model (side by side).

    ``tables[model]``: ETC rows of that model at query position ``n[model]`` (columns
    ``layer, head, etc_mean, n_keys, kernel_type``).  Cells carry the kernel type (L/S/U); the
    colour scale runs from log 1 (one key) to log ``n_keys`` (uniform).
    """
    models = list(tables)
    fig, axes = plt.subplots(1, len(models), figsize=(0.5 + 4.1 * len(models), 4.0), squeeze=False)
    # the colour scale ends at the ETC of a uniform kernel (n_keys): yellow means near uniform
    vmax = max(math.log(max(float(t["n_keys"].max()), float(t["etc_mean"].max()), 2.0)) for t in tables.values())
    for ax, m in zip(axes[0], models):
        t = tables[m]
        grid = t.pivot(index="layer", columns="head", values="etc_mean").sort_index()
        kinds = t.pivot(index="layer", columns="head", values="kernel_type").sort_index()
        annot = kinds.apply(lambda col: col.map(TYPE_LETTER))
        big = grid.size <= 400
        # square cells leave a wide, short grid: the colour bar follows the grid's height
        shrink = 0.8 * min(1.0, grid.shape[0] / max(grid.shape[1], 1))
        heatmap(ax, np.log(grid), cmap="plasma", vmin=0.0, vmax=vmax, annot=annot if big else None,
                annot_size=8 if grid.size <= 64 else 6, cbar_label="log ETC (natural log)",
                cbar_shrink=max(0.3, shrink), square=True)
        ax.set_title(f"{m} (n = {n[m]})", fontsize=9)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
    fig.suptitle(
        "K4: log Effective Token Count of each head's positional kernel "
        "(L local, S slow decay, U uniform, ? no kernel)", fontsize=10,
    )
    fig.tight_layout()
    save(fig, path)


def kernel_heatmaps(
    kernels: dict[str, np.ndarray], positions: np.ndarray, k0: int, n_max: int, title: str,
    path: str | os.PathLike[str], types: dict[str, str] | None = None,
    first_keys: dict[str, np.ndarray] | None = None,
) -> None:
    """K2: query × key heatmaps of mean positional kernels.

    ``kernels[head] [Q, K]`` (rows: query ``positions``); drawn for queries ``k0..n_max``
    and keys ``0..n_max``.  ``types[head]``: kernel type shown in the panel title.  Keys
    outside the softmax are masked (grey, :data:`posmech.plots.MASKED`), not drawn as zero
    attention: keys after the query, and keys before its first key, ``k0`` or
    ``first_keys[head] [Q]`` (a sliding-window layer's ``n - window + 1``).
    """
    heads = list(kernels)
    cols = min(3, max(1, len(heads)))  # at most 8 in wide: shown at full size in the report
    rows = math.ceil(len(heads) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.75 * cols, 2.6 * rows + 0.4), squeeze=False)
    sel = (positions >= k0) & (positions <= n_max)
    q = positions[sel]
    cmap = plt.get_cmap("viridis").with_extremes(bad=MASKED)
    for ax, h in zip(axes.ravel(), heads):
        img = np.array(kernels[h][sel][:, : n_max + 1], dtype=float)
        keys = np.arange(img.shape[1])[None, :]
        first = np.asarray(first_keys[h])[sel] if first_keys and h in first_keys else np.full(len(q), k0)
        img[(keys > q[:, None]) | (keys < first[:, None])] = np.nan  # outside the softmax: masked
        im = ax.imshow(img, aspect="auto", origin="upper", cmap=cmap, interpolation="nearest",
                       extent=(-0.5, n_max + 0.5, q[-1] + 0.5, q[0] - 0.5), vmin=0.0)
        kind = f" ({types[h]})" if types and h in types else ""
        ax.set_title(h + kind, fontsize=8)
        ax.set_xlabel("key position i", fontsize=7)
        ax.set_ylabel("query position n", fontsize=7)
        ax.tick_params(labelsize=6)
        cb = fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02)
        cb.ax.tick_params(labelsize=6)
        cb.set_label("π(i | x_n)", fontsize=7)
    for ax in axes.ravel()[len(heads):]:
        ax.axis("off")
    before = f"before k0 = {k0}" + (", or the window" if first_keys else "")
    fig.suptitle(title + f"\n(grey: masked, a key outside the softmax: after its query or {before})", fontsize=10)
    fig.tight_layout()
    save(fig, path)


def kernel_profiles(
    profiles: dict[str, tuple[np.ndarray, np.ndarray]], n: int, k0: int, n_texts: int, path: str | os.PathLike[str],
    types: dict[str, str] | None = None,
) -> None:
    """K5: the kernel at query position ``n`` (mean ± std over ``n_texts`` query texts)
    against key position, one panel per head; ``profiles[head] = (mean [K], std [K])``."""
    heads = list(profiles)
    cols = min(3, max(1, len(heads)))
    rows = math.ceil(len(heads) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.75 * cols, 2.2 * rows + 0.4), squeeze=False)
    for ax, h in zip(axes.ravel(), heads):
        mean, std = profiles[h]
        i = np.arange(k0, n + 1)
        ax.plot(i, mean[i], lw=0.9, color="C0")
        ax.fill_between(i, np.clip(mean[i] - std[i], 0, None), mean[i] + std[i], color="C0", alpha=0.3, lw=0)
        kind = f" ({types[h]})" if types and h in types else ""
        ax.set_title(h + kind, fontsize=8)
        ax.set_xlabel("key position i", fontsize=7)
        ax.set_ylabel("π(i | x_n)", fontsize=7)
        ax.tick_params(labelsize=6)
    for ax in axes.ravel()[len(heads):]:
        ax.axis("off")
    fig.suptitle(f"K5: kernels at n = {n}, mean ± std over {n_texts} query texts", fontsize=10)
    fig.tight_layout()
    save(fig, path)
