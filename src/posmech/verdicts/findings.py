"""Model-independent findings and their verdicts: ``resources/findings.yaml`` × scorecard rows.

Every claim of ``docs/claims.md`` is stated in ``resources/findings.yaml`` as a *finding*:
a sentence that is true or false on any model, the scorecard quantity it reads (row
``quantity`` of ``results/{model}/scorecard/<rule>.csv``), a predicate and the key of its
threshold in the config section ``findings``.  :func:`judge` gives one (claim, model) its
verdict (:data:`VERDICTS`):

* ``holds`` / ``fails``: the value satisfies / does not satisfy ``value PREDICATE threshold``;
* ``not measurable``: the rule does not run on the model (not in its config section, or it
  cannot: :mod:`posmech.pipeline.applicability`, e.g. "no learned W_pos: rotary positions"), wrote no row with the quantity, or
  wrote the row without a number (its ``detail`` says why: e.g. "no contextual layer-0
  head"); the reason is always given in words.

Then each verdict is read against the model's null, its random-init twin
(:mod:`posmech.models.twin`; :func:`with_twins`, :func:`against_null`): a finding marked
``structural`` in ``resources/findings.yaml`` holds on any model by construction (K1, K5) and
keeps its verdict with ``origin`` ``structural``; any other finding that passes its threshold
``holds`` only when its value beats the twin's by the margin ``findings.null_margin`` × |threshold|
in the predicate's direction (``origin`` ``learned``), else its verdict is ``holds on null``
(``origin`` ``on null``: a random model of the same architecture does as well). A model without a
twin keeps ``holds`` with ``origin`` ``no null``.

Pure functions, no I/O except :func:`load_findings` (reads and validates the YAML against
``workflow/schemas/findings.schema.yaml``) and :func:`findings_table` (reads scorecards).
"""

from __future__ import annotations

import math
import operator
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from posmech.core.families import Analysis
from posmech.core.families import claims as declared_claims
from posmech.core.io import REPO
from posmech.core.errors import PosmechError

#: ``holds on null``: the value passes the threshold but does not beat the model's random-init
#: twin's by the margin (:func:`against_null`): a random model does as well
HOLDS_ON_NULL = "holds on null"
VERDICTS = ("holds", HOLDS_ON_NULL, "fails", "not measurable")
#: ``structural``: why the finding holds on any model by construction (resources/findings.yaml's
#: ``structural``), empty for a finding a model can fail
FINDINGS_COLUMNS = ["claim", "model", "verdict", "quantity", "value", "threshold", "reason", "rule", "finding",
                    "structural"]
#: what a model's random-init twin (posmech.models.twin) gave, beside the model's verdict
#: (:func:`with_twins`): ``twin_of`` on a twin's own rows (its model), ``twin_weights`` which
#: null the twin is (config ``twins.weights``: ``init`` or ``shuffled``; on a twin's rows and its
#: model's, empty without a twin), ``twin_verdict`` and ``twin_value`` on its model's rows,
#: ``null_margin`` (how far the value must beat the twin's, :func:`margin`) and ``origin``
#: (:data:`ORIGINS`)
TWIN_COLUMNS = ["twin_of", "twin_weights", "twin_verdict", "twin_value", "null_margin", "origin"]
#: how a reason names the twin of each null (config ``twins.weights``; posmech.models.twin): the
#: default ``init`` twin as it always was, a ``shuffled`` one (its model's own weights, each
#: tensor's entries permuted) by its null
TWIN_WORDS = {"init": "twin", "shuffled": "shuffled twin"}
#: ``structural``: the finding holds on any model by construction (any verdict); ``learned``:
#: holds, and beats the twin by the margin (or the twin has no value: it lacks what the finding
#: reads); ``on null``: verdict ``holds on null`` (not ``null``, which pandas.read_csv reads as
#: NaN); ``no null``: the model has no twin (twins off),
#: its verdicts are not compared with a random model; empty: fails or not measurable, or a
#: twin's own row
ORIGINS = ("structural", "learned", "on null", "no null")
#: the config key (section ``findings``) of the margin rule
NULL_MARGIN = "null_margin"
PREDICATES: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt, "==": operator.eq,
}
AGGREGATES = ("min", "max", "count", "ratio")
SCHEMA = REPO / "workflow" / "schemas" / "findings.schema.yaml"


