"""The published-vs-reproduced scorecard: ``resources/published.yaml`` × scorecard rows.

Every analysis rule writes ``results/{model}/scorecard/<rule>.csv`` (columns
``claim, model, quantity, value, detail, artifact``; see :mod:`posmech.store.tables`).  This
module reads the published values (format in the header of ``resources/published.yaml``)
and judges each reproduced value against its published one with the entry's tolerance.

Statuses (:data:`STATUSES`):

* ``pass`` / ``fail``: the reproduced value is within / outside the tolerance;
* ``other model``: the published value refers to another model (e.g. a ``gpt2`` head
  index on the demo model); the reason names both models;
* ``missing``: the run covers the claim (a row of the claim, or the entry's ``rule``
  wrote a scorecard) but has no value for this quantity: never shown as passing;
* ``qualitative``: a figure-only or verbal claim without a numeric criterion;
* ``nothing to measure``: the rule ran but the model has nothing it can measure (e.g. no
  layer below the sharp head to knock out); the rule wrote the row with an empty value
  and says why in its ``detail``, which becomes the reason;
* ``no published value``: a reproduced quantity the posts give no number for.

:data:`JUDGED` are the statuses of rows compared with a published value of their own
model; the report shows those first and the rest compactly (:func:`compact_rows`).
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from posmech.core.errors import PosmechError

STATUSES = ("pass", "fail", "other model", "missing", "qualitative", "nothing to measure", "no published value")
STATUS_MEANINGS = {
    "pass": "reproduced within the published value's tolerance, on the model the value was published for",
    "fail": "outside the tolerance (the reason says by how much)",
    "other model": "the published value belongs to another model than this row's: not compared; "
                      "what this model does is shown instead",
    "missing": "the run covers the claim on this model, but no rule wrote the quantity",
    "qualitative": "the posts make the claim in words or in a figure: judge the figure",
    "nothing to measure": "the rule ran and says why there is no value on this model (e.g. no head of the kind)",
    "no published value": "measured here; the posts give no number to compare with",
}
JUDGED = ("pass", "fail", "missing", "qualitative", "nothing to measure")
TOLERANCE_KINDS = ("abs", "rel", "range", "at_least", "at_most", "set", "min_jaccard", "subset")
FAMILIES = {
    "P": "Positional embeddings and previous-token heads",
    "L": "Previous-token and look-back-two heads (2-layer attention-only model)",
    "K": "Positional kernels and effective token count",
    "C": "Contextual neurons",
    "S": "Attention sinks and massive activations (beyond the posts)",
}
CLAIM_RE = re.compile(r"^([PLKCS])(\d+)$")
SCORECARD_COLUMNS = [
    "claim", "family", "model", "quantity", "what", "published", "published_model", "reproduced",
    "tolerance", "status", "reason", "source", "detail", "artifact", "rule",
    "published_number", "reproduced_number", "published_json", "reproduced_json",
]


def typed(prefix: str, v: Any) -> dict[str, Any]:
    """The typed columns of a published or reproduced value ``v``: ``<prefix>_number`` (a
    float when ``v`` is one number, else empty) and ``<prefix>_json`` (``v`` as JSON: a
    number, a list of heads, a mapping or text; empty when absent)."""
    number = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
    return {f"{prefix}_number": number, f"{prefix}_json": "" if v is None else json.dumps(v)}


def post(source: str) -> str:
    """A seed post's number as the scorecard writes it, ``post 000``: text that plain
    ``pandas.read_csv`` keeps as text (a bare ``000`` would read as the number 0); a source
    that is not a post's number (a paper and its table, the S claims) as it is."""
    return (f"post {source}" if source.isdigit() else source) if source else ""


def is_judged(row: dict[str, Any]) -> bool:
    """A scorecard row compared with a published value meant for its model: ``pass``,
    ``fail``, ``qualitative``; ``missing`` and ``nothing to measure`` only when there is a
    published value (an entry for another model would have made the row ``other
    model``); never a quantity the posts give no number for."""
    if row["status"] in ("missing", "nothing to measure"):
        published_model = row.get("published_model")
        return isinstance(published_model, str) and bool(published_model)  # NaN from a read CSV: none
    return row["status"] in JUDGED


