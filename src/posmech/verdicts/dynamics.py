"""Findings across training: the quantities the ``dynamics`` section follows, per checkpoint.

A model's checkpoints (:mod:`posmech.models.checkpoints`) are models of the run that run only
the analysis families the followed quantities need (:func:`sweep_analyses`); rule
``dynamics`` gathers, for every point of every sweep (each checkpoint, then the model itself),
one row per followed quantity (:func:`dynamics_table`, ``results/report/dynamics.csv``):

* each followed **finding** (``dynamics.claims``, resources/findings.yaml): its quantity, value
  and verdict at that checkpoint, judged against the same thresholds as the findings grid
  (:func:`posmech.verdicts.findings.findings_table`) but not against a null: a checkpoint has
  no random-init twin, so every point's verdict is the plain threshold verdict (the grid may
  say ``holds on null`` where the sweep's last point, the model itself, says ``holds``);
* quantities of the checkpoint's **head-roles table** (``dynamics.heads``; rule head_table,
  ``results/{model}/heads.csv``), each under the claim whose verdict it carries:

  - ``largest_prev_token_mass`` (P6): the largest previous-token mass of any head (mean
    attention from query n to key n − 1, the taxonomy's ``prev_token_mass``); ``label``: the
    head; ``largest_prev_token_mass_layer`` (P6): that head's layer;
  - ``previous_token_head_etc`` (K3): that head's Effective Token Count (its positional
    kernel's, rule etc_table); ``previous_token_head_kernel_type`` (K3): its kernel type, in
    ``label`` (``value`` empty: a category);
  - ``heads_per_role`` : ``n_previous_token_heads`` (P6; heads whose previous-token mass passes
    the taxonomy's threshold over a uniform causal head's, ``previous_token``), ``n_kernel_<type>`` (K3; heads per kernel type) and
    ``n_l_role_<role>`` (L1; heads per L role), each counted over the heads of the checkpoint
    (a role the sweep's tables never assign has no row).

A quantity the checkpoint's tables do not carry (its family cannot run on the model, or the
table has no such head) is ``not measurable`` with the reason, never 0.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from posmech.core.errors import PosmechError
from posmech.core.names import PREV_TOKEN_MASS, RANDOM_OFFSET2_MASS, RANDOM_PREV_MASS, WORDS
from posmech.core.families import FAMILIES, rule_of

#: the columns of results/report/dynamics.csv
DYNAMICS_COLUMNS = ["model", "revision", "step", "checkpoint", "claim", "quantity", "value", "label", "verdict",
                    "reason"]
#: :data:`DYNAMICS_COLUMNS` as the table check reads them
COLUMNS = tuple(DYNAMICS_COLUMNS)
VERDICTS = ("holds", "fails", "not measurable")


@dataclass(frozen=True)
class Quantity:
    """How a followed quantity is named in the figure and the report: ``title`` (panel title),
    ``axis`` (its unit, the y label), ``words`` (one sentence: what it is) and ``count``
    (a number of heads or of types: never below 0, its axis starts there)."""

    title: str
    axis: str
    words: str
    count: bool = False


QUANTITIES: dict[str, Quantity] = {
    "largest_prev_token_mass": Quantity(
        f"largest {PREV_TOKEN_MASS}", PREV_TOKEN_MASS,
        f"the largest {PREV_TOKEN_MASS} of any head (heads.csv's prev_token_mass, as in the head roles): "
        f"{WORDS[PREV_TOKEN_MASS][1]}"),
    "largest_prev_token_mass_layer": Quantity(
        f"layer of the head with the most {PREV_TOKEN_MASS}", "layer",
        f"the layer of the head with the largest {PREV_TOKEN_MASS} (the head's name is in the table)"),
    "previous_token_head_etc": Quantity(
        "ETC of the previous-token head", "effective token count (keys)",
        "the Effective Token Count 1 / Σ p_i² of that head's positional kernel: about 1 when it attends to one key, "
        "the number of keys when it attends uniformly"),
    "previous_token_head_kernel_type": Quantity(
        "kernel type of the previous-token head", "kernel type",
        "the type of that kernel (local, slow decay, uniform; K3/K4)"),
    "n_previous_token_heads": Quantity(
        "previous-token heads", "heads",
        "the number of heads whose largest mean diagonal is at offset −1 with at least taxonomy.prev_token_min_excess "
        "more attention there than a uniform causal head (P6's finding)", count=True),
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
        f"best {RANDOM_PREV_MASS}", RANDOM_PREV_MASS,
        f"the best head's {RANDOM_PREV_MASS} (heads.csv's l_previous_mass; L1): {WORDS[RANDOM_PREV_MASS][1]}"),
    "look_back_two_candidate_score": Quantity(
        f"best {RANDOM_OFFSET2_MASS}", RANDOM_OFFSET2_MASS,
        f"the best other head's {RANDOM_OFFSET2_MASS} (heads.csv's l_offset2_mass; L5, whether or not it passes the "
        f"role's threshold): {WORDS[RANDOM_OFFSET2_MASS][1]}"),
}
QUANTITIES["best_induction_score"] = QUANTITIES["induction_score"]
QUANTITIES.update({
    "sink_ratio": Quantity(
        "sink ratio", "share of (sample, layer, head)",
        "Gu et al.'s sink ratio: the share of (sample, layer, head) whose mean attention on the first token from "
        "the queries that see it, alpha[0], exceeds sinks.epsilon (S1)"),
    "early_sink_ratio": Quantity(
        "sink ratio of layers 0-1", "share of (sample, head)",
        "the same share in the first sinks.early_layers layers, where Xu 2026 finds no sink at any checkpoint (S2)"),
})
QUANTITIES.update({
    "min(diagonal_ratio)": Quantity(
        "sharpness of the sharpest previous-token head", "second / largest mean diagonal",
        "the smallest ratio, over previous-token heads, of a head's second-largest mean diagonal to its largest "
        "(P7: near 0 for one sharp head)"),
    "count(kernel_types)": Quantity(
        "kernel types present", "types",
        "how many of the kernel types (local, slow decay, uniform) at least one head has (K3)", count=True),
    "count(layer0_local_heads)": Quantity(
        "layer-0 heads with a local kernel", "heads", "the number of layer-0 heads whose kernel type is local (K4)",
        count=True),
})


def quantity(name: str) -> Quantity:
    """The words of quantity ``name``; for one :data:`QUANTITIES` does not name, its own name
    (the column of dynamics.csv, defined where the rule that computes it is documented)."""
    if name in QUANTITIES:
        return QUANTITIES[name]
    for prefix, what in (("n_kernel_", "whose positional kernel is of type"), ("n_l_role_", "whose L role is")):
        if name.startswith(prefix):  # a count per role (posmech.verdicts.dynamics, heads_per_role)
            role = name[len(prefix):].replace("_", " ")
            return Quantity(f"heads: {role}", "heads",
                            f"the number of heads {what} {role} (the head-roles table's column)", count=True)
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


#: per ``dynamics.heads`` entry: the analyses whose per-head tables it reads
HEAD_QUANTITY_ANALYSES: dict[str, tuple[str, ...]] = {
    "sharpest_previous_token": ("diagonal_taxonomy",),
    "previous_token_kernel": ("diagonal_taxonomy", "etc_table"),
    "heads_per_role": (),  # counts what the other followed families' tables assign
}


def sweep_analyses(claims: list[str], heads: list[str], findings: list[Any]) -> list[str]:
    """The analyses a checkpoint runs: those of the followed findings (``claims``; each
    finding's ``rule``) and head quantities (``heads``), completed to whole families (a
    family runs as one job, :mod:`posmech.core.families`). A claim without a finding is a
    :class:`~posmech.core.errors.PosmechError` naming the key."""
    from posmech.core.errors import PosmechError

    rule_by_claim = {f.claim: f.rule for f in findings}
    unknown = [c for c in claims if c not in rule_by_claim]
    if unknown:
        raise PosmechError(
            f"config key `dynamics.claims`: {unknown} have no finding in resources/findings.yaml; "
            f"choose among {', '.join(rule_by_claim)}")
    whole = [c for c in claims if rule_by_claim[c] == FORMATION_ANALYSIS]
    if whole:
        raise PosmechError(
            f"config key `dynamics.claims`: {whole} are judged on a model's whole sweep (the order of formation), "
            "not at one checkpoint; remove them (the findings grid shows them per swept model)")
    wanted = [rule_by_claim[c] for c in claims] + [a for h in heads for a in HEAD_QUANTITY_ANALYSES[h]]
    out: list[str] = []
    for a in wanted:
        for b in FAMILIES.get(rule_of(a), (a,)):
            if b not in out:
                out.append(b)
    return out


def _verdicts(findings: pd.DataFrame) -> dict[tuple[str, str], dict[str, Any]]:
    return {(str(r["claim"]), str(r["model"])): r for r in findings.to_dict("records")}


def _nan(x: Any) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def head_quantities(heads: pd.DataFrame | None, wanted: list[str], roles: Mapping[str, list[str]]) -> list[dict[str, Any]]:
    """The head-table rows (``claim, quantity, value, label`` and, where the table lacks
    it, ``reason``) of one checkpoint; ``heads``: its heads.csv (``None``: no table);
    ``roles``: ``{column: categories}`` of the role counts (kernel types, L roles) over the
    whole sweep, so every checkpoint has the same rows."""
    rows: list[dict[str, Any]] = []

    def missing(claim: str, quantity: str, why: str) -> None:
        rows.append({"claim": claim, "quantity": quantity, "value": math.nan, "label": "", "reason": why})

    prev = heads["prev_token_mass"].dropna() if heads is not None and "prev_token_mass" in heads else pd.Series([])
    sharp = heads.loc[prev.idxmax()] if len(prev) else None
    why_sharp = f"no {PREV_TOKEN_MASS}: the taxonomy family did not run on this model"
    if "sharpest_previous_token" in wanted:
        if sharp is None:
            missing("P6", "largest_prev_token_mass", why_sharp)
            missing("P6", "largest_prev_token_mass_layer", why_sharp)
        else:
            rows.append({"claim": "P6", "quantity": "largest_prev_token_mass",
                         "value": float(sharp["prev_token_mass"]), "label": str(sharp["head_name"])})
            rows.append({"claim": "P6", "quantity": "largest_prev_token_mass_layer", "value": float(sharp["layer"]),
                         "label": str(sharp["head_name"])})
    if "previous_token_kernel" in wanted:
        if sharp is None or "etc" not in heads or _nan(sharp.get("etc")):
            why = why_sharp if sharp is None else f"the head with the largest {PREV_TOKEN_MASS} has no ETC: the kernels family " \
                "did not run on this model, or its kernel is undefined"
            missing("K3", "previous_token_head_etc", why)
            missing("K3", "previous_token_head_kernel_type", why)
        else:
            kind = str(sharp.get("kernel_type"))
            rows.append({"claim": "K3", "quantity": "previous_token_head_etc", "value": float(sharp["etc"]),
                         "label": f"{sharp['head_name']} {kind}"})
            rows.append({"claim": "K3", "quantity": "previous_token_head_kernel_type", "value": math.nan,
                         "label": kind})
    if "heads_per_role" in wanted:
        if heads is not None and "previous_token" in heads and heads["previous_token"].notna().any():
            rows.append({"claim": "P6", "quantity": "n_previous_token_heads",
                         "value": float(heads["previous_token"].fillna(False).astype(bool).sum()), "label": ""})
        else:
            missing("P6", "n_previous_token_heads", why_sharp)
        for column, claim, prefix in (("kernel_type", "K3", "n_kernel_"), ("l_role", "L1", "n_l_role_")):
            present = heads is not None and column in heads and heads[column].notna().any()
            for cat in roles.get(column, []):
                if present:
                    rows.append({"claim": claim, "quantity": prefix + cat,
                                 "value": float((heads[column] == cat).sum()), "label": ""})
                else:
                    missing(claim, prefix + cat, f"no {column} column: its family did not run on this model")
    return rows


def role_categories(tables: list[pd.DataFrame | None]) -> dict[str, list[str]]:
    """``{column: sorted categories}`` of the role columns over ``tables``."""
    out: dict[str, list[str]] = {}
    for column in ("kernel_type", "l_role"):
        cats = {str(v) for t in tables if t is not None and column in t for v in t[column].dropna()}
        out[column] = sorted(cats)
    return out


def dynamics_table(points: list[dict[str, Any]], findings: pd.DataFrame, claims: list[str], wanted: list[str],
                   heads: Mapping[str, pd.DataFrame | None]) -> pd.DataFrame:
    """One row per (sweep point, followed quantity): :data:`DYNAMICS_COLUMNS`.

    ``points``: :func:`posmech.models.checkpoints.sweep_points`; ``findings``: the findings
    table of the points' models (:func:`posmech.verdicts.findings.findings_table`); ``claims``: the
    followed findings; ``wanted``: the followed head quantities; ``heads``: ``{checkpoint:
    its heads.csv table or None}``. A head quantity's verdict is its claim's at that point."""
    verdicts = _verdicts(findings)
    out: list[dict[str, Any]] = []
    for model in dict.fromkeys(p["model"] for p in points):
        mine = [p for p in points if p["model"] == model]
        roles = role_categories([heads.get(p["checkpoint"]) for p in mine])
        for p in mine:
            base = {"model": model, "revision": p["revision"], "step": p["step"], "checkpoint": p["checkpoint"]}
            for claim in claims:
                v = verdicts[(claim, p["checkpoint"])]
                out.append({**base, "claim": claim, "quantity": v["quantity"], "value": v["value"], "label": "",
                            "verdict": v["verdict"], "reason": v["reason"]})
            for r in head_quantities(heads.get(p["checkpoint"]), wanted, roles):
                v = verdicts.get((r["claim"], p["checkpoint"]))
                verdict = "not measurable" if "reason" in r or v is None else v["verdict"]
                reason = r.get("reason") or (v["reason"] if v is not None else "")
                out.append({**base, **r, "verdict": verdict, "reason": reason})
    table = pd.DataFrame(out, columns=DYNAMICS_COLUMNS)
    table["step"] = table["step"].astype("Int64")
    return table


def read_heads(paths: list[str | os.PathLike[str]]) -> dict[str, pd.DataFrame]:
    """``{model: heads.csv}`` of the head-roles tables ``results/{model}/heads.csv``."""
    from pathlib import Path

    from posmech.store.tables import read_table

    return {Path(p).parent.name: read_table(p) for p in paths}


def sweep_rules(dynamics: Mapping[str, Any], findings_path: str, has_checkpoints: bool) -> set[str]:
    """What runs on a checkpoint: the followed analyses (:func:`sweep_analyses` of the
    ``dynamics`` section), its weights and its head table; nothing without checkpoints."""
    if not has_checkpoints:
        return set()
    from posmech.verdicts.findings import load_findings

    found = load_findings(findings_path)
    return set(sweep_analyses(dynamics["claims"], dynamics["heads"], found)) | {
        "fetch_model", "checkpoint_model", "head_table"}


#: the columns of :func:`formation_steps`
FORMATION_COLUMNS = ["model", "role", "claims", "step", "checkpoint", "rank", "reason"]


def formation_steps(table: pd.DataFrame, roles: Mapping[str, list[str]]) -> pd.DataFrame:
    """Per swept model and role (``dynamics.formation``: role -> findings), the first step at
    which any of the role's findings holds in the dynamics table (``step``, ``checkpoint``), and
    the role's ``rank`` in the model's order of formation (1 first; roles formed at the same
    step share a rank; empty when it never formed). ``reason`` says why a role has no step: a
    finding not followed (not in the table), or none of them holding at any checkpoint."""
    t = check_table(table)
    rows = []
    for model, g in t.groupby("model", sort=False):
        g = g[g["step"].notna()]
        for role, claims in roles.items():
            missing = [c for c in claims if c not in set(g["claim"])]
            held = g[g["claim"].isin(claims) & (g["verdict"] == "holds")].sort_values("step", kind="stable")
            r = {"model": model, "role": role, "claims": ", ".join(claims), "step": None, "checkpoint": "",
                 "rank": None, "reason": ""}
            if len(held):
                r.update(step=int(held.iloc[0]["step"]), checkpoint=str(held.iloc[0]["checkpoint"]))
                if missing:
                    r["reason"] = f"{', '.join(missing)} not followed (dynamics.claims)"
            elif len(missing) == len(claims):
                r["reason"] = f"{', '.join(claims)} not followed (dynamics.claims)"
            else:
                r["reason"] = (f"none of {', '.join(c for c in claims if c not in missing)} holds at any checkpoint up "
                               f"to step {int(g['step'].max())}")
            rows.append(r)
    out = pd.DataFrame(rows, columns=FORMATION_COLUMNS)
    out["step"] = out["step"].astype("Int64")
    out["rank"] = out.groupby("model", sort=False)["step"].rank(method="min").astype("Int64")
    return out


#: analysis ``formation_order`` (workflow/analyses/formation_order.yaml): S5, judged on a swept
#: model's whole sweep (rule dynamics' table), never at one checkpoint
FORMATION_ANALYSIS = "formation_order"
#: the roles of ``dynamics.formation`` S5 compares: the first forms earlier than the second
FORMATION_PAIR = ("induction_head", "attention_sink")
#: S5's scorecard quantity
FORMATION_QUANTITY = "sink_over_induction_steps"
#: why a model without checkpoints has no S5 (posmech.pipeline.study adds it to the model's
#: rules that cannot run)
NO_SWEEP = ("the model has no dynamics sweep (no `train.checkpoints` nor `revisions`): the order of formation needs "
            "its checkpoints")


def formation_order_rows(table: pd.DataFrame, roles: Mapping[str, list[str]], model: str,
                         artifact: str = "") -> list[dict[str, Any]]:
    """S5's scorecard rows (one) of ``model``: :func:`formation_order_row`."""
    return [formation_order_row(table, roles, model, artifact)]


