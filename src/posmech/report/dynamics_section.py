"""The report's "Training dynamics" section: the followed findings at each checkpoint.

Reads ``results/report/dynamics.csv`` (rule ``dynamics``; columns ``model, revision, step,
checkpoint, claim, quantity, value, label, verdict, reason``: one row per checkpoint of a
followed model and quantity, the checkpoint's own run of the analyses behind it) and renders
a self-contained block like :mod:`posmech.report.head_roles`: the figure
(:func:`posmech.plots.dynamics.dynamics_figure`), a paragraph saying what each quantity is
and how verdicts are marked, and a compact table, a row per model and quantity and a column
per checkpoint, each cell the value with its verdict mark (:data:`MARKS`).

:data:`posmech.verdicts.dynamics.QUANTITIES` says in words what each followed quantity is; the figure takes its panel
titles and axis labels from it too.
"""

from __future__ import annotations

import math
import re
from html import escape
from typing import Any

import pandas as pd
from markupsafe import Markup

from posmech.core.errors import PosmechError
from posmech.verdicts.dynamics import check_table, formation_steps, is_categorical, quantity

#: the mark of each verdict in a table cell (``n/m`` replaces the value when there is none)
MARKS = {"holds": "✓", "fails": "✗", "not measurable": "n/m"}
STEP_REVISION = re.compile(r"^step(\d+)$")


def checkpoint_column(revision: str, step: float) -> str:
    """The table's column of a checkpoint: its step (``50``) for a revision named ``stepN``,
    ``2000 (final)`` for another revision with a known step, the revision name otherwise."""
    m = STEP_REVISION.match(revision)
    if m:
        return m.group(1)
    if step == step:  # not NaN
        return f"{int(step)} ({revision})"
    return revision


def cell_text(value: float, label: str, verdict: str, categorical: bool) -> str:
    """A table cell: the value (3 significant digits) or, for a categorical quantity, its
    label; then the verdict's mark (:data:`MARKS`). ``n/m`` alone when nothing was measured."""
    shown = label if categorical else ("" if math.isnan(value) else f"{value:.3g}")
    mark = MARKS.get(verdict, "")
    if not shown:
        return mark or "—"
    return f"{shown} {mark}".strip()


def pivot(table: pd.DataFrame) -> tuple[list[str], list[dict[str, Any]]]:
    """The checkpoints' columns (by step, unknown steps last) and the rows (per model and
    quantity, in the table's order): ``{"model", "quantity", "claim", "cells": {column: {text,
    title, verdict, label}}}``."""
    t = table.assign(column=[checkpoint_column(r, s) for r, s in zip(table["revision"], table["step"])])
    dup = t[t.duplicated(["model", "quantity", "column"], keep=False)]
    if len(dup):
        first = dup.iloc[0]
        raise PosmechError(f"dynamics.csv: {len(dup)} rows share model {first['model']!r}, quantity "
                           f"{first['quantity']!r} and checkpoint {first['column']!r}; one row per checkpoint "
                           "and quantity (rerun rule dynamics)")
    order = t.drop_duplicates("column").assign(unknown=lambda d: d["step"].isna())
    columns = list(order.sort_values(["unknown", "step", "column"], kind="stable")["column"])
    rows = []
    for (model, q), g in t.groupby(["model", "quantity"], sort=False):
        cat = is_categorical(g)
        cells = {}
        for r in g.itertuples():
            title = f"{r.checkpoint or r.revision}: {r.verdict or 'no verdict'}"
            if r.label and not cat:
                title += f" ({r.label})"
            if r.reason:
                title += f"; {r.reason}"
            cells[r.column] = {"text": cell_text(float(r.value), r.label, r.verdict, cat), "title": title,
                               "verdict": r.verdict, "label": "" if cat else r.label}
        claims = ", ".join(dict.fromkeys(c for c in g["claim"] if c))
        rows.append({"model": model, "quantity": q, "claim": claims, "cells": cells})
    return columns, rows


STYLE = """<style>
#dynamics table.dyn td{white-space:nowrap;font-variant-numeric:tabular-nums;text-align:right}
#dynamics table.dyn td.v-holds{color:#11602a} #dynamics table.dyn td.v-fails{color:#8c1c13}
#dynamics table.dyn td.v-not-measurable{color:#777}
#dynamics table.dyn .lab{font-size:.75rem;color:#566;margin-left:.3em}
#dynamics table.dyn th.step{text-align:right} #dynamics table.dyn caption{text-align:left;font-size:.85rem;color:#566}
#dynamics ul.dyn-q{font-size:.9rem;margin:.3rem 0 .8rem} #dynamics ul.dyn-q li{margin:.1rem 0}
#dynamics figure img{max-width:100%;height:auto}
</style>"""


#: the quantities the section's always-visible lines summarise, first to last point
HEADLINE_QUANTITIES = ("largest_prev_token_mass", "p_redirected_after", "previous_candidate_score")


def headline_html(t: pd.DataFrame) -> str:
    """One line per model, visible without opening anything: each of
    :data:`HEADLINE_QUANTITIES` it has, from its first to its last point with a value (and the
    step it first reaches half of its last value: where the head forms)."""
    lines = []
    for m, g in t.groupby("model", sort=False):
        bits = []
        for q in HEADLINE_QUANTITIES:
            r = g[(g["quantity"] == q) & g["value"].notna()].sort_values("step", na_position="last")
            if r.empty:
                continue
            first, last = r.iloc[0], r.iloc[-1]
            half = r[r["value"] >= 0.5 * last["value"]] if last["value"] > first["value"] else r.iloc[:0]
            when = f", half of it first at step {int(half.iloc[0]['step'])}" if len(half) and pd.notna(
                half.iloc[0]["step"]) else ""
            bits.append(f"{escape(quantity(q).title)} {first['value']:.2f} → {last['value']:.2f}{when}")
        if bits:
            lines.append(f"<li><strong>{escape(m)}</strong>: {'; '.join(bits)}</li>")
    return f'<ul class="dyn-headline">{"".join(lines)}</ul>' if lines else ""


