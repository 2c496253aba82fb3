"""Figures of the layer-0 contextual-head analyses (K6–K10, seed post 004)."""

from __future__ import annotations

import math
import os
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from posmech.plots import MASKED, readable_log, save

WIDTH = 7.4  # inches: the report's column at 150 dpi (figures are not shrunk)
CLASS_COLOURS = {"duplicate_token": "C3", "detokenization": "C1", "contextual": "C0", "other": "C7"}


def ln_scale_figure(ln: dict[str, Any], used: float, model: str, corpus: str, path: str | os.PathLike[str]) -> None:
    """Histogram of ``blocks.0.ln1.hook_scale`` over a corpus's tokens, the post's
    0.15–0.175 band and the scale used by the linear approximation."""
    fig, ax = plt.subplots(figsize=(6, 3.4))
    edges, counts = ln["edges"], ln["counts"]
    ax.stairs(counts, edges, fill=True, alpha=0.6, color="C0", label=f"{corpus} tokens (n = {int(ln['n_tokens'])})")
    ax.axvspan(0.15, 0.175, color="C2", alpha=0.15, label="post (gpt2): 0.15–0.175")
    ax.axvline(used, color="k", lw=1, ls="--", label=f"s used = {used:.4f}")
    ax.set_xlabel("blocks.0.ln1.hook_scale (σ of the centred residual)")
    ax.set_ylabel("tokens")
    ax.legend(fontsize=7)
    ax.set_title(f"K6 {model}: layer-0 LayerNorm scale (position 0 excluded)", fontsize=9)
    save(fig, path)


def pattern_grids(grids: dict[int, dict[str, np.ndarray]], g: int, fixed_token: str, own_tokens: dict[int, str],
                  title: str, path: str | os.PathLike[str]) -> None:
    """K6: one row per head; for each ``n`` three ``g × g`` images: the positional
    pattern of the fixed destination token, that of the text's own token, the real
    attention row (``grids[n][kind] [H, g*g]``, last keys read row by row, the last key is
    the bottom-right cell; each image on its own colour scale, grey = masked, before key 0)."""
    ns = sorted(grids)
    H = next(iter(grids.values()))["fixed"].shape[0]
    kinds = (("fixed", f"p, x_n={fixed_token!r}"), ("own", "p, own x_n"), ("real", "real row"))
    cols = 3 * len(ns)
    size = min(1.5, (WIDTH - 0.6) / cols)
    fig, axes = plt.subplots(H, cols, figsize=(size * cols + 0.6, size * H + 0.9), squeeze=False)
    for c, n in enumerate(ns):
        for k, (kind, label) in enumerate(kinds):
            for h in range(H):
                ax = axes[h, 3 * c + k]
                img = grids[n][kind][h].reshape(g, g)
                ax.imshow(img, cmap=plt.get_cmap("viridis").with_extremes(bad=MASKED), vmin=0.0,
                          vmax=np.nanmax(img) or 1.0, interpolation="nearest")
                ax.set_xticks([])
                ax.set_yticks([])
                if h == 0:
                    tok = f" ({own_tokens[n]!r})" if kind == "own" else ""
                    ax.set_title(f"n={n}\n{label}{tok}", fontsize=6)
                if c == 0 and k == 0:
                    ax.set_ylabel(f"L0H{h}", fontsize=7)
    fig.suptitle(title + "\n(grey cells: masked, before key 0)" if any(
        np.isnan(grids[n][kind]).any() for n in ns for kind, _ in kinds) else title, fontsize=9)
    fig.tight_layout()
    save(fig, path)


def class_figure(df: pd.DataFrame, thr: dict[str, float], title: str, path: str | os.PathLike[str]) -> None:
    """K7: the three measured quantities per head as bars coloured by class, each with
    its threshold, so the rule's decision is visible."""
    panels = (("duplicate_excess", "duplicate-token excess mass", thr["duplicate_min_excess"], "excess mass"),
              ("local_mass", "positional mass on the last keys", thr["local_min_mass"], "mass"),
              ("etc_fraction", "ETC / n_keys of the positional pattern", thr["uniform_min_fraction"],
               "ETC / n_keys"))
    fig, axes = plt.subplots(1, 3, figsize=(WIDTH, 3.2))
    colours = [CLASS_COLOURS[c] for c in df["head_class"]]
    for ax, (col, label, t, ylabel) in zip(axes, panels):
        ax.bar(df["head_name"], df[col], color=colours)
        ax.axhline(t, color="k", ls="--", lw=0.8)
        ax.set_title(label, fontsize=8)
        ax.set_xlabel("layer-0 head", fontsize=7)
        ax.set_ylabel(ylabel, fontsize=7)
        ax.tick_params(axis="x", labelrotation=90, labelsize=7)
        ax.tick_params(axis="y", labelsize=7)
    handles = [plt.Rectangle((0, 0), 1, 1, color=v) for v in CLASS_COLOURS.values()]
    fig.legend(handles, list(CLASS_COLOURS), loc="lower center", ncol=4, fontsize=7, frameon=False)
    fig.suptitle(f"{title} (dashed: thresholds; decided left to right)", fontsize=9)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    save(fig, path)


def _grid(n: int) -> tuple[int, int]:
    cols = min(3, n)
    return math.ceil(n / cols), cols