def formation_order_row(table: pd.DataFrame, roles: Mapping[str, list[str]], model: str,
                        artifact: str = "") -> dict[str, Any]:
    """S5's scorecard row of swept ``model``: the step at which the sink forms over the step at
    which the induction head forms (:data:`FORMATION_PAIR`, two roles of ``dynamics.formation``;
    each role's step is the first checkpoint at which any of its findings holds,
    :func:`formation_steps` of the dynamics table ``table``). With the same tokens per training
    step at every step (a run's fixed batch and context) the ratio of steps is Xu 2026's ratio
    of tokens. ``value`` is ``None`` with the reason in ``detail`` when the model has no sweep in
    the table, a role is not in ``dynamics.formation``, either role never forms, or the
    induction head already holds at step 0 (no ratio)."""
    earlier, later = FORMATION_PAIR
    row: dict[str, Any] = {"claim": "S5", "model": model, "quantity": FORMATION_QUANTITY, "value": None,
                           "detail": "", "artifact": artifact}
    absent = [r for r in FORMATION_PAIR if r not in roles]
    if absent:
        row["detail"] = (f"config key `dynamics.formation` has no role {', '.join(absent)}: S5 compares the steps of "
                         f"roles {earlier} and {later}")
        return row
    t = check_table(table)
    if model not in set(t["model"]):
        row["detail"] = f"{model} has no rows in the dynamics table: {NO_SWEEP}"
        return row
    f = formation_steps(t[t["model"] == model], {r: list(roles[r]) for r in FORMATION_PAIR}).set_index("role")
    steps = {r: f.loc[r, "step"] for r in FORMATION_PAIR}
    never = [r for r in FORMATION_PAIR if pd.isna(steps[r])]
    if never:
        row["detail"] = "; ".join(f"{r} never forms ({f.loc[r, 'reason']})" for r in never)
        return row
    first, second = int(steps[earlier]), int(steps[later])
    if first == 0:
        row["detail"] = (f"{earlier} already holds at step 0 ({f.loc[earlier, 'checkpoint']}): no ratio of steps "
                         f"({later} at step {second})")
        return row
    row["value"] = second / first
    row["detail"] = (f"{later} ({', '.join(roles[later])}) first holds at step {second} "
                     f"({f.loc[later, 'checkpoint']}), {earlier} ({', '.join(roles[earlier])}) at step {first} "
                     f"({f.loc[earlier, 'checkpoint']})")
    return row
