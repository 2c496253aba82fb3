"""The findings grid at the top of the report: claims × models, one cell per verdict.

Self-contained (its own scoped CSS, no template): :func:`grid_html` turns
``results/report/findings.csv`` (:func:`posmech.verdicts.findings.findings_table`) into an HTML block.
Cells are coloured by verdict (``holds`` green, ``holds on null`` amber, ``fails`` red, ``not
measurable`` grey) and carry its glyph (:data:`GLYPHS`: ✓ holds, ✓◆ holds on null: passes the
threshold but does not beat the model's random-init twin by the margin, ✗ fails, n/m not
measurable), so the verdict reads without the colour; a structural finding (holds on any model
by construction, ``resources/findings.yaml``) is shown apart: its claim and cells marked ≡, its
cells blue-grey whatever the verdict, never green;
they show the measured value and carry the quantity judged, the threshold and the reason in
their ``title`` (hover).  Each row names the quantity its finding judges (column
"judges"): the grid judges that quantity against a threshold of this repository, while the
scorecard compares the posts' published values, which may be other quantities of the same
claim.  One small table per claim family, side by side, so the 36 claims fit a
1280-px-wide page without scrolling sideways.
"""

from __future__ import annotations

import math
from html import escape
from typing import Any

import pandas as pd
from markupsafe import Markup

from posmech.verdicts.findings import HOLDS_ON_NULL, VERDICTS
from posmech.verdicts.scorecard import FAMILIES, claim_sort_key, family

#: the glyph of each verdict in a cell (the colour is not the only cue)
GLYPHS = {"holds": "✓", HOLDS_ON_NULL: "✓◆", "fails": "✗", "not measurable": "n/m"}
NULL = "◆"  # after ✓: the finding holds on the model's random-init twin too (verdict holds on null)
STRUCTURAL = "≡"  # a finding that holds on any model by construction (resources/findings.yaml)
#: what the legend says each null is (config ``twins.weights``; posmech.models.twin)
NULL_SENTENCES = {
    "init": "a random-init twin of the same architecture",
    "shuffled": ("a shuffled twin (<code>twins.weights: shuffled</code>: the model's own weights with each parameter "
                 "tensor's entries permuted, its scale kept and its structure lost)"),
}

STYLE = """<style>
#findings .fg-families{display:flex;flex-wrap:wrap;gap:1em;align-items:flex-start}
#findings table.fg{border-collapse:collapse;font-size:0.85em}
#findings table.fg th,#findings table.fg td{border:1px solid #ccc;padding:2px 6px;text-align:center;white-space:nowrap}
#findings table.fg th.fg-claim{text-align:left;cursor:help}
#findings td.v-holds{background:#c8ecc8}
#findings td.v-fails{background:#f6c4c4}
#findings td.v-not-measurable{background:#e6e6e6;color:#555}
#findings td.v-holds-on-null{background:#f5e3a8}
#findings td.v-structural{background:#dde4ee;color:#334}
#findings .fg-legend span{display:inline-block;padding:1px 8px;margin-right:6px;border:1px solid #ccc}
#findings table.fg td.fg-q{text-align:left;vertical-align:middle;font-family:ui-monospace,monospace;font-size:10px;padding:2px 4px;color:#333}
#findings table.fg th.fg-q{text-align:left;font-weight:normal;font-size:0.85em;padding:2px 4px;color:#555}
#findings .fg-g{font-weight:bold}
#findings caption{font-weight:bold;text-align:left}
</style>"""