def denominator_figure(positions: np.ndarray, log_z: np.ndarray, log_z_exact: np.ndarray, titles: list[str],
                       classes: list[str], title: str, path: str | os.PathLike[str]) -> None:
    """K8: ``Z_h(n)`` (log scale) against ``n`` for every text, one panel per head
    (``log_z [T, H, N]``); solid linear LN, dotted exact."""
    T, H, _ = log_z.shape
    rows, cols = _grid(H)
    fig, axes = plt.subplots(rows, cols, figsize=(WIDTH, 2.1 * rows + 0.6), squeeze=False)
    for h, ax in enumerate(axes.ravel()[:H]):
        for t in range(T):
            ax.plot(positions, np.exp(log_z[t, h]), lw=0.7, color=f"C{t % 10}", label=titles[t] if h == 0 else None)
            ax.plot(positions, np.exp(log_z_exact[t, h]), lw=0.6, ls=":", color=f"C{t % 10}")
        ax.set_yscale("log")
        readable_log(ax.yaxis)
        ax.set_title(f"L0H{h} ({classes[h]})", fontsize=8, color=CLASS_COLOURS.get(classes[h], "k"))
        ax.tick_params(which="both", labelsize=6)
        ax.set_xlabel("destination position n", fontsize=7)
        ax.set_ylabel("Z_h(n) (log scale)", fontsize=7)
    for ax in axes.ravel()[H:]:
        ax.axis("off")
    fig.legend(loc="lower center", ncol=min(T, 3), fontsize=6, frameon=False)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    save(fig, path)


def variance_figure(df: pd.DataFrame, positions: np.ndarray, log_z: np.ndarray, classes: list[str], text: str,
                    r: float, slope: float, title: str, path: str | os.PathLike[str], from_n: int = 1) -> None:
    """K9: predicted vs observed ``Var Z`` (log–log, coloured by class, diagonal = the
    model), and ``Z_h(n) / mean`` along one text per head for ``n ≥ from_n`` (smooth vs
    "confetti")."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(WIDTH, 3.6))
    marks = {"resampled": ("o", "i.i.d. redraws at n"), "within_text": ("^", "along the text")}
    for (c, method), sub in df.groupby(["head_class", "method"]):
        a.scatter(sub["predicted"], sub["observed"], s=14, color=CLASS_COLOURS.get(c, "k"),
                  marker=marks[method][0], label=f"{c}, {marks[method][1]}", alpha=0.8)
    ok = df[(df["predicted"] > 0) & (df["observed"] > 0)]
    lo, hi = float(ok[["predicted", "observed"]].min().min()), float(ok[["predicted", "observed"]].max().max())
    a.plot([lo, hi], [lo, hi], color="k", lw=0.8, ls="--")
    a.set_xscale("log")
    a.set_yscale("log")
    readable_log(a.xaxis)
    readable_log(a.yaxis)
    a.set_xlabel("predicted Σ p² · Var(c)", fontsize=8)
    a.set_ylabel("observed Var Z", fontsize=8)
    a.set_title(f"i.i.d. redraws: log-log r = {r:.3f}, slope {slope:.2f}", fontsize=8)
    a.legend(fontsize=7)
    sel = np.asarray(positions) >= from_n
    z = np.exp(log_z[:, sel])  # [H, N']
    for h in range(z.shape[0]):
        b.plot(np.asarray(positions)[sel], z[h] / z[h].mean(), lw=0.6, color=CLASS_COLOURS.get(classes[h], "k"),
               alpha=0.85,
               label=classes[h] if classes[h] not in classes[:h] else None)
    b.set_xlabel("destination position n", fontsize=8)
    b.set_ylabel(f"Z_h(n) / its mean over n ≥ {from_n}", fontsize=8)
    b.legend(fontsize=7)
    b.set_title(f"every head along {text} (colour = class)", fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    save(fig, path)


def layer1_figure(rows: np.ndarray, kernel: np.ndarray, df: pd.DataFrame, n: int, k0: int, title: str,
                  path: str | os.PathLike[str]) -> None:
    """K10: every layer-1 head's real attention row at ``n`` (over keys ``0..n``) with its
    positional kernel (grey), the TV between them in the panel title."""
    H = rows.shape[0]
    nr, nc = _grid(H)
    fig, axes = plt.subplots(nr, nc, figsize=(WIDTH, 2.0 * nr + 0.5), squeeze=False)
    keys = np.arange(n + 1)
    for h, ax in enumerate(axes.ravel()[:H]):
        ax.plot(keys, kernel[h, : n + 1], color="0.6", lw=1.2)
        ax.plot(keys, rows[h, : n + 1], color="C0", lw=0.7)
        r = df.iloc[h]
        mark = " positional" if r["mostly_positional"] else ""
        ax.set_title(f"{r['head_name']}: TV {r['tv_row_vs_kernel']:.2f}{mark}", fontsize=8)
        ax.set_ylim(0, max(1e-3, float(np.max(rows[h, k0 : n + 1])), float(np.max(kernel[h, k0 : n + 1]))) * 1.1)
        ax.tick_params(labelsize=6)
        ax.set_xlabel(f"key position (query {n})", fontsize=7)
        ax.set_ylabel("attention", fontsize=7)
    for ax in axes.ravel()[H:]:
        ax.axis("off")
    fig.suptitle(title + f"; y axis clipped to keys ≥ {k0}\n(blue: real attention row; grey: positional kernel)",
                 fontsize=9)
    fig.tight_layout()
    save(fig, path)
