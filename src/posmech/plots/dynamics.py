"""The training-dynamics figure: the followed findings at each checkpoint (issue 30).

One panel per followed quantity of ``results/report/dynamics.csv`` (columns in
:mod:`posmech.report.dynamics_section`): the value against the training step, one line per
model in a colour of its own, the verdict of the claim's finding at each checkpoint on its
point (filled: holds, open: fails, ×: not measurable, at the bottom when there is no value),
in the model's colour; the legend at the top, under the title.  A count (of heads, of
kernel types) has its axis start at 0.  A quantity told by a label instead of a number (the previous-token head's kernel
type) gets a strip panel: one row per label, the models' points dodged a little apart.

The step axis is symmetric-log (linear up to the smallest positive step, logarithmic above),
so step 0, the first saved steps and the last are all readable; a model whose revisions have
no step (Hub revisions not named ``stepN``) is drawn by revision in order instead, when no
row of the table has a step.
"""

from __future__ import annotations

import math
import os
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullFormatter

from posmech.plots import save
from posmech.verdicts.dynamics import check_table, is_categorical, quantity

NOT_MEASURABLE = "0.45"  # grey of the note on a panel with no value at all
BOTTOM = 0.05  # axes fraction where a point without a value is drawn
#: order of known labels on a strip panel (kernel types); other labels follow, sorted
LABEL_ORDER = ("local", "slow_decay", "uniform", "undefined")
MARKER = "o"
SIZE = 6.0


#: panels drawn first, in this order: where the previous-token and induction heads appear
HEADLINE = ["largest_prev_token_mass", "p_redirected_after", "previous_candidate_score",
            "look_back_two_candidate_score", "largest_prev_token_mass_layer", "previous_token_head_etc",
            "min(diagonal_ratio)"]


def model_colours(models: list[str]) -> dict[str, Any]:
    """A colour per model, in order: tab10 without its grey (the colour of the panels' notes)."""
    tab = [c for i, c in enumerate(plt.get_cmap("tab10").colors) if i != 7]
    return {m: tab[i % len(tab)] for i, m in enumerate(models)}


def step_ticks(steps: np.ndarray) -> tuple[float, list[float]]:
    """The symlog threshold (smallest positive step, at least 1) and the labelled ticks: 0
    when drawn, the threshold, then 1-2-5 steps above it (powers of ten only when the steps
    span over three decades, so labels never crowd)."""
    pos = steps[steps > 0]
    thresh = float(pos.min()) if len(pos) else 1.0
    top = float(steps.max()) if len(steps) else 1.0
    ticks = ([0.0] if (steps <= 0).any() else []) + [thresh]
    subs = (1.0,) if top / thresh > 1e3 else (1.0, 2.0, 5.0)
    for e in range(int(math.floor(math.log10(thresh))), int(math.ceil(math.log10(max(top, thresh)))) + 1):
        for s in subs:
            v = s * 10.0**e
            if 1.5 * thresh <= v <= 1.05 * top:
                ticks.append(v)
    return thresh, ticks


def step_label(v: float, _pos: Any = None) -> str:
    """``50``, ``200``, ``2k``, ``143k``: a step as a short tick label."""
    return f"{v / 1000:g}k" if v >= 1000 else f"{v:g}"


def _step_axis(ax: Any, x: np.ndarray, by_revision: list[str] | None) -> None:
    if by_revision is not None:
        ax.set_xticks(range(len(by_revision)), by_revision, rotation=30, ha="right")
        ax.set_xlim(-0.5, len(by_revision) - 0.5)
        ax.set_xlabel("revision", fontsize=8)
        return
    thresh, ticks = step_ticks(x)
    ax.set_xscale("symlog", linthresh=thresh, linscale=0.6)
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(FuncFormatter(step_label))
    ax.xaxis.set_minor_locator(FixedLocator(sorted(set(x.tolist()))))  # every checkpoint, unlabelled
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlim(-0.3 * thresh if (x <= 0).any() else 0.7 * thresh, 1.3 * max(float(x.max()), thresh))
    ax.set_xlabel("training step (symmetric log)", fontsize=8)


def _marks(ax: Any, xs: np.ndarray, ys: np.ndarray, verdicts: list[str], colour: Any, i: int) -> None:
    """The verdict of each point of the ``i``-th model: filled holds, open fails, × not
    measurable (at the bottom of the axes when its value is NaN, a row per model), a small dot
    for no verdict.  Later models' markers are smaller, so equal values show as rings."""
    bottom = ax.get_xaxis_transform()  # x in data, y in axes fraction
    ms = max(SIZE - 1.6 * i, 3.0)
    for x, y, v in zip(xs, ys, verdicts):
        finite = not math.isnan(y)
        if v == "not measurable":
            ax.plot([x], [y if finite else BOTTOM + 0.06 * i], marker="x", ms=ms, mew=1.5, color=colour,
                    ls="none", transform=ax.transData if finite else bottom, clip_on=False, zorder=3)
        elif not finite:
            continue
        elif v == "holds":
            ax.plot([x], [y], marker=MARKER, ms=ms, color=colour, mec=colour, ls="none", zorder=4 + i)
        elif v == "fails":
            ax.plot([x], [y], marker=MARKER, ms=ms, mfc="white", mec=colour, mew=1.5, ls="none", zorder=4 + i)
        else:
            ax.plot([x], [y], marker=".", ms=ms / 2, color=colour, ls="none", zorder=4 + i)


