"""The cross-model head-roles view of the report: which heads of each model hold which role.

Self-contained like :mod:`posmech.report.findings_grid` (its own scoped CSS): :func:`roles_html`
turns the per-model head-roles tables ``results/{model}/heads.csv`` (rule ``head_table``,
:mod:`posmech.verdicts.heads`) into one table, a row per role (:data:`ROLES`) and a column per model.
A cell lists the heads that pass the role's threshold, best first, each with the score the
role is decided on; ``none`` when the model's analysis ran and no head passes (for a role
with a score threshold, the L roles, followed by its best candidate and the words "below
threshold": never as a holder); ``—`` when the analysis did not run on the model.  The
scores are named as everywhere else (:mod:`posmech.core.names`).  At most
:data:`MAX_SHOWN` heads are written out (the rest counted, every head in the hover), so the
table fits a 1280-px page without scrolling sideways.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any, Callable

import pandas as pd
from markupsafe import Markup

from posmech.core.names import BELOW_THRESHOLD, RANDOM_OFFSET2_MASS, RANDOM_PREV_MASS, described

#: heads written out in one cell; the others are counted (and listed in the hover)
MAX_SHOWN = 6


@dataclass(frozen=True)
class Role:
    """A role of :data:`ROLES`: the heads whose ``column`` equals ``value``, ranked by
    ``score`` (largest first unless ``smaller_first``); ``threshold``: in words, what a head
    must pass and the config keys that set it (the hover of the role's name); ``best``: the role
    is decided by a threshold on ``score`` alone (the L roles: ``none`` then shows the best
    candidate, below threshold: a head whose ``column`` is none of ``taken``)."""

    label: str
    claims: str
    column: str
    value: Any
    score: str
    score_words: str
    smaller_first: bool = False
    threshold: str = ""
    taken: tuple[str, ...] = ()
    best: bool = False


PREV = ("largest mean diagonal at offset −1 and at least taxonomy.prev_token_min_excess more attention there than "
        "a head with zero query–key scores (uniform causal; ALiBi: its bias alone) gives on the same documents")
TAXON = ("median {0} of the score rows at least anatomy.taxa.{0}_min, with a {0} above anatomy.taxa.row_min on at "
         "least anatomy.taxa.fraction_min of the rows")
KERNEL = ("ETC / n_keys {0} (kernels.local_max_fraction, kernels.uniform_min_fraction), and not the type of the "
          "head's kernel with zero query–key scores (uniform; ALiBi: its bias alone)")
L_ROLE = "the best head's {0}, if at least attn_only.role_min_score.{1}"


ROLES: tuple[Role, ...] = (
    Role("previous-token head", "P6", "previous_token", True, "prev_token_excess",
         "mean attention at offset −1 above what a head with zero query–key scores gives there", threshold=PREV),
    Role("sharp previous-token head", "P7", "p7_chosen", "sharp", "diagonal_ratio",
         "second / largest mean diagonal (smaller = sharper)", True,
         "the previous-token head (as above) of the smallest ratio, or taxonomy.pin; when no head is one, the head "
         "the interventions read holds no role"),
    Role("early previous-token heads", "P7", "p7_chosen", "early", "diagonal_ratio",
         "second / largest mean diagonal (smaller = sharper)", True,
         "previous-token heads (as above) within the top taxonomy.early_top_n by ratio, below the sharp head's layer"),
    Role("dark main diagonal", "P13", "score_taxon", "dark diagonal", "taxon_dip", "median dip",
         threshold=TAXON.format("dip") + " and a median trend at least anatomy.taxa.trend_min"),
    Role("bright sub-diagonal", "P13", "score_taxon", "bright sub-diagonal", "taxon_bump", "median bump",
         threshold=TAXON.format("bump")),
    Role("local kernel", "K3/K4", "kernel_role", "local", "etc_fraction", "ETC / n_keys", True,
         KERNEL.format("below kernels.local_max_fraction")),
    Role("slow-decay kernel", "K3/K4", "kernel_role", "slow_decay", "etc_fraction", "ETC / n_keys", True,
         KERNEL.format("between the two")),
    Role("duplicate-token (layer 0)", "K7", "k7_class", "duplicate_token", "k7_duplicate_excess",
         "attention added to earlier copies of the token", threshold="at least contextual.duplicate_min_excess"),
    Role("detokenization (layer 0)", "K7", "k7_class", "detokenization", "k7_local_mass", "mass on the last keys",
         threshold="at least contextual.local_min_mass on the last contextual.local_window keys"),
    Role("contextual (layer 0)", "K7", "k7_class", "contextual", "k7_etc_fraction", "ETC / n_keys", True,
         "neither of the two above, and ETC / n_keys below contextual.uniform_min_fraction"),
    Role("previous (attention-only)", "L1", "l_role", "previous", "l_previous_mass", described(RANDOM_PREV_MASS),
         threshold=L_ROLE.format(RANDOM_PREV_MASS, "previous"), best=True),
    Role("look-back-two (attention-only)", "L5", "l_role", "look_back_two", "l_offset2_mass",
         described(RANDOM_OFFSET2_MASS), threshold=L_ROLE.format(RANDOM_OFFSET2_MASS, "look_back_two"),
         taken=("previous",), best=True),
    Role("induction (attention-only)", "L4", "l_role", "induction", "l_induction_score",
         "induction score on repeated random tokens", threshold=L_ROLE.format("induction score", "induction"),
         best=True),
    Role("attention sink", "S1", "sink", True, "sink_alpha0",
         "mean attention on the first token from the queries that see it (Gu et al.'s alpha[0])",
         threshold="mean alpha[0] over the samples above sinks.epsilon"),
)

STYLE = """<style>
#head-roles table.hr{border-collapse:collapse;font-size:0.85em;table-layout:fixed;width:100%}
#head-roles table.hr th,#head-roles table.hr td{border:1px solid #ccc;padding:2px 6px;text-align:left;vertical-align:top;overflow-wrap:anywhere}
#head-roles table.hr col.hr-role{width:17rem}
#head-roles td.hr-none{color:#8c1c13}
#head-roles td.hr-absent{color:#999}
#head-roles .hr-head{white-space:nowrap;margin-right:.5em}
</style>"""


def _is(value: Any, want: Any) -> bool:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return False
    if isinstance(want, bool):  # a True/False column read back from CSV (bool, or text when it has gaps)
        return (str(value).strip().lower() in ("true", "1", "1.0")) is want
    return str(value) == str(want)


def _filled(table: pd.DataFrame, column: str) -> bool:
    """Whether the model's analysis of ``column`` ran (some head has a value there)."""
    return column in table and bool((table[column].notna() & (table[column].astype(str) != "")).any())


def holders(table: pd.DataFrame, role: Role) -> list[tuple[str, float | None]] | None:
    """``[(head_name, score)]`` of the heads of one model's head-roles ``table`` that hold
    ``role``, best first; ``[]`` when none does; ``None`` when the analysis did not run on it."""
    if not _filled(table, role.column):
        return None
    hit = table[[_is(v, role.value) for v in table[role.column]]]
    score = pd.to_numeric(hit[role.score], errors="coerce") if role.score in hit else pd.Series(float("nan"),
                                                                                               index=hit.index)
    key: Callable[[tuple[str, float]], Any] = (
        lambda t: (math.isnan(t[1]), t[1] if role.smaller_first else -t[1]))
    pairs = sorted(((str(h), float(s)) for h, s in zip(hit["head_name"], score)), key=key)
    return [(h, None if math.isnan(s) else s) for h, s in pairs]


def best_candidate(table: pd.DataFrame, role: Role) -> tuple[str, float] | None:
    """The head with the best ``role.score`` among those whose ``role.column`` is none of
    ``role.taken`` (the role's candidates), and its score; ``None`` when no head has a score."""
    if role.score not in table:
        return None
    free = table[[not any(_is(v, t) for t in role.taken) for v in table[role.column]]]
    score = pd.to_numeric(free[role.score], errors="coerce")
    if score.notna().sum() == 0:
        return None
    i = score.idxmin() if role.smaller_first else score.idxmax()
    return str(free.loc[i, "head_name"]), float(score[i])


def _cell(found: list[tuple[str, float | None]] | None, role: Role, model: str,
          best: tuple[str, float] | None = None) -> str:
    if found is None:
        return f'<td class="hr-absent" title="the analysis of {escape(role.claims)} did not run on {escape(model)}">—</td>'
    if not found:
        if role.best and best is not None:
            h, s = best
            return (f'<td class="hr-none" title="no head of {escape(model)} passes the threshold of this role '
                    f'({escape(role.threshold)}); its best candidate, {escape(h)}, scores {s:.3g} '
                    f'({escape(role.score_words)}), {BELOW_THRESHOLD}">none <span class="small">(best '
                    f'<code>{escape(h)}</code> {s:.3g}, {BELOW_THRESHOLD})</span></td>')
        return (f'<td class="hr-none" title="no head of {escape(model)} passes the threshold of this role">'
                "none</td>")
    def one(h: str, s: float | None) -> str:
        return f'<span class="hr-head"><code>{escape(h)}</code>{"" if s is None else f" {s:.3g}"}</span>'
    shown = " ".join(one(h, s) for h, s in found[:MAX_SHOWN])
    more = len(found) - MAX_SHOWN
    every = ", ".join(h if s is None else f"{h} {s:.3g}" for h, s in found)
    tail = f' <span class="small">+{more} more</span>' if more > 0 else ""
    return f'<td title="{len(found)} head(s), best first ({escape(role.score_words)}): {escape(every)}">{shown}{tail}</td>'


def roles_html(tables: dict[str, pd.DataFrame], links: dict[str, str] | None = None) -> Markup:
    """The head-roles block (``<section id="head-roles">``) from ``{model: heads.csv table}``
    (the run's models in order); ``links[model]``: the href of its copied table."""
    links = links or {}
    parts = [STYLE, '<section id="head-roles"><h2>Head roles across models</h2>']
    if not tables:
        parts.append("<p>No model of this run is in a per-head analysis: no head roles.</p></section>")
        return Markup("".join(parts))
    parts.append(
        "<p>Which heads of each model hold each role the analyses assign, from the models' head-roles tables "
        "(" + ", ".join(f'<a href="{escape(links[m])}">{escape(m)}/heads.csv</a>' if m in links
                         else f"<code>{escape(m)}/heads.csv</code>" for m in tables)
        + "; columns in docs/artifacts.md). A cell lists the heads that pass the role's threshold, best "
        "first, with the score the role is decided on (hover: what the score is, and every head). Each "
        "threshold (hover the role's name) is set above what random-init heads score: no head of a random-init "
        "twin of GPT-2, Llama, GPT-NeoX, BLOOM, OPT or GPT-Neo holds any role (docs/claims.md, \"Head roles "
        "against random weights\"); a uniform kernel, what a random head has, is no role; "
        "<strong>none</strong>: the analysis ran and no head passes (a role decided by a score threshold names "
        f"its best candidate after it, \u201c{BELOW_THRESHOLD}\u201d: not a holder); "
        "—: the analysis did not run on that model.</p>")
    models = list(tables)
    parts.append('<table class="hr"><colgroup><col class="hr-role">'
                 + "".join("<col>" for _ in models) + "</colgroup><thead><tr><th>role</th>"
                 + "".join(f"<th>{escape(m)}</th>" for m in models) + "</tr></thead><tbody>")
    for role in ROLES:
        found = {m: holders(t, role) for m, t in tables.items()}
        if all(f is None for f in found.values()):
            continue
        parts.append(f'<tr data-role="{escape(role.column)}={escape(str(role.value))}">'
                     f'<th title="threshold: {escape(role.threshold)}; score: {escape(role.score_words)}">'
                     f'{escape(role.label)} '
                     f'<span class="small">{escape(role.claims)}</span></th>')
        parts += [_cell(found[m], role, m, best_candidate(tables[m], role) if found[m] == [] else None)
                  for m in models]
        parts.append("</tr>")
    parts.append("</tbody></table></section>")
    return Markup("".join(parts))


def read_tables(paths: list[str]) -> tuple[dict[str, pd.DataFrame], dict[str, str]]:
    """``({model: its head-roles table}, {model: its path})`` of the tables at ``paths``
    (``results/{model}/heads.csv``); the model is the table's ``model`` column (its folder when empty)."""
    from posmech.store.tables import read_table

    tables: dict[str, pd.DataFrame] = {}
    where: dict[str, str] = {}
    for p in paths:
        table = read_table(p)
        model = str(table["model"].iloc[0]) if len(table) else Path(os.fspath(p)).parent.name
        tables[model], where[model] = table, str(p)
    return tables, where


def read_roles(paths: list[str] | None, run_models: list[str], copy: Callable[[str], str] | None = None) -> Markup:
    """:func:`roles_html` of the head-roles tables at ``paths`` (``results/{model}/heads.csv``),
    in the order of ``run_models``; ``copy(path)`` copies a table next to the report and
    returns its href.  An empty block when ``paths`` is ``None`` (a report built without them)."""
    if paths is None:
        return Markup("")
    by_model, where = read_tables(paths)
    links = {m: copy(p) for m, p in where.items()} if copy is not None else {}
    order = [m for m in run_models if m in by_model] + [m for m in by_model if m not in run_models]
    return roles_html({m: by_model[m] for m in order}, links)