@dataclass(frozen=True)
class Published:
    """One entry of ``resources/published.yaml``."""

    claim: str
    quantity: str
    model: str
    source: str
    what: str
    published: Any
    tolerance: dict[str, Any] | None
    any_model: bool = False
    note: str = ""
    rule: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def family(claim: str) -> str:
    """The family letter of a claim ID (``P7`` → ``P``); ``?`` when not a claim ID."""
    m = CLAIM_RE.match(str(claim))
    return m.group(1) if m else "?"


def claim_sort_key(claim: str) -> tuple[int, int, str]:
    m = CLAIM_RE.match(str(claim))
    if not m:
        return (len(FAMILIES), 0, str(claim))
    return (list(FAMILIES).index(m.group(1)), int(m.group(2)), "")


def _check_tolerance(tol: Any, where: str) -> None:
    if tol is None:
        return
    if not isinstance(tol, dict) or len(tol) != 1 or next(iter(tol)) not in TOLERANCE_KINDS:
        raise PosmechError(
            f"{where}: tolerance must be null or a one-key mapping with one of {', '.join(TOLERANCE_KINDS)}, "
            f"got {tol!r}"
        )
    kind, arg = next(iter(tol.items()))
    if kind == "range" and not (isinstance(arg, list) and len(arg) == 2):
        raise PosmechError(f"{where}: tolerance `range` needs [lo, hi], got {arg!r}")
    if kind == "set" and arg != "exact":
        raise PosmechError(f"{where}: tolerance `set` takes `exact`, got {arg!r}")
    if kind in ("abs", "rel", "at_least", "at_most", "min_jaccard") and not isinstance(arg, (int, float)):
        raise PosmechError(f"{where}: tolerance `{kind}` needs a number, got {arg!r}")


