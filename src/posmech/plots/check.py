"""The figure check: what a reader needs from every figure, checked on the drawn figure.

:func:`posmech.plots.save` runs :func:`figure_problems` on every figure before writing it,
logs each problem as a warning (so it shows in the rule's log) and stores the result in
the PNG's text metadata under :data:`METADATA_KEY` (JSON: ``problems``, ``min_font_pt``,
``width_px``, ``n_annotations``), where :func:`read_check` reads it back; the tests assert
that every figure of the CI-sized run has none.  The rules (each problem names its axes by
title):

- **every axis labelled**: an x or y axis that shows tick labels has an axis label (a colour
  bar: a label on its long axis); an axis whose ticks are drawn but whose labels are hidden
  (shared axes) has a visible panel in the same column (x) or row (y) that shows them;
- **no blank tick labels**: no major tick label inside the view is empty or whitespace when
  others on that axis are not (a space token is drawn as ``␣``: :func:`visible_token`);
- **annotations round-trip their values**: a number written over a cell of an image or a
  heat map, read back, equals the cell's value to the precision it is written with;
- **fonts readable at report size**: every visible text is at least :data:`MIN_FONT_PT` pt
  once the figure is shrunk to :data:`REPORT_WIDTH_PX` pixels (when it is wider);
- **log axes**: one font size for all tick labels of an axis; an axis spanning under two
  decades is labelled with plain numbers (``20``, ``50``), not powers of ten;
- **masked cells**: an image with masked (NaN) cells draws them in an opaque colour that is
  not the colour map's own low end (a masked key must not read as zero attention), and the
  figure says so in words (a text containing "masked");
- **titles clear**: the figure's title (``suptitle``, of the figure or a subfigure) overlaps
  no axes title, no axes and no legend (a multi-line title over multi-line panel titles must not print
  over them: :func:`title_overlaps`).
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import Any

import numpy as np

METADATA_KEY = "posmech-figure-check"
MIN_FONT_PT = 6.0
REPORT_WIDTH_PX = 1200  # the widest the report shows a figure (its column at 1280 px), at 150 dpi
VISIBLE = {" ": "␣", "\n": "⏎", "\t": "⇥", "\r": "↵"}
_NUMBER = re.compile(r"^\s*([+\-−]?(?:\d+\.?\d*|\.\d+)(?:[eE][+\-]?\d+)?)\s*%?\s*$")


def visible_token(token: str, max_len: int = 14) -> str:
    """A token as a tick label that is never blank: space ``␣``, newline ``⏎``, tab ``⇥``,
    carriage return ``↵``; other characters as they are; cut to ``max_len`` characters."""
    text = "".join(VISIBLE.get(ch, ch) for ch in token)
    return (text if text.strip() else "∅")[:max_len]


def _is_colorbar(ax: Any) -> bool:
    return getattr(ax, "_colorbar", None) is not None


def _shown(artist: Any) -> bool:
    return bool(artist.get_visible()) and bool(artist.get_text().strip())


def _name(ax: Any) -> str:
    t = ax.get_title() or ax.get_title(loc="left") or ""
    if t:
        return repr(t.splitlines()[0][:50])
    return f"axes at {tuple(round(float(v), 2) for v in ax.get_position().bounds)}"


def _tick_labels(axis: Any, minor: bool = False) -> list[Any]:
    """The tick label texts of ``axis`` inside its view interval."""
    lo, hi = sorted(axis.get_view_interval())
    span = hi - lo
    ticks = axis.get_minor_ticks() if minor else axis.get_major_ticks()
    locs = axis.get_minorticklocs() if minor else axis.get_majorticklocs()
    out = []
    for tick, loc in zip(ticks, locs):
        if not (lo - 1e-9 * max(span, 1) <= loc <= hi + 1e-9 * max(span, 1)) or not tick.get_visible():
            continue
        out += [lab for lab in (tick.label1, tick.label2) if lab.get_visible()]
    return out


def _cell_value(ax: Any, x: float, y: float) -> float | None:
    """The value of the image or heat-map cell under data point ``(x, y)``, or None."""
    for im in ax.images:
        A = np.ma.asarray(im.get_array())
        if A.ndim != 2:
            continue
        left, right, bottom, top = im.get_extent()
        R, C = A.shape
        c = math.floor((x - left) / (right - left) * C)
        r = math.floor((y - top) / (bottom - top) * R) if im.origin == "upper" else \
            math.floor((y - bottom) / (top - bottom) * R)
        if 0 <= r < R and 0 <= c < C:
            v = A[r, c]
            return float("nan") if np.ma.is_masked(v) else float(v)
    from matplotlib.collections import QuadMesh

    for mesh in ax.collections:
        if not isinstance(mesh, QuadMesh):
            continue
        coords = mesh.get_coordinates()  # [R+1, C+1, 2]
        xs, ys = coords[0, :, 0], coords[:, 0, 1]
        c = int(np.searchsorted(xs, x)) - 1
        r = int(np.searchsorted(ys, y)) - 1 if ys[-1] > ys[0] else None
        if r is None:
            continue
        A = np.ma.asarray(mesh.get_array()).reshape(len(ys) - 1, len(xs) - 1)
        if 0 <= r < A.shape[0] and 0 <= c < A.shape[1]:
            v = A[r, c]
            return float("nan") if np.ma.is_masked(v) else float(v)
    return None


def _round_trips(text: str, value: float) -> bool:
    m = _NUMBER.match(text)
    if not m:
        return True  # not a number (a letter, a word): nothing to compare
    s = m.group(1).replace("−", "-")
    shown = float(s)
    if text.strip().endswith("%"):
        shown /= 100
    mant = s.lower().split("e")[0]
    decimals = len(mant.split(".")[1]) if "." in mant else 0
    exp = int(s.lower().split("e")[1]) if "e" in s.lower() else 0
    unit = 10.0 ** (exp - decimals) / (100 if text.strip().endswith("%") else 1)
    return math.isfinite(value) and abs(shown - value) <= 0.5 * unit + 1e-9 * max(1.0, abs(value))


def _texts(fig: Any, axes: list[Any]) -> list[Any]:
    """Every text artist of the figure that a reader sees: figure texts (titles of the
    figure and its subfigures), legends, and per visible axes its titles, texts, legend and,
    when its axis is drawn, axis labels, offset texts and tick labels inside the view."""
    out: list[Any] = []
    figs = [fig]
    while figs:
        f = figs.pop()
        out += list(f.texts)
        for leg in f.legends:
            out += list(leg.get_texts()) + [leg.get_title()]
        figs += list(getattr(f, "subfigs", []))
    for ax in axes:
        out += [ax.title, ax._left_title, ax._right_title, *ax.texts]
        if ax.get_legend() is not None:
            out += list(ax.get_legend().get_texts()) + [ax.get_legend().get_title()]
        if ax.axison:
            for axis in (ax.xaxis, ax.yaxis):
                out += [axis.label, axis.get_offset_text(), *_tick_labels(axis), *_tick_labels(axis, minor=True)]
    return [t for t in out if _shown(t)]


def _overlap(a: Any, b: Any, tol: float = 1.0) -> bool:
    """Whether two window boxes (pixels) overlap by more than ``tol`` pixels each way."""
    return min(a.x1, b.x1) - max(a.x0, b.x0) > tol and min(a.y1, b.y1) - max(a.y0, b.y0) > tol


def title_overlaps(fig: Any, renderer: Any = None) -> list[str]:
    """What the figure's title (the ``suptitle`` of the figure and of each subfigure) prints
    over, as drawn last: each visible axes title it overlaps (``"'<title>' title"``), each
    axes with its axis drawn whose frame it overlaps (``"'<title>' axes"``; 3-D axes are left
    out: their frame is mostly empty), and each legend (``"a legend"``).  Empty when the
    titles are clear."""
    renderer = renderer or fig.canvas.get_renderer()
    tops: list[Any] = []
    figs = [fig]
    while figs:
        f = figs.pop()
        sup = getattr(f, "_suptitle", None)
        if sup is not None and _shown(sup):
            tops.append(sup)
        figs += list(getattr(f, "subfigs", []))
    out: list[str] = []
    for sup in tops:
        box = sup.get_window_extent(renderer)
        for ax in fig.get_axes():
            if not ax.get_visible():
                continue
            if any(_shown(t) and _overlap(box, t.get_window_extent(renderer))
                   for t in (ax.title, ax._left_title, ax._right_title)):
                out.append(f"{_name(ax)} title")
            elif ax.axison and getattr(ax, "name", "") != "3d" and _overlap(box, ax.get_window_extent(renderer)):
                out.append(f"{_name(ax)} axes")
        legends = list(fig.legends) + [ax.get_legend() for ax in fig.get_axes() if ax.get_legend() is not None]
        out += ["a legend" for leg in legends if leg.get_visible() and _overlap(box, leg.get_window_extent(renderer))]
    return out


def figure_problems(fig: Any, width_px: float | None = None, drawn: bool = False) -> dict[str, Any]:
    """Check a drawn (or drawable) figure; returns ``{"problems": [...], "min_font_pt",
    "width_px", "n_annotations"}``.  ``width_px``: the PNG's width (default: the tight
    bounding box at the figure's dpi for :func:`posmech.plots.save`'s 150).  ``drawn``: the
    caller has just drawn the figure (``fig.draw_without_rendering()``) and changed nothing
    since, so the check reads its layout as it is instead of drawing it again."""
    from posmech.plots import DPI

    if not drawn:
        fig.draw_without_rendering()
    if width_px is None:
        bbox = fig.get_tightbbox(fig.canvas.get_renderer())
        width_px = float(bbox.width * DPI)
    shrink = min(1.0, REPORT_WIDTH_PX / max(width_px, 1.0))
    problems: list[str] = []
    every = [ax for ax in fig.get_axes() if ax.get_visible()]
    axes = [ax for ax in every if ax.axison]

    fonts = [(float(t.get_fontsize()), t.get_text()) for t in _texts(fig, every)]
    small = sorted({(round(s, 2), txt[:25]) for s, txt in fonts if s * shrink < MIN_FONT_PT - 1e-6})
    if small:
        problems.append(f"text under {MIN_FONT_PT:g} pt at report size (shrink {shrink:.2f}): "
                        + "; ".join(f"{s:g} pt {txt!r}" for s, txt in small[:6])
                        + (f" (+{len(small) - 6} more)" if len(small) > 6 else ""))

    def panels_along(ax: Any, which: str) -> list[Any]:
        """Visible axes in the same column (x) or row (y) as ``ax``."""
        p = ax.get_position()
        out = []
        for other in axes:
            if other is ax or _is_colorbar(other):
                continue
            q = other.get_position()
            if which == "x" and min(p.x1, q.x1) - max(p.x0, q.x0) > 0.5 * min(p.width, q.width):
                out.append(other)
            if which == "y" and min(p.y1, q.y1) - max(p.y0, q.y0) > 0.5 * min(p.height, q.height):
                out.append(other)
        return out

    over = title_overlaps(fig)
    if over:
        problems.append("the figure's title overlaps " + ", ".join(over[:4]) + (f" (+{len(over) - 4} more)"
                                                                             if len(over) > 4 else ""))
    words = " ".join(t.get_text() for t in _texts(fig, every)).lower()
    for ax in every:
        for im in ax.images:
            A = np.ma.masked_invalid(np.ma.asarray(im.get_array()))
            if not np.ma.is_masked(A):
                continue
            cmap = im.get_cmap()
            bad, low = cmap(np.ma.masked_invalid([np.nan]))[0], cmap(0.0)
            if bad[3] < 1 or np.allclose(bad[:3], low[:3], atol=0.05):
                problems.append(f"{_name(ax)}: masked cells drawn {'transparent' if bad[3] < 1 else 'as the low end'}"
                                " of the colour map (give it a grey: cmap.with_extremes(bad=posmech.plots.MASKED))")
            elif "masked" not in words:
                problems.append(f"{_name(ax)}: masked cells drawn but no text of the figure says what they are")
    n_annot = 0
    for ax in axes:
        cbar = _is_colorbar(ax)
        for which, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            labels = _tick_labels(axis)
            texts = [lab.get_text() for lab in labels]
            nonblank = [t for t in texts if t.strip()]
            has_ticks = len(axis.get_majorticklocs()) > 0 and any(t.get_visible() for t in axis.get_major_ticks())
            long_axis = (which == "y") == (ax.get_position().height >= ax.get_position().width)
            if nonblank and len(nonblank) < len(texts) and axis.get_scale() != "log":
                problems.append(f"{_name(ax)}: {which} axis has blank tick labels among {nonblank[:3]}…")
            minor = [lab for lab in _tick_labels(axis, minor=True) if lab.get_text().strip()]
            shown = [lab for lab in labels if lab.get_text().strip()] + minor
            if cbar and not long_axis:
                continue
            if shown and not axis.get_label_text().strip():
                shared = ax.get_shared_x_axes() if which == "x" else ax.get_shared_y_axes()
                labelled = [o for o in panels_along(ax, "y" if which == "y" else "x")
                            if shared.joined(ax, o) and getattr(o, f"get_{which}label")().strip()]
                if not labelled:
                    problems.append(f"{_name(ax)}: {which} axis has tick labels but no axis label")
            if has_ticks and not shown and not cbar:
                along = [o for o in panels_along(ax, which)
                         if any(lab.get_text().strip() for lab in _tick_labels(getattr(o, f"{which}axis")))]
                if not along:
                    problems.append(f"{_name(ax)}: {which} axis has ticks but no panel in its "
                                    f"{'column' if which == 'x' else 'row'} shows their labels")
            if shown and len({round(float(lab.get_fontsize()), 2) for lab in shown}) > 1:
                problems.append(f"{_name(ax)}: {which} tick labels in mixed font sizes "
                                f"{sorted({float(lab.get_fontsize()) for lab in shown})}")
            if axis.get_scale() == "log":
                lo, hi = sorted(axis.get_view_interval())
                powers = [t for t in shown if "10^" in t.get_text() or "$" in t.get_text()
                          or re.search(r"10[⁰¹²³⁴⁵⁶⁷⁸⁹⁻]", t.get_text())]
                if lo > 0 and hi / lo < 100 and powers:
                    problems.append(f"{_name(ax)}: log {which} axis spans {hi / lo:.3g}× (under two decades) "
                                    f"but is labelled in powers of ten")
        for t in ax.texts:
            if not _shown(t) or t.get_transform() != ax.transData:
                continue
            x, y = t.get_position()
            v = _cell_value(ax, float(x), float(y))
            if v is None or not _NUMBER.match(t.get_text()):
                continue
            n_annot += 1
            if not _round_trips(t.get_text(), v):
                problems.append(f"{_name(ax)}: annotation {t.get_text()!r} at ({x:g}, {y:g}) but the cell "
                                f"holds {v:.4g}")
    return {"problems": problems, "min_font_pt": min((s for s, _ in fonts), default=None),
            "width_px": round(width_px), "n_annotations": n_annot}


def read_check(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The figure check stored in a PNG written by :func:`posmech.plots.save`."""
    from PIL import Image

    with Image.open(path) as im:
        raw = im.info.get(METADATA_KEY) or getattr(im, "text", {}).get(METADATA_KEY)
    if raw is None:
        raise KeyError(f"{path}: no {METADATA_KEY!r} metadata (not written by posmech.plots.save)")
    return json.loads(raw)
