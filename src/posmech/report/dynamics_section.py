"""The report's "Training dynamics" section: the followed findings at each checkpoint.

Reads ``results/report/dynamics.csv`` (rule ``dynamics``; columns ``model, revision, step,
checkpoint, claim, quantity, value, label, verdict, reason``: one row per checkpoint of a
followed model and quantity, the checkpoint's own run of the analyses behind it) and renders
a self-contained block like :mod:`posmech.report.head_roles`: the figure
(:func:`posmech.plots.dynamics.dynamics_figure`), a paragraph saying what each quantity is
and how verdicts are marked, and a compact table, a row per model and quantity and a column
per checkpoint, each cell the value with its verdict mark (:data:`MARKS`).

:data:`QUANTITIES` says in words what each followed quantity is; the figure takes its panel
titles and axis labels from it too.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from html import escape
from typing import Any

import pandas as pd
from markupsafe import Markup

from posmech.errors import PosmechError

COLUMNS = ("model", "revision", "step", "checkpoint", "claim", "quantity", "value", "label", "verdict", "reason")
VERDICTS = ("holds", "fails", "not measurable")
#: the mark of each verdict in a table cell (``n/m`` replaces the value when there is none)
MARKS = {"holds": "✓", "fails": "✗", "not measurable": "n/m"}
STEP_REVISION = re.compile(r"^step(\d+)$")


@dataclass(frozen=True)
class Quantity:
    """How a followed quantity is named in the figure and the report: ``title`` (panel title),
    ``axis`` (its unit, the y label) and ``words`` (one sentence: what it is)."""

    title: str
    axis: str
    words: str


QUANTITIES: dict[str, Quantity] = {
    "sharpest_previous_token_score": Quantity(
        "sharpest previous-token score", "mean attention to n − 1",
        "the largest previous-token score of any head: its mean attention from a query to the key just before it"),
    "sharpest_previous_token_layer": Quantity(
        "layer of the sharpest previous-token head", "layer",
        "the layer of the head with that score (the head's name is in the table)"),
    "previous_token_head_etc": Quantity(
        "ETC of the previous-token head", "effective token count (keys)",
        "the Effective Token Count 1 / Σ p_i² of that head's positional kernel: about 1 when it attends to one key, "
        "the number of keys when it attends uniformly"),
    "previous_token_head_kernel_type": Quantity(
        "kernel type of the previous-token head", "kernel type",
        "the type of that kernel (local, slow decay, uniform; K3/K4)"),
    "n_previous_token_heads": Quantity(
        "previous-token heads", "heads",
        "the number of heads whose largest mean diagonal is at offset −1 (P6's definition)"),
    "prev_token_head_fraction": Quantity(
        "fraction of previous-token heads", "fraction of all heads",
        "that number over all heads (P6's finding)"),
    "prev_token_mass_ratio_knocked": Quantity(
        "knock-out: previous-token mass kept", "knocked out / intact",
        "the sharpest head's attention to the previous position with the earlier layers' attention to it knocked "
        "out, over the intact attention, at the knocked-out queries (P5: small means strongly disrupted)"),
    "p_redirected_after": Quantity(
        "P(redirected word) after redirecting", "probability",
        "the probability of the redirected word after redirecting the sharpest head's attention and doubling "
        "its output (P16)"),
    "induction_score": Quantity(
        "best induction score", "attention to the induced key",
        "the largest induction score of a head in a layer ≥ 1: on [BOS] + R + R, its mean attention from the "
        "second copy to the key after the previous occurrence"),
    "previous_candidate_score": Quantity(
        "best previous-token mass (random tokens)", "mean attention at offset −1",
        "the best head's mean attention to the previous token of random-token sequences (L1)"),
    "look_back_two_candidate_score": Quantity(
        "best look-back-two mass (random tokens)", "mean attention at offset −2",
        "the best other head's mean attention two tokens back on random-token sequences (L5)"),
}
QUANTITIES["best_induction_score"] = QUANTITIES["induction_score"]
QUANTITIES.update({
    "min(diagonal_ratio)": Quantity(
        "sharpness of the sharpest previous-token head", "second / largest mean diagonal",
        "the smallest ratio, over previous-token heads, of a head's second-largest mean diagonal to its largest "
        "(P7: near 0 for one sharp head)"),
    "count(kernel_types)": Quantity(
        "kernel types present", "types",
        "how many of the kernel types (local, slow decay, uniform) at least one head has (K3)"),
    "count(layer0_local_heads)": Quantity(
        "layer-0 heads with a local kernel", "heads", "the number of layer-0 heads whose kernel type is local (K4)"),
})


def quantity(name: str) -> Quantity:
    """The words of quantity ``name``; for one :data:`QUANTITIES` does not name, its own name
    (the column of dynamics.csv, defined where the rule that computes it is documented)."""
    if name in QUANTITIES:
        return QUANTITIES[name]
    for prefix, what in (("n_kernel_", "whose positional kernel is of type"), ("n_l_role_", "whose L role is")):
        if name.startswith(prefix):  # a count per role (posmech.dynamics, heads_per_role)
            role = name[len(prefix):].replace("_", " ")
            return Quantity(f"heads: {role}", "heads",
                            f"the number of heads {what} {role} (the head-roles table's column)")
    return Quantity(name.replace("_", " "), name, f"{name} as its rule writes it")


def check_table(table: pd.DataFrame, source: str = "dynamics.csv") -> pd.DataFrame:
    """``table`` with its columns checked (every one of :data:`COLUMNS`, verdicts of
    :data:`VERDICTS` or empty), ``step`` numeric, ``label``/``verdict`` text ("" when empty)."""
    missing = [c for c in COLUMNS if c not in table.columns]
    if missing:
        raise PosmechError(f"{source}: no column(s) {missing}; the table of rule dynamics has {list(COLUMNS)} "
                           "(rerun `snakemake results/report/dynamics.csv`)")
    t = table.copy()
    t["step"] = pd.to_numeric(t["step"], errors="coerce")
    t["value"] = pd.to_numeric(t["value"], errors="coerce")
    for c in ("label", "verdict", "reason", "claim", "revision", "model", "quantity"):
        t[c] = t[c].fillna("").astype(str)
    bad = sorted(set(t["verdict"]) - set(VERDICTS) - {""})
    if bad:
        raise PosmechError(f"{source}: verdict(s) {bad} are none of {list(VERDICTS)} (column verdict); "
                           "the rule dynamics copies the findings' verdicts")
    return t


def is_categorical(rows: pd.DataFrame) -> bool:
    """A quantity told by its label (a kernel type), not by a number: no finite value and
    some non-empty label."""
    return not rows["value"].notna().any() and bool((rows["label"] != "").any())


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
HEADLINE_QUANTITIES = ("sharpest_previous_token_score", "p_redirected_after", "previous_candidate_score")


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


def dynamics_html(table: pd.DataFrame, figure_href: str | None, csv_href: str | None) -> Markup:
    """The section ``<section id="dynamics">`` from the dynamics table (:func:`check_table`
    applied here); ``figure_href``/``csv_href``: the copied figure and table, relative to the report."""
    t = check_table(table)
    columns, rows = pivot(t)
    models = list(dict.fromkeys(t["model"]))
    qs = list(dict.fromkeys(t["quantity"]))
    n_points = t.drop_duplicates(["model", "revision"]).groupby("model", sort=False).size()
    parts = [STYLE, '<section id="dynamics"><h2>Training dynamics</h2>', headline_html(t)]
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