def draw_dynamics(table: pd.DataFrame) -> Any:
    """The figure of :func:`dynamics_figure`, not saved (tests read its axes)."""
    t = check_table(table)
    if t.empty:
        raise ValueError("dynamics table has no rows: nothing to draw (the sweep wrote no checkpoint)")
    models = list(dict.fromkeys(t["model"]))
    colours = model_colours(models)
    by_revision: list[str] | None = None
    if t["step"].notna().any():
        dropped = t[t["step"].isna()].drop_duplicates(["model", "revision"])
        t = t[t["step"].notna()].assign(x=lambda d: d["step"].astype(float))
    else:  # no step anywhere (Hub revisions by name): revisions in the table's order
        dropped = t.iloc[:0]
        by_revision = list(dict.fromkeys(t["revision"]))
        t = t.assign(x=[float(by_revision.index(r)) for r in t["revision"]])
    quantities = list(dict.fromkeys(t["quantity"]))
    numeric = [q for q in quantities if not is_categorical(t[t["quantity"] == q])]
    # the formation first (HEADLINE), then the rest in the table's order, categories last
    panels = sorted(numeric, key=lambda q: HEADLINE.index(q) if q in HEADLINE else len(HEADLINE)) + [
        q for q in quantities if q not in numeric]
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.3 * cols, 2.55 * rows + 0.9), squeeze=False,
                             layout="constrained")
    x_all = np.asarray(t["x"], dtype=float)
    for ax, q in zip(axes.ravel(), panels):
        sel = t[t["quantity"] == q]
        words = quantity(q)
        claims = ", ".join(dict.fromkeys(c for c in sel["claim"] if c))
        ax.set_title(f"{claims}: {words.title}" if claims else words.title, fontsize=9)
        cat = q not in numeric
        levels: list[str] = []
        if cat:
            found = set(sel["label"]) - {""}
            levels = [lv for lv in LABEL_ORDER if lv in found] + sorted(found - set(LABEL_ORDER))
        for i, m in enumerate(models):
            g = sel[sel["model"] == m].sort_values("x")
            if g.empty:
                continue
            xs = np.asarray(g["x"], dtype=float)
            if cat:
                dodge = (i - (len(models) - 1) / 2) * min(0.12, 0.5 / len(models))
                ys = np.array([levels.index(lv) + dodge if lv else np.nan for lv in g["label"]])
            else:
                ys = np.asarray(g["value"], dtype=float)
            ok = ~np.isnan(ys)
            ax.plot(xs[ok], ys[ok], color=colours[m], lw=1.2, alpha=0.8, zorder=2)
            _marks(ax, xs, ys, list(g["verdict"]), colours[m], i)
        _step_axis(ax, x_all, by_revision)
        ax.tick_params(labelsize=8)
        if cat:
            ax.set_yticks(range(len(levels)), [lv.replace("_", " ") for lv in levels])
            ax.set_ylim(-0.9, len(levels) - 0.5)
            ax.set_ylabel(words.axis, fontsize=8)
        elif not sel["value"].notna().any():
            ax.set_yticks([])
            ax.text(0.5, 0.5, "not measurable\nat any checkpoint", transform=ax.transAxes, ha="center",
                    va="center", fontsize=8, color=NOT_MEASURABLE)
        else:
            vals = sel["value"].dropna()
            if np.allclose(vals, np.round(vals)):
                ax.yaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
            lo, hi = float(vals.min()), float(vals.max())
            pad = 0.12 * (hi - lo) if hi > lo else max(0.5, 0.1 * abs(hi))
            if words.count and lo >= 0:
                # a count starts at 0, not at −1 heads: the axis ends there, its line set off below so
                # a point at 0 (drawn unclipped) stays clear of it
                ax.set_ylim(0, max(hi + pad, 1.0))
                ax.spines["bottom"].set_position(("outward", 5))
                for line in ax.lines:
                    line.set_clip_on(False)
            else:
                ax.set_ylim(lo - 1.6 * pad, hi + pad)  # room at the bottom for the not-measurable marks
            ax.set_ylabel(words.axis, fontsize=8)
    for ax in axes.ravel()[len(panels):]:
        fig.delaxes(ax)
    handles = [Line2D([], [], color=colours[m], lw=1.5, label=m) for m in models] + [
        Line2D([], [], marker=MARKER, ms=SIZE, color="0.2", ls="none", label="finding holds"),
        Line2D([], [], marker=MARKER, ms=SIZE, mfc="white", mec="0.2", mew=1.5, ls="none", label="fails"),
        Line2D([], [], marker="x", ms=SIZE, mew=1.5, color="0.2", ls="none",
               label="not measurable (at the bottom: no value)"),
    ]
    title = "Training dynamics: the followed findings at each checkpoint, one line per model"
    if len(dropped):
        title += "\n(not drawn, no step: " + ", ".join(f"{m} {r}" for m, r in zip(dropped["model"],
                                                                                 dropped["revision"])) + ")"
    # the legend at the top, titled with the figure's title (a figure legend placed outside
    # the panels does not make room for a suptitle: the two would print over each other): a
    # figure of many panels is read from its first ones
    fig.legend(handles=handles, loc="outside upper center", ncol=min(len(handles), 3 if cols < 3 else 6),
               fontsize=8, frameon=False, title=title, title_fontsize=10)
    return fig


def dynamics_figure(table: pd.DataFrame, path: str | os.PathLike[str]) -> None:
    """The followed quantities of ``table`` (``results/report/dynamics.csv``) against the
    training step, one panel per quantity, one line per model, verdicts marked; PNG at ``path``."""
    save(draw_dynamics(table), path)
