"""The order of formation across checkpoints (``dynamics.formation``, issue 47): per swept
model, the first step at which each role's findings hold, shown in the report's dynamics
section."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from posmech.report.dynamics_section import dynamics_html
from posmech.verdicts.dynamics import DYNAMICS_COLUMNS, formation_steps

REPO = Path(__file__).resolve().parents[2]
ROLES = {"previous_token_head": ["P7", "L1"], "induction_head": ["P16"], "attention_sink": ["S1"]}


def _table() -> pd.DataFrame:
    """demo: P7 holds from step 300, P16 from 1000, S1 from 500; other: S1 never, P16 not followed."""
    verdicts = {("demo", "P7"): ["fails", "holds", "holds", "holds"], ("demo", "P16"): ["fails", "fails", "holds", "holds"],
                ("demo", "S1"): ["fails", "holds", "holds", "holds"],
                ("other", "P7"): ["fails", "fails", "holds", "holds"], ("other", "S1"): ["fails"] * 4}
    rows = []
    for (model, claim), vs in verdicts.items():
        for step, v in zip([0, 300, 1000, 2000], vs):
            rows.append({"model": model, "revision": f"step{step}", "step": step, "checkpoint": f"{model}@step{step}",
                         "claim": claim, "quantity": claim.lower(), "value": 0.5, "label": "", "verdict": v,
                         "reason": ""})
    t = pd.DataFrame(rows, columns=DYNAMICS_COLUMNS)
    t.loc[(t.model == "demo") & (t.claim == "S1") & (t.step == 300), "verdict"] = "fails"  # S1 first at 1000
    return t


def test_the_first_step_each_role_holds_and_the_order():
    f = formation_steps(_table(), ROLES).set_index(["model", "role"])
    assert f.loc[("demo", "previous_token_head"), "step"] == 300
    assert f.loc[("demo", "induction_head"), "step"] == 1000 and f.loc[("demo", "attention_sink"), "step"] == 1000
    assert list(f.loc["demo", "rank"]) == [1, 2, 2]  # the same step: the same rank
    assert f.loc[("other", "previous_token_head"), "step"] == 1000
    assert pd.isna(f.loc[("other", "induction_head"), "step"]) and "not followed" in f.loc[("other", "induction_head"), "reason"]
    assert pd.isna(f.loc[("other", "attention_sink"), "step"]) and "none of S1 holds at any checkpoint up to step 2000" in \
        f.loc[("other", "attention_sink"), "reason"]


def test_the_dynamics_section_shows_the_order_of_formation():
    t = _table()
    t.attrs["formation"] = [[role, claims] for role, claims in ROLES.items()]  # as rule dynamics records it
    html = str(dynamics_html(t, None, None))
    assert "Order of formation" in html and "step 300 (#1)" in html
    assert "not formed" in html and "not followed" in html  # other: S1 never holds; P16 is not in its table
    assert "previous token head → induction head → attention sink" in html
    t.attrs = {}
    assert "Order of formation" not in str(dynamics_html(t, None, None))  # no roles recorded: no table


# ---------------------------------------------------------------- S5: Xu 2026's order as a finding
def _sweep(induction: list[str], sink: list[str], steps=(0, 100, 1000, 2000), model: str = "m") -> pd.DataFrame:
    """A hand-made dynamics table of one swept model: P16's and S1's verdicts per step."""
    rows = []
    for claim, vs in (("P16", induction), ("S1", sink)):
        for step, v in zip(steps, vs):
            rows.append({"model": model, "revision": f"step{step}", "step": step, "checkpoint": f"{model}@step{step}",
                         "claim": claim, "quantity": claim.lower(), "value": 0.5, "label": "", "verdict": v,
                         "reason": ""})
    return pd.DataFrame(rows, columns=DYNAMICS_COLUMNS)


def _s5(table: pd.DataFrame, roles=ROLES, model: str = "m"):
    from posmech.verdicts.dynamics import formation_order_row

    return formation_order_row(table, roles, model)


def test_s5_is_the_sinks_step_over_the_induction_heads():
    """Induction from step 100, the sink from 1000: 10x later (Xu's order) -> holds; the other way
    round: 0.1 -> fails; at the same checkpoint: 1, no order -> fails (predicate >, threshold 1)."""
    from posmech.core.families import ANALYSES
    from posmech.verdicts.findings import judge, load_findings

    s5 = next(f for f in load_findings(REPO / "resources/findings.yaml") if f.claim == "S5")
    assert s5.rule == "formation_order" and "formation_order" in ANALYSES
    thresholds = {"s5_min_sink_over_induction_steps": 1.0}
    cases = {(("fails", "holds", "holds", "holds"), ("fails", "fails", "holds", "holds")): (10.0, "holds"),
             (("fails", "fails", "holds", "holds"), ("fails", "holds", "holds", "holds")): (0.1, "fails"),
             (("fails", "holds", "holds", "holds"), ("fails", "holds", "fails", "holds")): (1.0, "fails")}
    for (induction, sink), (value, verdict) in cases.items():
        row = _s5(_sweep(list(induction), list(sink)))
        assert row["value"] == pytest.approx(value)
        assert "step" in row["detail"] and row["quantity"] == "sink_over_induction_steps"
        assert judge(s5, "m", thresholds, row, rule_ran=True).verdict == verdict


def test_s5_is_not_measurable_without_a_sweep_or_a_formed_role():
    never = _s5(_sweep(["fails"] * 4, ["fails", "holds", "holds", "holds"]))
    assert never["value"] is None and "induction_head never forms (none of P16 holds" in never["detail"]
    at_zero = _s5(_sweep(["holds"] * 4, ["fails", "fails", "holds", "holds"]))
    assert at_zero["value"] is None and "already holds at step 0" in at_zero["detail"]
    other = _s5(_sweep(["fails", "holds", "holds", "holds"], ["fails"] * 4), model="other")
    assert other["value"] is None and "no dynamics sweep" in other["detail"]
    no_role = _s5(_sweep(["fails", "holds", "holds", "holds"], ["fails"] * 3 + ["holds"]),
                  roles={"induction_head": ["P16"], "sink": ["S1"]})
    assert no_role["value"] is None and "`dynamics.formation` has no role attention_sink" in no_role["detail"]


def test_s5_cannot_be_followed_at_a_checkpoint():
    """S5 reads the whole sweep: following it per checkpoint (dynamics.claims) is an error naming the key."""
    from posmech.core.errors import PosmechError
    from posmech.verdicts.dynamics import sweep_analyses
    from posmech.verdicts.findings import load_findings

    found = load_findings(REPO / "resources/findings.yaml")
    assert "attention_sinks" in sweep_analyses(["S1"], [], found)
    with pytest.raises(PosmechError, match=r"`dynamics.claims`: \['S5'\]"):
        sweep_analyses(["S1", "S5"], [], found)
