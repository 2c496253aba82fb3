"""Figure of rule rotary_frequencies (P17, P18; :mod:`posmech.analyses.rotary`): each head's
selectivity share per rotary frequency pair, and the model's usage profile."""

from __future__ import annotations

import os

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from posmech.analyses.attention import head_name
from posmech.analyses.rotary import FrequencyUsage, sharpest_previous_token_head, usage_profile
from posmech.plots import heatmap, save


def frequency_figure(fu: FrequencyUsage, model: str, band: int, where: str,
                     path: str | os.PathLike[str] | None) -> None:
    """Left (P17): the selectivity share of each head (rows, ``L{l}H{h}``; the sharpest
    previous-token head marked ◀) per component (columns: the rotated pairs from the highest
    frequency to the lowest, then the unrotated dimensions when the rotation is partial),
    shares clipped to [-1, 1] for the colours, numbers in the cells when they fit. Right (P18):
    the usage share of each pair averaged over the heads, against the pair's frequency (log
    scale), the two bands of ``band`` pairs shaded (none when ``band`` is 0)."""
    L, H, C = fu.selectivity.shape
    shares = fu.shares.reshape(L * H, C)
    sharp = sharpest_previous_token_head(fu)
    rows = [head_name(la, h) + (" ◀" if (la, h) == sharp else "") for la in range(L) for h in range(H)]
    cols = [str(f) for f in range(fu.n_pairs)] + (["rest"] if C > fu.n_pairs else [])
    fig, axes = plt.subplots(1, 2, figsize=(8, max(3.2, 0.22 * L * H + 1.6)), layout="constrained",
                             gridspec_kw={"width_ratios": [1.4, 1]})
    fits = L * H <= 24 and C <= 16
    heatmap(axes[0], pd.DataFrame(np.clip(shares, -1, 1), index=rows, columns=cols), cmap="RdBu_r", vmin=-1,
            vmax=1, annot=np.round(shares, 2) if fits else None, fmt=".2f", annot_size=6.5,
            cbar_label="selectivity share")
    axes[0].set(xlabel="rotary pair (0 = highest frequency)", ylabel="head")
    axes[0].set_title(f"P17: selectivity share per frequency pair\n(◀ sharpest previous-token head, "
                      f"{fu.prev[sharp]:.2f})", fontsize=9)
    prof = usage_profile(fu)
    freq = fu.frequency
    axes[1].plot(freq, prof, marker="o")
    if band:  # a single rotated pair has no bands
        lo, hi = freq[-band:], freq[:band]
        axes[1].axvspan(lo.min() / 1.2, lo.max() * 1.2, color="C2", alpha=0.15, label=f"lowest {band}")
        axes[1].axvspan(hi.min() / 1.2, hi.max() * 1.2, color="C3", alpha=0.15, label=f"highest {band}")
    axes[1].axhline(1.0 / fu.n_pairs, color="0.5", ls=":", lw=1, label="uniform")
    axes[1].set(xscale="log", xlabel="frequency (rad / position)", ylabel="usage share, mean over heads")
    axes[1].legend(fontsize=7)
    axes[1].set_title("P18: usage per frequency pair", fontsize=9)
    fig.suptitle(f"P17, P18 {where}", fontsize=10)
    save(fig, path, tight=False)