@dataclass(frozen=True)
class Finding:
    """One finding: its entry of ``resources/findings.yaml`` (claim, sentence, not measurable,
    choice) and what judges it, declared with the analysis that scores it (``rule``: that
    analysis; quantity, predicate, threshold, aggregate: its ``claims:`` entry)."""

    claim: str
    finding: str
    rule: str
    quantity: str
    predicate: str
    threshold: str
    not_measurable: str
    aggregate: str | None = None
    choice: str = ""
    #: why the finding holds on any model by construction ("" when a model can fail it)
    structural: str = ""


@dataclass(frozen=True)
class Verdict:
    """The verdict of one finding on one model; ``value``/``threshold`` are ``None`` when
    there is no number."""

    claim: str
    model: str
    verdict: str
    quantity: str
    value: float | None
    threshold: float | None
    reason: str

    def row(self, finding: Finding) -> dict[str, Any]:
        return {"claim": self.claim, "model": self.model, "verdict": self.verdict, "quantity": self.quantity,
                "value": self.value, "threshold": self.threshold, "reason": self.reason,
                "rule": finding.rule, "finding": finding.finding, "structural": finding.structural}


def load_findings(path: str | os.PathLike[str], schema: str | os.PathLike[str] = SCHEMA,
                  analyses: Mapping[str, Analysis] | None = None) -> list[Finding]:
    """Read ``resources/findings.yaml`` and validate it against its JSON schema; one entry per
    claim, joined with what judges it: the ``claims:`` of the analysis that scores it
    (``workflow/analyses/<rule>.yaml``, :func:`posmech.core.families.claims`; ``analyses``:
    every declared one). Raises :class:`PosmechError` naming the entry and the problem: a
    claim twice, a finding no analysis scores, a claim an analysis scores without a finding."""
    import jsonschema

    if not Path(path).is_file():
        raise PosmechError(f"the findings file {str(path)!r} is missing: it ships with posmech (restore it: "
                           f"`git checkout -- resources/findings.yaml`)")
    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        sch = yaml.safe_load(Path(schema).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as err:
        raise PosmechError(f"cannot read findings {str(path)!r} or its schema: {err}") from None
    errors = sorted(jsonschema.Draft202012Validator(sch).iter_errors(doc), key=lambda e: list(map(str, e.path)))
    if errors:
        e = errors[0]
        where = "/".join(map(str, e.absolute_path)) or "(top)"
        raise PosmechError(f"{str(path)!r} at {where}: {e.message} (format: the file's header, {Path(schema).name})")
    scored = declared_claims(analyses)
    out: list[Finding] = []
    seen: set[str] = set()
    for e in doc["findings"]:
        if e["claim"] in seen:
            raise PosmechError(f"{str(path)!r}: claim {e['claim']} has two findings; keep one")
        seen.add(e["claim"])
        if e["claim"] not in scored:
            raise PosmechError(f"{str(path)!r}: no analysis scores claim {e['claim']}: add it to the `claims:` of the "
                               "analysis whose scorecard carries its quantity (workflow/analyses/<rule>.yaml)")
        a, c = scored[e["claim"]]
        out.append(Finding(claim=e["claim"], finding=e["finding"], rule=a.name, quantity=c.quantity,
                           predicate=c.predicate, threshold=c.threshold, not_measurable=e["not_measurable"],
                           aggregate=c.aggregate, choice=e.get("choice", ""), structural=e.get("structural", "")))
    unstated = sorted(set(scored) - seen)
    if unstated:
        raise PosmechError(f"{str(path)!r} has no finding for claim(s) {', '.join(unstated)}, which "
                           f"{', '.join(sorted({scored[c][0].source for c in unstated}))} scores: state each "
                           "finding (claim, finding, not_measurable)")
    return out


def check_thresholds(findings: list[Finding], thresholds: Mapping[str, Any]) -> None:
    """Every finding's threshold key is a number in the config section ``findings``."""
    bad = [f"{f.claim}: {f.threshold}" for f in findings
           if isinstance(thresholds.get(f.threshold), bool) or not isinstance(thresholds.get(f.threshold), (int, float))]
    if bad:
        raise PosmechError(f"config section `findings` lacks a number for {', '.join(bad)}; add the key "
                           "(workflow/schemas/config.schema.yaml documents each one)")


def check_null_margin(thresholds: Mapping[str, Any]) -> None:
    """``findings.null_margin`` is a number >= 0 (:func:`margin`)."""
    v = thresholds.get(NULL_MARGIN)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
        raise PosmechError(f"config key `findings.{NULL_MARGIN}` must be a number >= 0 (got {v!r}): the fraction of "
                           "each threshold by which a model must beat its random-init twin (config/README.md)")


def _number(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return None if math.isnan(float(x)) else float(x)


def reduce_value(value: Any, aggregate: str | None) -> tuple[float | None, str]:
    """A scorecard value (number, list, mapping, text) as one number by ``aggregate``;
    ``(None, why)`` when that is impossible."""
    if aggregate is None:
        v = _number(value)
        return (v, "") if v is not None else (None, f"the value {value!r} is not a number")
    if aggregate == "count":
        if isinstance(value, (list, dict)):
            return float(len(value)), ""
        return None, f"the value {value!r} is not a list to count"
    nums = list(value.values()) if isinstance(value, dict) else value if isinstance(value, list) else None
    if nums is None:
        return None, f"the value {value!r} is not a list or mapping of numbers"
    xs = [_number(x) for x in nums]
    if any(x is None for x in xs):
        return None, f"the value {value!r} holds something other than numbers"
    vals = [x for x in xs if x is not None]
    if not vals:
        return None, "the value is empty (nothing to take the " + aggregate + " of)"
    if aggregate == "min":
        return min(vals), ""
    if aggregate == "max":
        return max(vals), ""
    lo, hi = min(vals), max(vals)
    if lo <= 0:
        return None, f"a ratio of {value!r} needs positive numbers"
    return hi / lo, ""


def judge(finding: Finding, model: str, thresholds: Mapping[str, Any], row: Mapping[str, Any] | None,
          rule_ran: bool, inapplicable: str | None = None, failed: str | None = None) -> Verdict:
    """The verdict of ``finding`` on ``model``.

    ``row``: the scorecard row (``value`` parsed: number, list, mapping, text or ``None``;
    ``detail``) with the finding's quantity, ``None`` when there is none; ``rule_ran``:
    whether the finding's rule wrote a scorecard for the model; ``inapplicable``: why the
    rule cannot run on the model (:mod:`posmech.pipeline.applicability`), ``None`` when it can;
    ``failed``: the rule ran and failed on the model (its failure in words, with its log's
    path: :func:`posmech.verdicts.scorecard.failed_rules`), never read as a value."""
    from posmech.verdicts.scorecard import format_value

    thr = float(thresholds[finding.threshold])
    q = finding.quantity if not finding.aggregate else f"{finding.aggregate}({finding.quantity})"

    def nm(reason: str, value: float | None = None) -> Verdict:
        return Verdict(finding.claim, model, "not measurable", q, value, thr, reason)

    if failed:
        return nm(f"failed: rule {finding.rule} failed on {model}, so the finding was not measured: {failed}")
    if not rule_ran and inapplicable:
        return nm(f"rule {finding.rule} does not apply to {model}: {inapplicable}")
    if not rule_ran:
        return nm(f"rule {finding.rule} does not run on {model} (not in its config section's models); "
                  f"it is not measurable when: {finding.not_measurable}")
    if row is None:
        return nm(f"rule {finding.rule} wrote no row {finding.quantity!r} for {model} (quantity not computed)")
    raw = row.get("value")
    detail = str(row.get("detail") or "")
    if raw is None:
        return nm(detail or f"rule {finding.rule} gave {finding.quantity!r} no value for {model}")
    value, why = reduce_value(raw, finding.aggregate)
    if value is None:
        text = f"{format_value(raw)}" if isinstance(raw, str) else why
        return nm(f"{text}" + (f" ({detail})" if detail and detail not in text else ""))
    ok = PREDICATES[finding.predicate](value, thr)
    words = f"{value:.4g} {finding.predicate} {thr:g}" if ok else f"{value:.4g} is not {finding.predicate} {thr:g}"
    return Verdict(finding.claim, model, "holds" if ok else "fails", q, value, thr,
                   f"{words} (threshold findings.{finding.threshold})")


def findings_table(findings: list[Finding], thresholds: Mapping[str, Any], scorecards: list[str],
                   models: list[str], not_applicable: Mapping[str, Mapping[str, str]] | None = None,
                   twins: Mapping[str, str] | None = None, twin_weights: str = "init") -> pd.DataFrame:
    """One row per (finding, model of ``models``) in claim order: :data:`FINDINGS_COLUMNS`
    and :data:`TWIN_COLUMNS` (``twins``: ``{twin: its model}`` of the run, each verdict read
    against its model's twin, :func:`with_twins`; ``{}``: no model has a twin, origin ``no
    null``; ``None``: the plain threshold verdicts, not read against any null, as the dynamics
    sweep's checkpoints are; ``twin_weights``: which null the twins are, config ``twins.weights``).

    ``scorecards``: every ``results/{model}/scorecard/<rule>.csv`` of the run; a rule that
    wrote none for a model does not run on it; ``not_applicable``: ``{model: {rule: reason}}``
    of the rules that cannot run on a model (:func:`posmech.pipeline.applicability.not_applicable`),
    whose findings are not measurable with that reason; a scorecard that is a failure record
    (the rule failed on the model, :mod:`posmech.core.failures`) makes its findings not
    measurable with a reason starting ``failed:`` that names the error and the log."""
    from posmech.verdicts.scorecard import (claim_sort_key, failed_rules, parse_value, read_scorecards,
                                            registered_rules)

    check_thresholds(findings, thresholds)
    check_null_margin(thresholds)
    ran = registered_rules(scorecards)
    failed = failed_rules(scorecards)
    rows = read_scorecards(scorecards)
    # keyed by claim too: two claims of one rule may share a quantity name (L2's and L5's
    # posonly_pattern_offset1 are different heads')
    by_key: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for r in rows.to_dict("records"):
        by_key[(str(r["model"]), str(r["rule"]), str(r["claim"]), str(r["quantity"]))] = r
    out = []
    for f in sorted(findings, key=lambda f: claim_sort_key(f.claim)):
        for m in models:
            r = by_key.get((m, f.rule, f.claim, f.quantity))
            row = None if r is None else {"value": parse_value(r["value"]),
                                          "detail": "" if pd.isna(r["detail"]) else str(r["detail"])}
            skipped = (not_applicable or {}).get(m, {}).get(f.rule)
            out.append(judge(f, m, thresholds, row, f.rule in ran.get(m, set()), skipped,
                             failed.get((m, f.rule))).row(f))
    table = pd.DataFrame(out, columns=FINDINGS_COLUMNS)
    return with_twins(table, twins or {}, findings, thresholds, against=twins is not None, twin_weights=twin_weights)


def margin(finding: Finding, thresholds: Mapping[str, Any]) -> float:
    """How far a finding's value must beat its twin's to be learned: ``findings.null_margin``
    (a fraction) times the threshold's magnitude (the margin's reason: the schema's
    description of ``null_margin``)."""
    return float(thresholds[NULL_MARGIN]) * abs(float(thresholds[finding.threshold]))


def against_null(finding: Finding, verdict: str, value: float | None, twin_verdict: str | None,
                 twin_value: float | None, thresholds: Mapping[str, Any], twin_weights: str = "init") -> tuple[str, str, str]:
    """``(verdict, origin, words)`` of a model's verdict read against its twin's
    (``twin_verdict`` ``None``: the model has no twin); ``words`` is what the reason adds, and
    names the null (``twin_weights``, config ``twins.weights``: :data:`TWIN_WORDS`) where it compares.

    A structural finding keeps its verdict (origin ``structural``). A verdict other than
    ``holds`` is kept (origin empty; ``no null`` without a twin). ``holds`` stays ``holds``
    (``learned``) when the value beats the twin's by :func:`margin` in the predicate's
    direction (``>=``/``>``: above it, ``<=``/``<``: below it, ``==``: either way), or when the
    twin gives no value (it lacks what the finding reads); else it becomes ``holds on null``
    (``on null``). Without a twin it stays ``holds`` (``no null``)."""
    if finding.structural:
        return verdict, "structural", f"; structural: {finding.structural}"
    if twin_verdict is None:
        return verdict, "no null", ("; no null: the model has no random-init twin to compare with (config section "
                                    "`twins`)" if verdict == "holds" else "")
    if verdict != "holds" or value is None:
        return verdict, "", ""
    m = margin(finding, thresholds)
    twin = f"its {TWIN_WORDS.get(twin_weights, twin_weights)}"
    if twin_value is None:
        return "holds", "learned", f"; {twin} has no value ({twin_verdict}): learned"
    gap = {">=": value - twin_value, ">": value - twin_value, "<=": twin_value - value,
           "<": twin_value - value}.get(finding.predicate, abs(value - twin_value))
    if gap >= m and gap > 0:
        return "holds", "learned", f"; beats {twin}'s {twin_value:.4g} by {gap:.4g} >= the margin {m:.4g}"
    return HOLDS_ON_NULL, "on null", (f"; but {twin} gives {twin_value:.4g} ({twin_verdict}): not beaten by the "
                                   f"margin {m:.4g} (findings.{NULL_MARGIN} x |threshold|)")


def origin(verdict: str, twin_verdict: str | None) -> str:
    """The origin a model's plain verdict gets from its twin's verdict alone, without values
    (:func:`against_null` decides in the findings table): ``learned`` when the model holds and
    the twin does not, ``on null`` when both hold, ``no null`` without a twin, else ``""``."""
    if twin_verdict is None:
        return "no null"
    if verdict != "holds" or twin_verdict not in ("holds", HOLDS_ON_NULL, "fails"):
        return ""
    return "learned" if twin_verdict == "fails" else "on null"


def with_twins(table: pd.DataFrame, twins: Mapping[str, str], findings: list[Finding] | None = None,
               thresholds: Mapping[str, Any] | None = None, against: bool = True, twin_weights: str = "init") -> pd.DataFrame:
    """``table`` with :data:`TWIN_COLUMNS`, its verdicts read against the twins
    (:func:`against_null`; ``twins`` is ``{twin: its model}``): a model without a twin in the
    table gets empty twin columns and origin ``no null``; a twin's own rows keep their plain
    verdicts. ``findings`` and ``thresholds`` give each claim's predicate, margin and structural
    mark; without them (a table of verdicts only) the origin comes from the verdicts alone
    (:func:`origin`). ``against=False``: the plain verdicts, origin ``structural`` or empty.
    ``twin_weights``: which null the twins are (config ``twins.weights``), column
    ``twin_weights`` on the rows of a twin and of a model that has one."""
    t = table.copy()
    if "structural" not in t:
        t["structural"] = ""
    by_claim = {f.claim: f for f in findings or []}
    key = dict(zip(zip(t["claim"], t["model"]), zip(t["verdict"], t["value"])))
    twin_for = {m: tw for tw, m in twins.items() if tw in set(t["model"])}
    got = [key.get((c, twin_for[m])) if m in twin_for else None for c, m in zip(t["claim"], t["model"])]
    t["twin_of"] = [twins.get(m, "") for m in t["model"]]
    t["twin_weights"] = [twin_weights if m in twins or m in twin_for else "" for m in t["model"]]
    t["twin_verdict"] = [g[0] if g else "" for g in got]
    t["twin_value"] = [g[1] if g else None for g in got]
    verdicts, origins, reasons, margins = [], [], [], []
    for i, (c, m, v, g) in enumerate(zip(t["claim"], t["model"], t["verdict"], got)):
        f, reason = by_claim.get(c), t["reason"].iloc[i]
        if m in twins or not against:  # a twin's own row (the null itself), or no null asked for
            verdicts.append(v)
            origins.append("structural" if f is not None and f.structural else "")
            reasons.append(reason)
            margins.append(None)
            continue
        if f is None or thresholds is None:
            verdicts.append(v)
            origins.append(origin(v, g[0] if g else None))
            reasons.append(reason)
            margins.append(None)
            continue
        value = _number(t["value"].iloc[i])
        new, o, words = against_null(f, v, value, g[0] if g else None, _number(g[1]) if g else None, thresholds,
                                     twin_weights)
        verdicts.append(new)
        origins.append(o)
        reasons.append(f"{reason}{words}")
        margins.append(margin(f, thresholds) if not f.structural else None)
    t["verdict"], t["origin"], t["reason"], t["null_margin"] = verdicts, origins, reasons, margins
    return t[FINDINGS_COLUMNS + TWIN_COLUMNS]


def counts(table: pd.DataFrame) -> dict[str, dict[str, int]]:
    """``{model: {verdict: count}}`` of a findings table (every verdict listed)."""
    return {str(m): {v: int((g["verdict"] == v).sum()) for v in VERDICTS} for m, g in table.groupby("model", sort=False)}
