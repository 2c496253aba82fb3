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

from posmech.core.io import atomic_path  # noqa: E402
from posmech.store.tables import not_measurable_rows, write_table  # noqa: E402

DPI = 150
MASKED = "0.85"  # grey of masked cells (a key after its query) in every attention heat map
log = logging.getLogger(__name__)


@contextlib.contextmanager
def seeded(seed: int = 0) -> Iterator[None]:
    """Seed NumPy's global random state for the block (a strip plot's jitter draws from it),
    and restore the caller's state afterwards: identical runs give identical figures."""
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


#: seaborn's "deep" palette (a choice kept from the figures drawn with seaborn before)
DEEP = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C", "#CCB974", "#64B5CD")


def category_colours(n: int) -> list[Any]:
    """``n`` distinct colours: matplotlib's colour cycle (tab10) up to 10, ``tab20`` up to 20,
    evenly spaced hues of ``turbo`` beyond."""
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    if n <= len(cycle):
        return list(cycle[:n])
    if n <= 20:
        return [plt.get_cmap("tab20")(i) for i in range(n)]
    return [plt.get_cmap("turbo")(v) for v in np.linspace(0.05, 0.95, n)]


def category_markers(n: int) -> list[Any]:
    """``n`` distinct markers (circle, cross, diamond, plus, square, …; regular polygons of
    growing order after the first nine), as seaborn's ``markers=True`` gave them."""
    markers: list[Any] = ["o", "X", (4, 0, 45), "P", (4, 0, 0), (4, 1, 0), "^", (4, 1, 45), "v"]
    s = 5
    while len(markers) < n:
        a = 360 / (s + 1) / 2
        markers += [(s + 1, 1, a), (s + 1, 0, a), (s, 1, 0), (s, 0, 0)]
        s += 1
    return markers[:n]


def lines_by(ax: Any, data: pd.DataFrame, x: str, y: str, hue: str, hue_order: list[Any] | None = None,
             colours: list[Any] | None = None, markers: list[Any] | None = None) -> None:
    """One line per level of ``hue`` (``hue_order``, else in order of appearance): ``y``
    against ``x``, sorted by ``x``, rows where either is NaN left out (the line joins the
    points on both sides), a marker at each point (circles, or ``markers`` per level) with a
    white edge; colours: ``colours`` per level, else :func:`category_colours`.  A legend
    titled with the ``hue`` column's name; the axes labelled ``x``
    and ``y`` (the caller relabels).  Each (level, ``x``) must hold one row: the figures
    draw measured values, never an average the caption would have to define."""
    levels = list(hue_order) if hue_order is not None else list(dict.fromkeys(data[hue]))
    repeated = data.duplicated([hue, x])
    if repeated.any():
        level, at = (str(v) for v in data.loc[repeated, [hue, x]].iloc[0])
        raise ValueError(f"lines_by: several rows for {hue}={level}, {x}={at}; "
                         "one row per line and x is drawn (aggregate the table first)")
    colours = colours or category_colours(len(levels))
    for i, level in enumerate(levels):
        sub = data[data[hue] == level].dropna(subset=[x, y]).sort_values(x)
        ax.plot(sub[x], sub[y], color=colours[i % len(colours)], marker=markers[i] if markers else "o",
                markeredgecolor="w", markeredgewidth=0.75, label=str(level))
    ax.legend(title=hue)
    ax.set_xlabel(x)
    ax.set_ylabel(y)


