"""The order of formation across checkpoints (``dynamics.formation``, issue 47): per swept
model, the first step at which each role's findings hold, shown in the report's dynamics
section."""

from __future__ import annotations

import pandas as pd

from posmech.report.dynamics_section import dynamics_html
from posmech.verdicts.dynamics import DYNAMICS_COLUMNS, formation_steps

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
