"""Figures: one function per figure, taking tidy data; PNG at 150 dpi with the claim ID
(or the pipeline stage) in the title.

Shared helpers live here (:func:`save`, :data:`DPI`); each analysis family has its own
submodule under the family's name (``posmech.plots.geometry``, ``posmech.plots.kernels``,
…, ``posmech.plots.posembed`` for the posembed rules; docs/workflow.md, "Families")."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator
from typing import Any

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from posmech.io import atomic_path  # noqa: E402

DPI = 150
MASKED = "0.85"  # grey of masked cells (a key after its query) in every attention heat map
log = logging.getLogger(__name__)


class _Seaborn:
    """seaborn, imported on first use (``sns.lineplot`` …): importing it pulls in
    ``scipy.stats``, ~1.5 CPU s, which most figures (and every job that draws none) never
    need; the figure-making rules' fixed cost is mostly imports (docs/performance.md)."""

    def __getattr__(self, name: str) -> Any:
        import seaborn

        return getattr(seaborn, name)


sns = _Seaborn()


@contextlib.contextmanager
def seeded(seed: int = 0) -> Iterator[None]:
    """Seed NumPy's global random state for the block (seaborn's strip-plot jitter draws
    from it), and restore the caller's state afterwards: identical runs give identical
    figures.  Every figure function whose seaborn calls draw random numbers uses it."""
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


def save(fig: Any, path: str | os.PathLike[str]) -> None:
    """Save a figure atomically as PNG at report resolution and close it.

    The figure check (:mod:`posmech.plots.check`) runs first: each problem is logged as a
    warning naming the file, and the result is stored in the PNG's text metadata, where the
    tests read it back for every figure of a run.

    The figure is laid out once: one draw gives the check its layout and the tight bounding
    box (what ``bbox_inches="tight"`` computes, padded by ``savefig.pad_inches``); the layout
    is then kept (layout engine ``none``), so ``savefig`` renders once instead of drawing the
    figure again to redo the layout and find the box (a draw of a many-panel figure costs
    seconds here: text layout dominates)."""
    from posmech.plots.check import METADATA_KEY, figure_problems

    fig.draw_without_rendering()  # runs the figure's layout engine (tight or constrained), once
    bbox = fig.get_tightbbox(fig.canvas.get_renderer())
    fig.set_layout_engine("none")  # keep that layout: savefig would otherwise draw again to redo it
    result = figure_problems(fig, width_px=float(bbox.width * DPI), drawn=True)
    for problem in result["problems"]:
        log.warning("figure check, %s: %s", os.fspath(path), problem)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=DPI, bbox_inches=bbox.padded(plt.rcParams["savefig.pad_inches"]), format="png",
                    metadata={METADATA_KEY: json.dumps(result, ensure_ascii=True)})
    plt.close(fig)


def readable_log(axis: Any, decades: float = 2.0) -> None:
    """After the data are drawn on a log-scaled ``axis``: when its view spans under
    ``decades`` powers of ten, plain labels (:func:`plain_log`; under a factor 4, at evenly
    spaced values, as few 1-2-5 steps would fall inside)."""
    from matplotlib.ticker import MaxNLocator

    lo, hi = sorted(axis.get_view_interval())
    if lo <= 0 or hi / lo >= 10.0**decades:
        return
    plain_log(axis)
    if hi / lo < 4:
        axis.set_major_locator(MaxNLocator(4))


def plain_log(axis: Any, ticks: Any = None) -> None:
    """Label a log-scaled axis with plain numbers (``5``, ``20``, ``0.3``) instead of powers
    of ten, at ``ticks`` (e.g. the measured values) or at 1-2-5 steps, minor ticks unlabelled:
    a range under two decades is read off directly (the figure check requires it)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    if ticks is not None:
        axis.set_ticks(list(ticks))
    else:
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def training_curve(curve: pd.DataFrame, summary: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Train and held-out loss against steps for the demo model."""
    long = curve.melt(id_vars=["step"], value_vars=["train_loss", "heldout_loss"], var_name="split", value_name="loss")
    fig, ax = plt.subplots(figsize=(6, 4))
    sns.lineplot(data=long, x="step", y="loss", hue="split", marker="o", ax=ax)
    ax.set_ylabel("cross-entropy (nats / token)")
    ax.set_title(
        f"Demo model {summary['model']}: held-out loss {summary['heldout_loss']:.3f}; "
        f"{summary['best_previous_token_head']} prev-token {summary['best_previous_token_score']:.2f}",
        fontsize=9,
    )
    save(fig, path)


def words_figure(title: str, text: str, path: str | os.PathLike[str]) -> None:
    """A figure that says in words why there is nothing to draw (a rule whose object the
    model lacks still writes its figure)."""
    fig = plt.figure(figsize=(6, 2.5))
    ax = fig.add_subplot()
    ax.axis("off")
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=10, wrap=True)
    fig.suptitle(title, fontsize=9)
    save(fig, path)