def load_published(path: str | os.PathLike[str]) -> list[Published]:
    """Read and validate the published values; raises :class:`PosmechError` naming the entry."""
    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as err:
        raise PosmechError(f"cannot read published values {str(path)!r}: {err}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("entries"), list):
        raise PosmechError(f"{str(path)!r}: expected a mapping with an `entries:` list (see the file's header)")
    out: list[Published] = []
    seen: set[tuple[str, str, str]] = set()
    required = ("claim", "quantity", "model", "source", "what", "published", "tolerance")
    for i, e in enumerate(doc["entries"]):
        where = f"{path} entry {i + 1} ({e.get('claim', '?')}/{e.get('quantity', '?')})" if isinstance(e, dict) else f"{path} entry {i + 1}"
        if not isinstance(e, dict):
            raise PosmechError(f"{where}: expected a mapping")
        lacking = [k for k in required if k not in e]
        if lacking:
            raise PosmechError(f"{where}: missing key(s) {', '.join(lacking)}")
        if family(e["claim"]) == "?":
            raise PosmechError(f"{where}: claim {e['claim']!r} is not an ID of a claim in docs/claims.md (P1, L2, K4, C3, …)")
        _check_tolerance(e["tolerance"], where)
        key = (e["claim"], e["quantity"], e["model"])
        if key in seen:
            raise PosmechError(f"{where}: duplicate entry for claim {key[0]} quantity {key[1]} model {key[2]}")
        seen.add(key)
        known = set(required) | {"any_model", "note", "rule"}
        out.append(
            Published(
                claim=str(e["claim"]), quantity=str(e["quantity"]), model=str(e["model"]),
                source=str(e["source"]), what=str(e["what"]), published=e["published"],
                tolerance=e["tolerance"], any_model=bool(e.get("any_model", False)),
                note=str(e.get("note", "") or ""), rule=e.get("rule"),
                extra={k: v for k, v in e.items() if k not in known},
            )
        )
    return out


def parse_value(raw: Any) -> Any:
    """A scorecard ``value`` cell → number, list, mapping or text; ``None`` when empty/NaN."""
    if raw is None:
        return None
    if isinstance(raw, float) and math.isnan(raw):
        return None
    if isinstance(raw, (int, float)):
        return raw
    s = str(raw).strip()
    if not s or s.lower() in ("nan", "none", "null"):
        return None
    try:
        v = json.loads(s)
    except ValueError:
        return s
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def _num(x: Any) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise TypeError(f"not a number: {x!r}")
    return float(x)


def _numbers(v: Any) -> list[float]:
    if isinstance(v, dict):
        return [_num(x) for x in v.values()]
    if isinstance(v, list):
        return [_num(x) for x in v]
    return [_num(v)]


def _pairs(published: Any, value: Any) -> list[tuple[str, float, float]]:
    """(label, published, reproduced) numeric pairs; raises ValueError when they do not line up."""
    if isinstance(published, dict):
        if not isinstance(value, dict):
            raise ValueError(f"expected a mapping like {published!r}, got {value!r}")
        absent = [k for k in published if k not in value]
        if absent:
            raise ValueError(f"reproduced value lacks {', '.join(map(str, absent))}")
        return [(str(k), _num(p), _num(value[k])) for k, p in published.items()]
    if isinstance(published, list):
        if not isinstance(value, list) or len(value) != len(published):
            raise ValueError(f"expected a list of {len(published)} numbers, got {value!r}")
        return [(f"[{i}]", _num(p), _num(v)) for i, (p, v) in enumerate(zip(published, value))]
    return [("", _num(published), _num(value))]


def _as_set(v: Any) -> set[str]:
    if isinstance(v, (list, tuple, set)):
        return {str(x) for x in v}
    if isinstance(v, dict):
        return {str(x) for x in v}
    return {str(v)}


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def judge(published: Any, tolerance: dict[str, Any] | None, value: Any) -> tuple[str, str]:
    """Compare a reproduced ``value`` with ``published`` under ``tolerance``.

    Returns ``(status, reason)`` with status ``pass``, ``fail``, ``missing`` (value is
    ``None``) or ``qualitative`` (``tolerance`` is ``None``)."""
    if value is None:
        return "missing", "no reproduced value"
    if tolerance is None:
        return "qualitative", "no numeric criterion: compare the figure with the post"
    kind, arg = next(iter(tolerance.items()))
    try:
        if kind in ("abs", "rel"):
            pairs = _pairs(published, value)
            worst = ("", 0.0, 0.0, 0.0)
            bad = []
            for label, p, v in pairs:
                err = abs(v - p)
                limit = arg if kind == "abs" else arg * abs(p)
                if err > limit + 1e-12:
                    bad.append(f"{label + ': ' if label else ''}|{_fmt(v)} − {_fmt(p)}| = {_fmt(err)} > {_fmt(limit)}")
                if err >= worst[1]:
                    worst = (label, err, limit, v)
            if bad:
                return "fail", "; ".join(bad)
            return "pass", f"max |Δ| = {_fmt(worst[1])} ≤ {_fmt(worst[2])}" + (f" ({worst[0]})" if worst[0] else "")
        if kind in ("at_least", "at_most", "range"):
            nums = _numbers(value)
            lo, hi = (arg, math.inf) if kind == "at_least" else (-math.inf, arg) if kind == "at_most" else tuple(arg)
            out = [x for x in nums if not (lo - 1e-12 <= x <= hi + 1e-12)]
            bound = f"≥ {_fmt(lo)}" if kind == "at_least" else f"≤ {_fmt(hi)}" if kind == "at_most" else f"in [{_fmt(lo)}, {_fmt(hi)}]"
            if out:
                return "fail", f"{', '.join(map(_fmt, out))} not {bound}"
            return "pass", f"{', '.join(map(_fmt, nums))} {bound}"
        a, b = _as_set(value), _as_set(published)
        if kind == "set":
            if a == b:
                return "pass", "same set"
            return "fail", f"extra {sorted(a - b) or '∅'}, lacking {sorted(b - a) or '∅'}"
        if kind == "min_jaccard":
            jac = len(a & b) / len(a | b) if a | b else 1.0
            status = "pass" if jac >= arg - 1e-12 else "fail"
            return status, f"Jaccard {jac:.2f} {'≥' if status == 'pass' else '<'} {arg:g} (shared {sorted(a & b)})"
        if kind == "subset":
            lacking = sorted(b - a)
            return ("fail", f"lacking {lacking}") if lacking else ("pass", "all published elements reproduced")
    except (TypeError, ValueError) as err:
        return "fail", f"not comparable: {err}"
    raise PosmechError(f"unknown tolerance kind {kind!r}")  # guarded by load_published


def format_value(v: Any) -> str:
    """Compact display of a published or reproduced value."""
    if v is None:
        return "—"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return _fmt(v)
    if isinstance(v, list):
        return ", ".join(format_value(x) for x in v) if v else "∅ (empty)"
    if isinstance(v, dict):
        return ", ".join(f"{k}: {format_value(x)}" for k, x in v.items())
    return str(v)


def format_tolerance(tol: dict[str, Any] | None) -> str:
    if tol is None:
        return "qualitative"
    kind, arg = next(iter(tol.items()))
    if kind == "abs":
        return f"|Δ| ≤ {arg:g}"
    if kind == "rel":
        return f"|Δ| ≤ {arg:g}·|published|"
    if kind == "at_least":
        return f"≥ {arg:g}"
    if kind == "at_most":
        return f"≤ {arg:g}"
    if kind == "range":
        return f"in [{arg[0]:g}, {arg[1]:g}]"
    if kind == "min_jaccard":
        return f"Jaccard ≥ {arg:g}"
    return {"set": "same set", "subset": "published ⊆ reproduced"}.get(kind, str(tol))


def rule_of(path: str | os.PathLike[str]) -> tuple[str, str]:
    """``(model, rule)`` of a scorecard path ``results/{model}/scorecard/{rule}.csv``."""
    p = Path(path)
    if p.parent.name != "scorecard" or p.suffix != ".csv":
        raise PosmechError(f"{str(path)!r} is not a scorecard path (results/{{model}}/scorecard/<rule>.csv)")
    return p.parent.parent.name, p.stem


def registered_rules(paths: list[str] | list[os.PathLike[str]]) -> dict[str, set[str]]:
    """``{model: {rule, …}}`` of the scorecard files a run registered (whether or not
    they hold a row for every claim): what :func:`build_scorecard` takes as ``registered``."""
    registered: dict[str, set[str]] = {}
    for p in paths:
        model, rule = rule_of(p)
        registered.setdefault(model, set()).add(rule)
    return registered


def failed_rules(paths: list[str] | list[os.PathLike[str]]) -> dict[tuple[str, str], str]:
    """``{(model, rule): the failure in words}`` of the scorecards among ``paths`` that are
    failure records (:func:`posmech.core.failures.words`: the error and the log's path)."""
    from posmech.core.failures import failure_of, words

    out = {}
    for p in paths:
        rec = failure_of(p)
        if rec is not None:
            out[rule_of(p)] = words(rec)
    return out


def read_scorecards(paths: list[str] | list[os.PathLike[str]]) -> pd.DataFrame:
    """Concatenate scorecard CSVs; adds ``rule`` (from the file name); checks the columns.
    A failure record (an analysis that failed on the model, :mod:`posmech.core.failures`)
    adds no row: :func:`failed_rules` names it."""
    from posmech.core.failures import failure_of
    from posmech.store.tables import SCORECARD_COLUMNS as COLS
    from posmech.store.tables import read_table

    frames = []
    for p in paths:
        if failure_of(p) is not None:
            continue
        try:
            df = read_table(p)
        except (pd.errors.EmptyDataError, pd.errors.ParserError, ValueError) as err:
            raise PosmechError(
                f"scorecard {str(p)!r} is not a readable table ({err}); rerun its rule "
                f"{rule_of(p)[1]!r} (delete the file first)"
            ) from None
        lacking = [c for c in COLS if c not in df.columns]
        if lacking:
            raise PosmechError(
                f"scorecard {str(p)!r} lacks column(s) {', '.join(lacking)}; write it with "
                "posmech.store.tables.scorecard_rows + write_table"
            )
        df = df[COLS].astype({"value": object})
        df["rule"] = rule_of(p)[1]
        frames.append(df)
    if not frames:
        return pd.DataFrame(columns=[*COLS, "rule"])
    return pd.concat(frames, ignore_index=True)


def _text(x: Any) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else str(x)


def writer(entry: Published, row: dict[str, Any] | None, siblings: Any = ()) -> str:
    """The analysis rule that writes ``entry``'s quantity (as the scorecard's ``rule`` column
    names it: the file ``results/{model}/scorecard/<rule>.csv``): the rule of its ``row``
    when there is one, else the entry's ``rule:`` (``resources/published.yaml``), else the
    one rule that wrote the other rows of its claim on the model (``siblings``), else the
    analysis that scores the claim's finding (:func:`posmech.core.families.claims`); ``""``
    when none is known."""
    if row and _text(row.get("rule")):
        return _text(row["rule"])
    if entry.rule:
        return str(entry.rule)
    rules = {_text(r.get("rule")) for r in siblings} - {""}
    if len(rules) == 1:
        return rules.pop()
    from posmech.core.families import claims

    scored = claims().get(entry.claim)
    return scored[0].name if scored else ""


def _not_computed(entry: Published, model: str, row: dict[str, Any] | None, siblings: Any = ()) -> str:
    """Why a row of another model's published value has no value, in words: the rule that
    writes the quantity (:func:`writer`) and, when the rule wrote the row empty with a
    ``detail``, the rule's reason."""
    rule = writer(entry, row, siblings)
    who = f"rule {rule}" if rule else "no rule of the run"
    why = _text(row.get("detail")) if row else ""
    if why:
        return f"not computed for it: {who} gives no {entry.quantity!r} for {model}: {why}"
    return f"not computed for it: {who} wrote no {entry.quantity!r} for {model}"


def build_scorecard(
    published: list[Published], rows: pd.DataFrame, registered: dict[str, set[str]] | None = None
) -> pd.DataFrame:
    """One row per (published entry, run model) of every claim the run covers, plus the
    reproduced quantities without a published value.

    ``rows``: scorecard rows (:func:`read_scorecards`); ``registered``: model → rules whose
    scorecard is part of the run (from the paths; an entry with ``rule:`` naming one of them
    is expected even when the file has no row of its claim).  Columns :data:`SCORECARD_COLUMNS`.
    """
    registered = {m: set(r) for m, r in (registered or {}).items()}
    models = list(dict.fromkeys([*registered, *map(str, rows["model"])]))
    by_key: dict[tuple[str, str, str], dict[str, Any]] = {}
    for r in rows.to_dict("records"):
        by_key[(str(r["claim"]), str(r["quantity"]), str(r["model"]))] = r
    covered = {(str(r["claim"]), str(r["model"])) for r in by_key.values()}
    rows_of: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in by_key.values():
        rows_of.setdefault((str(r["claim"]), str(r["model"])), []).append(r)
    for e in published:
        for m, rules in registered.items():
            if e.rule and e.rule in rules:
                covered.add((e.claim, m))
    out: list[dict[str, Any]] = []
    known: set[tuple[str, str]] = set()
    for e in published:
        known.add((e.claim, e.quantity))
        for m in models:
            if (e.claim, m) not in covered:
                continue
            row = by_key.get((e.claim, e.quantity, m))
            value = parse_value(row["value"]) if row else None
            applicable = e.any_model or e.model == m
            if not applicable:
                status = "other model"
                reason = f"published value refers to {e.model}; this row is {m}"
                if value is None:
                    reason += f" ({_not_computed(e, m, row, rows_of.get((e.claim, m), ()))})"
            elif value is None and row and _text(row["detail"]):
                status, reason = "nothing to measure", _text(row["detail"])
            else:
                status, reason = judge(e.published, e.tolerance, value)
                if status == "missing":
                    rule = writer(e, row, rows_of.get((e.claim, m), ()))
                    if row:
                        reason = (f"{f'rule {rule}' if rule else 'a rule'} wrote the row {e.quantity!r} for {m} "
                                  "without a value or a reason")
                    else:
                        reason = (f"the run covers {e.claim} on {m} but no row has quantity {e.quantity!r}"
                                  + (f" (expected from rule {rule})" if rule else ""))
            out.append(
                {
                    "claim": e.claim, "family": family(e.claim), "model": m, "quantity": e.quantity,
                    "what": e.what, "published": format_value(e.published), "published_model": e.model,
                    "reproduced": format_value(value), "tolerance": format_tolerance(e.tolerance),
                    "status": status, "reason": reason, "source": post(e.source),
                    "detail": _text(row["detail"]) if row else "", "artifact": _text(row["artifact"]) if row else "",
                    "rule": writer(e, row, rows_of.get((e.claim, m), ())),
                    **typed("published", e.published), **typed("reproduced", value),
                }
            )
    for (claim, quantity, m), row in by_key.items():
        if (claim, quantity) in known:
            continue
        value = parse_value(row["value"])
        out.append(
            {
                "claim": claim, "family": family(claim), "model": m, "quantity": quantity, "what": "",
                "published": "—", "published_model": "", "reproduced": format_value(value),
                "tolerance": "—",
                "status": "no published value" if value is not None
                else "nothing to measure" if _text(row["detail"]) else "missing",
                "reason": "the posts give no number for this quantity" if value is not None
                else _text(row["detail"]) or "no reproduced value",
                "source": "", "detail": _text(row["detail"]), "artifact": _text(row["artifact"]),
                "rule": _text(row.get("rule")), **typed("published", None), **typed("reproduced", value),
            }
        )
    df = pd.DataFrame(out, columns=SCORECARD_COLUMNS)
    if len(df):
        order = sorted(range(len(df)), key=lambda i: (claim_sort_key(df.claim[i]), df.model[i]))
        df = df.iloc[order].reset_index(drop=True)
    return df


def uncovered_claims(published: list[Published], scorecard: pd.DataFrame) -> list[str]:
    """Claim IDs of the published file that no model of the run covers (sorted)."""
    seen = set(scorecard["claim"])
    return sorted({e.claim for e in published} - seen, key=claim_sort_key)


def compact_rows(card: pd.DataFrame) -> list[dict[str, Any]]:
    """The rows of ``card`` that are not judged (:func:`is_judged`), one entry per (claim,
    model): what the model does, next to what was published for the posts' model.

    Each entry: ``claim, family, model, what`` (the claim's first ``what``), ``measured``
    (``[{quantity, value, detail}]`` of the quantities with a value), ``unmeasured``
    (``[{quantity, reason}]``: no value, with the rule's reason when it gave one),
    ``published`` (``[{quantity, value, model}]``, the posts' values), ``artifact`` (the
    first artifact named), ``statuses`` (the distinct statuses of its rows, in
    :data:`STATUSES` order)."""
    rest = card[[not is_judged(r) for r in card.to_dict("records")]] if len(card) else card
    out: list[dict[str, Any]] = []
    for (claim, model), g in rest.groupby(["claim", "model"], sort=False):
        entry: dict[str, Any] = {
            "claim": claim, "family": family(str(claim)), "model": model,
            "what": next((w for w in g["what"] if _text(w)), ""),
            "measured": [], "unmeasured": [], "published": [],
            "artifact": next((a for a in g["artifact"] if _text(a)), ""),
            "statuses": [st for st in STATUSES if st in set(g["status"])],
        }
        for r in g.to_dict("records"):
            if r["reproduced"] != "—":
                entry["measured"].append({"quantity": r["quantity"], "value": r["reproduced"],
                                          "detail": _text(r["detail"])})
            else:
                entry["unmeasured"].append({"quantity": r["quantity"],
                                            "reason": _text(r["detail"]) or _text(r["reason"])})
            if r["published"] != "—":
                entry["published"].append({"quantity": r["quantity"], "value": r["published"],
                                           "model": r["published_model"]})
        out.append(entry)
    out.sort(key=lambda e: (claim_sort_key(e["claim"]), str(e["model"])))
    return out
