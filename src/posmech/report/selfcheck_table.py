"""The report's self-check block: expected vs obtained verdict per (claim, model).

Shown when the run's config has ``selfcheck.cases: true`` (config/selfcheck.yaml, ``make
selfcheck``): each expected verdict of a hand-built model (:mod:`posmech.verdicts.selfcheck`) beside the
verdict the run's findings table gave, compared by :func:`posmech.verdicts.selfcheck.compare` (the same
comparison as ``python -m posmech selfcheck``).  Self-contained (its own scoped CSS), like
:mod:`posmech.report.findings_grid`.
"""

from __future__ import annotations

from html import escape

import pandas as pd
from markupsafe import Markup

from posmech.verdicts.scorecard import claim_sort_key

STYLE = """<style>
#selfcheck table.sc{border-collapse:collapse;font-size:0.85em;width:100%}
#selfcheck table.sc th,#selfcheck table.sc td{border:1px solid #ccc;padding:2px 6px;text-align:left;white-space:nowrap}
#selfcheck td.v-holds{background:#c8ecc8}
#selfcheck td.v-fails{background:#f6c4c4}
#selfcheck td.v-not-measurable{background:#e6e6e6;color:#555}
#selfcheck td.v-missing{background:#ffe3b3}
#selfcheck tr.disagrees th,#selfcheck tr.disagrees td.r{color:#8c1c13;font-weight:bold}
#selfcheck tr.disagrees{outline:2px solid #c0392b}
#selfcheck table.sc td.why{white-space:normal;overflow-wrap:anywhere;width:100%;font-size:0.9em;color:#444}
#selfcheck .sc-summary.bad{color:#8c1c13;font-weight:bold}
</style>"""

CAPTION = (
    "The models of this run are hand-built (<code>src/posmech/verdicts/selfcheck.py</code>): for each finding listed, "
    "its construction fixes the verdict it must get, stated with the reason beside the model. The run judged "
    "them through the whole DAG like any model. Agreement shows that each finding's rule, quantity and "
    "threshold give <em>holds</em> where the mechanism is there and <em>fails</em> or <em>not measurable</em> "
    "where it is not (a finding covered both ways cannot pass vacuously); it says nothing about whether the "
    "findings hold on the posts' models. <code>python -m posmech selfcheck</code> exits non-zero on any "
    "disagreement.")


def _cls(verdict: str | None) -> str:
    return "v-missing" if verdict is None else "v-" + verdict.replace(" ", "-")


def selfcheck_html(table: pd.DataFrame, expected: dict[str, dict[str, str]] | None) -> Markup:
    """The self-check block (``<section id="selfcheck">``) of a findings table against the
    hand-built cases' expected verdicts (``{model: {claim: verdict}}``,
    :func:`posmech.verdicts.selfcheck.expected_verdicts`); empty when there are none."""
    if not expected:
        return Markup("")
    from posmech.verdicts.selfcheck import compare

    checks = sorted(compare(table, expected), key=lambda c: (claim_sort_key(c.claim), c.model))
    bad = [c for c in checks if not c.agrees]
    summary = (f"{len(checks) - len(bad)} of {len(checks)} expected verdicts obtained"
               + (f"; <strong>{len(bad)} disagree</strong> (outlined, listed first)" if bad else ": all agree"))
    parts = [STYLE, '<section id="selfcheck"><h2>Self-check: expected vs obtained verdicts</h2>',
             f"<p>{CAPTION}</p>", f'<p class="sc-summary{" bad" if bad else ""}">{summary}</p>',
             '<details class="fold" id="fold-selfcheck"' + (" open" if bad else "") + ">"
             "<summary>every expected (claim, model) pair · click to open</summary>",
             '<table class="sc"><tr><th>claim</th><th>model</th><th>expected</th><th>obtained</th>'
             "<th>value</th><th>result</th><th>reason the run gave</th></tr>"]
    for c in bad + [c for c in checks if c.agrees]:
        value = "" if c.value is None else f"{c.value:.4g}"
        result = "agrees" if c.agrees else ("DISAGREES: not in the findings table" if c.obtained is None
                                            else "DISAGREES")
        parts.append(f'<tr class="{"agrees" if c.agrees else "disagrees"}">'
                     f'<th><a href="#claim-{escape(c.claim)}">{escape(c.claim)}</a></th><td>{escape(c.model)}</td>'
                     f'<td class="{_cls(c.expected)}">{escape(c.expected)}</td>'
                     f'<td class="{_cls(c.obtained)}">{escape(c.obtained or "(missing)")}</td>'
                     f'<td>{value}</td><td class="r">{result}</td><td class="why">{escape(c.reason)}</td></tr>')
    parts.append("</table></details></section>")
    return Markup("".join(parts))