def formation_html(t: pd.DataFrame) -> str:
    """The order of formation (``dynamics.formation``, recorded in dynamics.csv's metadata by
    rule dynamics): per model, the step at which each role first holds and its rank; nothing
    when the table records no roles."""
    roles = dict(t.attrs.get("formation") or [])  # [[role, claims], ...] in the config's order
    if not roles:
        return ""
    f = formation_steps(t, roles)
    names = list(roles)
    head = "".join(f"<th>{escape(r.replace('_', ' '))}<br><small>{escape(', '.join(roles[r]))}</small></th>"
                   for r in names)
    body = []
    for model, g in f.groupby("model", sort=False):
        by = {r.role: r for r in g.itertuples()}
        cells = []
        for r in names:
            x = by[r]
            text = (f"step {int(x.step)} (#{int(x.rank)})" if pd.notna(x.step)
                    else "not followed" if "not followed" in x.reason else "not formed")
            cells.append(f'<td title="{escape(x.reason or x.checkpoint)}">{escape(text)}</td>')
        order = " → ".join(escape(r.replace("_", " ")) for r in g.dropna(subset=["step"]).sort_values(
            ["step"], kind="stable")["role"])
        body.append(f"<tr><th>{escape(model)}</th>{''.join(cells)}<td>{order or '—'}</td></tr>")
    return ('<table class="dyn-formation"><caption>Order of formation: the first checkpoint step at which each '
            "role's findings (under its name) hold, and its rank (Xu 2026: induction heads before the sink share "
            "grows); hover a cell for the checkpoint or why there is none</caption><thead><tr><th>model</th>"
            + head + "<th>order</th></tr></thead><tbody>" + "".join(body) + "</tbody></table>")


def dynamics_html(table: pd.DataFrame, figure_href: str | None, csv_href: str | None) -> Markup:
    """The section ``<section id="dynamics">`` from the dynamics table (:func:`check_table`
    applied here); ``figure_href``/``csv_href``: the copied figure and table, relative to the report."""
    t = check_table(table)
    columns, rows = pivot(t)
    models = list(dict.fromkeys(t["model"]))
    qs = list(dict.fromkeys(t["quantity"]))
    n_points = t.drop_duplicates(["model", "revision"]).groupby("model", sort=False).size()
    t.attrs = dict(table.attrs)
    parts = [STYLE, '<section id="dynamics"><h2>Training dynamics</h2>', headline_html(t), formation_html(t)]
    parts.append('<details class="dyn-body"><summary>the figure, the quantities in words and the table of every '
                 'checkpoint <span class="hint">click to open</span></summary>')
    parts.append(
        "<p>How the followed findings formed during training: "
        + ", ".join(f"{escape(m)} ({int(n_points[m])} checkpoints)" for m in models)
        + ". Each point is one checkpoint (a saved training step, or a revision of a Hub model) on which the "
        "analyses behind the followed quantities ran on their own, as they run on a model: its value and the "
        "verdict of the claim's finding at that checkpoint. In the figure, x is the training step on a symmetric "
        "log scale (linear near 0, so step 0 shows), one line per model in its colour; a filled marker: the "
        "finding holds at that checkpoint, an open marker: it fails, a ×: not measurable there (at the bottom of "
        "the panel when there is no value). In the table, a row per model and quantity and a column per "
        "checkpoint: the value, then ✓ holds, ✗ fails, n/m not measurable (hover a cell for the checkpoint, the "
        "head and the reason)"
        + (f"; <a href=\"{escape(csv_href)}\">dynamics.csv</a> has every row" if csv_href else "") + ".</p>")
    parts.append('<ul class="dyn-q">' + "".join(
        f"<li><strong>{escape(quantity(q).title)}</strong> (<code>{escape(q)}</code>): {escape(quantity(q).words)}</li>"
        for q in qs) + "</ul>")
    if figure_href:
        parts.append(f'<figure id="dynamics-figure"><a href="{escape(figure_href)}"><img src="{escape(figure_href)}" '
                     'alt="followed quantities against training step, one line per model"></a>'
                     f'<figcaption><p class="path">{escape(figure_href)}</p></figcaption></figure>')
    parts.append('<div class="scroll"><table class="dyn"><caption>The value at each checkpoint (columns: training '
                 "step) and the verdict of its claim's finding there</caption><thead><tr><th>model</th><th>claim</th>"
                 "<th>quantity</th>" + "".join(f'<th class="step">{escape(c)}</th>' for c in columns)
                 + "</tr></thead><tbody>")
    for r in rows:
        parts.append(f'<tr data-model="{escape(r["model"])}" data-quantity="{escape(r["quantity"])}">'
                     f'<th>{escape(r["model"])}</th><td>{escape(r["claim"])}</td>'
                     f'<th title="{escape(quantity(r["quantity"]).title)}"><code>{escape(r["quantity"])}</code></th>')
        for c in columns:
            cell = r["cells"].get(c)
            if cell is None:
                parts.append('<td class="none" title="no run at this checkpoint"></td>')
                continue
            lab = f'<span class="lab">{escape(cell["label"])}</span>' if cell["label"] else ""
            cls = f' class="v-{cell["verdict"].replace(" ", "-")}"' if cell["verdict"] else ""
            parts.append(f'<td{cls} title="{escape(cell["title"])}">{escape(cell["text"])}{lab}</td>')
        parts.append("</tr>")
    parts.append("</tbody></table></div></details></section>")
    return Markup("".join(parts))