def _value(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/m"
    return f"{float(v):.3g}"


def _text(x: Any) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else str(x)


def reads_sentence(reads: Any, twins: set[str]) -> str:
    """The legend's sentence on what the run's twins read (``findings.meta.json`` ``twin_reads``,
    :func:`posmech.pipeline.sweep.twin_reads`; in ``table.attrs`` when read with
    :func:`posmech.store.tables.read_table`), for the twins in the grid; empty without it."""
    kinds: dict[tuple[float, bool], list[str]] = {}
    for t, r in sorted((reads or {}).items()):
        if t in twins and isinstance(r, dict):
            kinds.setdefault((float(r.get("documents_fraction", 1.0)), bool(r.get("claims_only"))), []).append(t)
    out = []
    for (fraction, only), names in kinds.items():
        who = "Each twin" if len(kinds) == 1 else "Twin" + ("s " if len(names) > 1 else " ") + ", ".join(names)
        if fraction >= 1 and not only:
            out.append(f" {who} read every document its model read and ran every analysis (with figures).")
            continue
        docs = (f"{fraction:g} of its model's documents (<code>twins.documents_fraction</code>: each document count "
                f"⌈{fraction:g} × n⌉, at least 2)" if fraction < 1 else "every document its model read")
        what = (", computing only what its verdicts read (<code>twins.claims_only</code>)" if only else "")
        out.append(f" {who} read {docs}{what}; docs/performance.md, \"Twins\".")
    return "".join(out)


def grid_html(table: pd.DataFrame) -> Markup:
    """The findings block (``<section id="findings">``) of a findings table; an explanatory
    paragraph when the table is empty."""
    parts = [STYLE, '<section id="findings"><h2>Findings: does each claim hold on this run\'s models?</h2>']
    if table is None or not len(table):
        parts.append("<p>No findings were judged (no model in this run).</p></section>")
        return Markup("".join(parts))
    # a random-init twin (config section `twins`) is not a column: its verdict marks its
    # model's cells (verdict holds on null: its finding holds on the twin too)
    twin_rows = table["twin_of"].astype(object).fillna("").astype(str) != "" if "twin_of" in table else pd.Series(False, table.index)
    twins = dict(zip(table.loc[twin_rows, "twin_of"].astype(str), table.loc[twin_rows, "model"].astype(str)))
    reads = table.attrs.get("twin_reads")  # findings.meta.json: what each twin read
    table = table[~twin_rows]
    models = list(dict.fromkeys(table["model"].astype(str)))
    # the quantity each claim's finding judges (one per claim: the finding's, aggregate included)
    quantities: dict[str, str] = {}
    for c, q in zip(table["claim"].astype(str), table["quantity"]):
        if _text(q):
            quantities.setdefault(c, _text(q))
    counts = {m: {v: int(((table["model"] == m) & (table["verdict"] == v)).sum()) for v in VERDICTS} for m in models}
    origins = table["origin"].astype(object).fillna("").astype(str) if "origin" in table else pd.Series("", table.index)
    structural = {m: int(((table["model"] == m) & (origins == "structural")).sum()) for m in models}
    no_null = {m: bool(((table["model"] == m) & (origins == "no null")).any()) for m in models}
    # which null the twins are (config `twins.weights`, column `twin_weights`; without it: init)
    kinds = (set(table["twin_weights"].astype(object).fillna("").astype(str)) - {""}
             if "twin_weights" in table else set())
    null_words = " or ".join(NULL_SENTENCES[k] for k in sorted(kinds or {"init"}) if k in NULL_SENTENCES)
    parts.append(
        "<p>Every claim is stated as a finding independent of any model (<code>resources/findings.yaml</code>; "
        "thresholds in the config section <code>findings</code>, each with its reason in "
        "<code>config/README.md</code>) and judged on every model of the run, against its null, "
        + null_words + " (config section <code>twins</code>): "
        '<span class="fg-legend"><span class="v-holds" style="background:#c8ecc8">✓ holds</span>'
        '<span class="v-holds-on-null" style="background:#f5e3a8">✓◆ holds on null</span>'
        '<span class="v-fails" style="background:#f6c4c4">✗ fails</span>'
        '<span class="v-not-measurable" style="background:#e6e6e6">n/m not measurable</span>'
        '<span class="v-structural" style="background:#dde4ee">≡ structural</span>'
        "</span> "
        "Cells show the measured value and the verdict's glyph; hover a cell for the threshold and the reason, "
        'a claim for its finding. Download: <a href="findings.csv">findings.csv</a>. '
        "<strong>✓ holds</strong>: the value passes the threshold and beats the twin's by the margin "
        "<code>findings.null_margin</code> × |threshold|; <strong>✓◆ holds on null</strong>: it passes the "
        "threshold but the twin does as well (a model without its structure gives it: not learned); <strong>≡ structural</strong>: "
        "the finding holds on any model by construction, so its verdict says nothing about the model "
        "(<code>resources/findings.yaml</code>, column <code>structural</code>). A model without a twin "
        "(<code>twins.enabled: false</code>) is marked <em>no null</em>: its ✓ was not compared with a random model."
        + reads_sentence(reads, set(twins.values()))
        + ' <span class="fg-quantities"><strong>Two comparisons:</strong> each row judges the quantity in its column '
        "<em>judges</em>"
        + (f" (P8: <code>{escape(quantities['P8'])}</code>)" if "P8" in quantities else "")
        + " against a threshold of this repository; the scorecard below compares the posts' published values, "
        "which may be other quantities of the claim (an identity check, a count): a pass there and a fail here "
        "do not contradict each other.</span></p><p>"
        + " · ".join(f"<strong>{escape(m)}</strong>: " + ", ".join(f"{v} {n}" for v, n in counts[m].items())
                     + (f" (≡ {structural[m]} structural)" if structural[m] else "")
                     + (" (no null: no random-init twin)" if no_null[m] else "")
                     for m in models) + "</p>")
    rows = table.to_dict("records")
    by = {(str(r["claim"]), str(r["model"])): r for r in rows}
    claims = sorted({str(r["claim"]) for r in rows}, key=claim_sort_key)
    sentence = {str(r["claim"]): _text(r.get("finding")) for r in rows}
    by_construction = {str(r["claim"]): _text(r.get("structural")) for r in rows if _text(r.get("structural"))}
    parts.append('<div class="fg-families">')
    for key, title in FAMILIES.items():
        fam = [c for c in claims if family(c) == key]
        if not fam:
            continue
        parts.append(f'<table class="fg"><caption title="{escape(title)}">{key}</caption><tr><th></th>'
                     '<th class="fg-q" title="the quantity the finding judges (scorecard row of its rule)">judges</th>')
        parts += [f"<th>{escape(m)}</th>" for m in models]
        parts.append("</tr>")
        for c in fam:
            q = quantities.get(c, "")
            why = f" Structural: {by_construction[c]}" if c in by_construction else ""
            parts.append(f'<tr><th class="fg-claim" title="{escape(sentence[c])} (judges {escape(q)}).{escape(why)}">'
                         f'<a href="#claim-{escape(c)}">{escape(c)}</a>{" " + STRUCTURAL if why else ""}</th>'
                         f'<td class="fg-q">{escape(q)}</td>')
            for m in models:
                r = by.get((c, m))
                if r is None:
                    parts.append("<td>—</td>")
                    continue
                verdict = str(r["verdict"])
                thr = r.get("threshold")
                tip = (f"{c} on {m}: {verdict}. Judges {_text(r.get('quantity'))}"
                       + (f" = {_value(r.get('value'))}" if _value(r.get("value")) != "n/m" else "")
                       + (f", threshold {_value(thr)}" if _value(thr) != "n/m" else "")
                       + f". {_text(r.get('reason'))}")
                if m in twins and _text(r.get("twin_verdict")):
                    tip += (f" Random-init twin {twins[m]}: {_text(r.get('twin_verdict'))}"
                            + (f" ({_value(r.get('twin_value'))})" if _value(r.get("twin_value")) != "n/m" else "")
                            + (f": {r.get('origin')}." if _text(r.get("origin")) else "."))
                glyph = GLYPHS.get(verdict, "?")
                kind = verdict.replace(" ", "-")
                if c in by_construction:  # apart: never green, whatever the verdict
                    glyph, kind = glyph + STRUCTURAL, "structural"
                shown = f"{_value(r.get('value'))} " if verdict != "not measurable" else ""
                parts.append(f'<td class="v-{kind}" title="{escape(tip)}">'
                             f'{shown}<span class="fg-g">{glyph}</span></td>')
            parts.append("</tr>")
        parts.append("</table>")
    parts.append("</div></section>")
    return Markup("".join(parts))