def relative_luminance(colour: Any) -> float:
    """W3C relative luminance of a colour (0 black, 1 white)."""
    rgb = np.asarray(matplotlib.colors.to_rgb(colour))
    rgb = np.where(rgb <= 0.03928, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    return float(rgb @ [0.2126, 0.7152, 0.0722])


def heatmap(ax: Any, data: np.ndarray | pd.DataFrame, *, cmap: Any, vmin: float, vmax: float,
            annot: np.ndarray | pd.DataFrame | None = None, fmt: str = "", annot_size: float = 7,
            cbar_label: str = "", cbar_shrink: float = 1.0, linewidths: float = 0.0, linecolor: str = "white",
            square: bool = False) -> Any:
    """A heat map of ``data [rows, cols]`` on ``ax``: row 0 at the top, one cell per entry
    (NaN cells left undrawn: the axes' face colour shows), no spines, a colour bar labelled
    ``cbar_label`` (``shrink``: its length relative to the axes), ticks at the cell centres
    labelled with the DataFrame's index / columns (else 0, 1, …), every k-th when the labels
    would not fit.  ``annot``: a text per cell (strings, or numbers formatted by ``fmt``),
    written on the drawn cells in dark grey on light cells and white on dark ones (W3C
    relative luminance above / below 0.408).  Returns the mesh."""
    from matplotlib.font_manager import FontProperties

    values = np.asarray(data, dtype=float)
    rows, cols = values.shape
    xlabels = list(data.columns) if isinstance(data, pd.DataFrame) else list(range(cols))
    ylabels = list(data.index) if isinstance(data, pd.DataFrame) else list(range(rows))
    mesh = ax.pcolormesh(np.ma.masked_invalid(values), cmap=cmap, vmin=vmin, vmax=vmax, linewidths=linewidths,
                         edgecolor=linecolor)
    ax.set(xlim=(0, cols), ylim=(rows, 0))
    for spine in ax.spines.values():
        spine.set_visible(False)
    if square:
        ax.set_aspect("equal")
    cb = ax.get_figure().colorbar(mesh, ax=ax, label=cbar_label, shrink=cbar_shrink)
    cb.outline.set_linewidth(0)
    size = ax.get_position().size * ax.get_figure().get_size_inches()
    for axis, labels, inches, key in ((ax.xaxis, xlabels, size[0], "xtick.labelsize"),
                                      (ax.yaxis, ylabels, size[1], "ytick.labelsize")):
        points = FontProperties(size=plt.rcParams[key]).get_size_in_points()
        step = len(labels) // max(int(inches // (points / 72)), 1) + 1  # one label per text height
        axis.set_ticks(np.arange(0, len(labels), step) + 0.5, [str(v) for v in labels[::step]])
    if annot is not None:
        texts = np.asarray(annot, dtype=object)
        mesh.update_scalarmappable()
        for (r, c), colour in zip(np.ndindex(rows, cols), mesh.get_facecolors()):
            if not np.isfinite(values[r, c]):  # an undrawn cell
                continue
            ax.text(c + 0.5, r + 0.5, format(texts[r, c], fmt), ha="center", va="center", fontsize=annot_size,
                    color=".15" if relative_luminance(colour) > 0.408 else "w")
    return mesh


def save(fig: Any, path: str | os.PathLike[str] | None, tight: bool = True) -> None:
    """Save a figure atomically as PNG at report resolution (:data:`DPI`) and close it;
    ``path`` None (a job that draws no figures: a dynamics sweep point) closes it unsaved.

    The figure check (:mod:`posmech.plots.check`) runs first: each problem is logged as a
    warning naming the file, and the result is stored in the PNG's text metadata, where the
    tests read it back for every figure of a run.

    The figure is drawn once: rendered at :data:`DPI` (running its layout engine, tight or
    constrained, in that draw), then the check reads that layout, the tight bounding box (what
    ``bbox_inches="tight"`` computes, padded by ``savefig.pad_inches``) is found on its pixels
    (:func:`_ink_box`), and the rendered pixels inside the box are written.  ``savefig(bbox_inches="tight")`` would draw
    the figure twice more (to lay it out and find the box, then to render it shifted onto the
    box), and a draw of a many-panel figure costs seconds here: text layout dominates.  Only a
    figure whose box reaches past its edges (a text wider than the figure) is rendered again,
    onto the box, keeping the layout; a figure whose layout engine left its title over a
    panel's title (:func:`posmech.plots.check.title_overlaps`) is drawn once more first.
    ``tight=False``: the figure is written at its own size (a figure placed by hand, whose
    texts all lie inside it)."""
    if path is None:
        plt.close(fig)
        return
    from PIL import Image
    from PIL.PngImagePlugin import PngInfo

    from posmech.plots.check import METADATA_KEY, figure_problems, title_overlaps

    fig.set_dpi(DPI)
    fig.canvas.draw()  # lays the figure out and renders it, once
    renderer = fig.canvas.get_renderer()
    if fig.get_layout_engine() is not None and title_overlaps(fig, renderer):
        # the layout engine reads the panel titles where the previous draw put them; axes of a
        # fixed aspect (heat maps) move theirs as they are drawn, so a figure title laid out on
        # the stale places prints over them: one more draw lays it out on the titles as drawn
        fig.canvas.draw()
    width, height = fig.get_size_inches()
    tight_box = None
    if tight:  # the box of what was drawn, off its pixels; the artists' extents where it may miss some
        tight_box = _ink_box(fig, renderer, height) or fig.get_tightbbox(renderer)
    box = tight_box.padded(plt.rcParams["savefig.pad_inches"]) if tight else None
    with plt.rc_context({"figure.autolayout": False, "figure.constrained_layout.use": False}):
        fig.set_layout_engine(None)  # keep that layout (with any engine, even "none", savefig lays it out again)
    result = figure_problems(fig, width_px=float((tight_box.width if tight else width) * DPI), drawn=True)
    for problem in result["problems"]:
        log.warning("figure check, %s: %s", os.fspath(path), problem)
    metadata = {"Software": f"Matplotlib version{matplotlib.__version__}, https://matplotlib.org/",
                METADATA_KEY: json.dumps(result, ensure_ascii=True)}
    with atomic_path(path) as tmp:
        edge = 0.5 / DPI  # half a pixel
        inside = tight_box is None or (tight_box.x0 >= -edge and tight_box.y0 >= -edge
                                       and tight_box.x1 <= width + edge and tight_box.y1 <= height + edge)
        if not inside:  # a text past the figure's edge: render again, onto the box
            fig.savefig(tmp, dpi=DPI, bbox_inches=box, format="png", metadata=metadata)
        else:
            pixels = np.asarray(renderer.buffer_rgba())
            if box is not None:
                pixels = _crop(pixels, box, height, fig.get_facecolor())
            info = PngInfo()
            for key, value in metadata.items():
                info.add_text(key, value)
            Image.fromarray(pixels).save(tmp, format="png", pnginfo=info, dpi=(DPI, DPI))
    plt.close(fig)


def _ink_box(fig: Any, renderer: Any, height: float) -> Any:
    """The smallest box (inches, from the figure's lower left) around every drawn pixel that
    is not the figure's face colour: what ``bbox_inches="tight"`` finds from the artists'
    extents (less the few pixels by which a text's line height exceeds its ink), with no pass
    of text layout over every axes.  None where it may miss something: the drawing touches
    the figure's edge (it may go on past it), or a figure text or legend (the artists placed
    freely, as a note beside the axes) reaches past the edge."""
    from matplotlib.transforms import Bbox

    pixels = np.asarray(renderer.buffer_rgba())
    face = np.round(np.asarray(matplotlib.colors.to_rgba(fig.get_facecolor())) * 255).astype(np.uint8)
    ink = (pixels != face).any(axis=2)
    rows, cols = np.flatnonzero(ink.any(axis=1)), np.flatnonzero(ink.any(axis=0))
    if not rows.size or rows[0] == 0 or cols[0] == 0 or rows[-1] == ink.shape[0] - 1 or cols[-1] == ink.shape[1] - 1:
        return None
    free = [t for t in fig.texts if t.get_visible() and t.get_text()] + list(fig.legends)
    free += [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    for artist in free:
        extent = artist.get_window_extent(renderer)
        if extent.x0 < 0 or extent.y0 < 0 or extent.x1 > ink.shape[1] or extent.y1 > ink.shape[0]:
            return None
    return Bbox([[cols[0] / DPI, height - (rows[-1] + 1) / DPI], [(cols[-1] + 1) / DPI, height - rows[0] / DPI]])


def _crop(pixels: np.ndarray, box: Any, height: float, facecolor: Any) -> np.ndarray:
    """The rendered ``pixels`` (rows from the top) inside ``box`` (inches, from the figure's
    lower left), as many pixels as ``savefig`` gives the box at :data:`DPI`; where the box
    (its padding) reaches past the figure, the figure's face colour."""
    w, h = int(box.width * DPI), int(box.height * DPI)
    x0, y0 = round(box.x0 * DPI), round((height - box.y1) * DPI)
    out = np.empty((h, w, 4), dtype=np.uint8)
    out[...] = np.round(np.asarray(matplotlib.colors.to_rgba(facecolor)) * 255).astype(np.uint8)
    r0, c0 = max(y0, 0), max(x0, 0)
    r1, c1 = min(y0 + h, pixels.shape[0]), min(x0 + w, pixels.shape[1])
    out[r0 - y0: r1 - y0, c0 - x0: c1 - x0] = pixels[r0:r1, c0:c1]
    return out


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
    lines_by(ax, long, "step", "loss", "split")
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


def write_not_measurable(claim: str, model: str, why: str, quantities: list[str] | tuple[str, ...],
                         tables: dict[str, list[str]], figure: str | None, scorecard: str) -> None:
    """What a rule writes when the model lacks its object (nothing a model lacks fails the
    run): each of ``tables`` (path → columns) empty with ``why`` in its metadata, ``figure``
    saying ``why`` in words, and the scorecard rows of ``quantities`` without a value and
    ``why`` as their detail (the findings read them as not measurable)."""
    for path, columns in tables.items():
        write_table(pd.DataFrame(columns=columns), path, {"claim": claim, "model": model, "not_measurable": why})
    if figure:
        words_figure(f"{claim} {model}", why, figure)
    write_table(not_measurable_rows(claim, model, why, quantities, next(iter(tables), figure or "")), scorecard)
