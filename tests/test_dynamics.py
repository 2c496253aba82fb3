"""The dynamics table (posmech.verdicts.dynamics): which analyses a checkpoint runs, and one row per
(sweep point, followed quantity) with its claim's verdict there, on hand-made tables whose
answer is known."""

import math

import pandas as pd
import pytest

from posmech.verdicts.dynamics import DYNAMICS_COLUMNS, dynamics_table, sweep_analyses
from posmech.core.errors import PosmechError
from posmech.verdicts.findings import load_findings
from tests.workflow.conftest import REPO

FINDINGS = load_findings(REPO / "resources" / "findings.yaml")


def test_a_followed_finding_brings_its_whole_family():
    got = sweep_analyses(["P5"], [], FINDINGS)
    assert got == ["prev_knockout", "repeated_tokens", "induction_intervention"]  # the interventions family
    got = sweep_analyses(["P6", "K3"], ["previous_token_kernel"], FINDINGS)
    assert got == ["attention_statistics", "diagonal_taxonomy", "positional_kernels", "etc_table", "kernel_heatmaps"]
    assert sweep_analyses(["P2"], [], FINDINGS) == ["posembed_averaging"]  # a rule of its own


def test_an_unknown_claim_is_an_error_naming_the_key():
    with pytest.raises(PosmechError, match=r"`dynamics.claims`: \['P99'\]"):
        sweep_analyses(["P99"], [], FINDINGS)


def _heads(prev, etc=None, kinds=None, roles=None):
    n = len(prev)
    t = pd.DataFrame({"layer": [i // 2 for i in range(n)], "head_name": [f"L{i // 2}H{i % 2}" for i in range(n)],
                      "prev_token_mass": prev, "previous_token": [p >= 0.5 for p in prev]})
    if etc is not None:
        t["etc"], t["kernel_type"] = etc, kinds
    if roles is not None:
        t["l_role"] = roles
    return t


def _findings(points, verdicts):
    rows = []
    for p, (v6, v3) in zip(points, verdicts):
        rows.append({"claim": "P6", "model": p, "verdict": v6, "quantity": "prev_token_head_fraction", "value": 0.5,
                     "reason": f"P6 at {p}"})
        rows.append({"claim": "K3", "model": p, "verdict": v3, "quantity": "count(kernel_types)", "value": 2.0,
                     "reason": f"K3 at {p}"})
    return pd.DataFrame(rows)


def test_rows_carry_the_quantity_and_their_claims_verdict_at_each_point():
    points = [{"model": "demo", "revision": "step0", "step": 0, "checkpoint": "demo@step0"},
              {"model": "demo", "revision": "final", "step": 100, "checkpoint": "demo"}]
    heads = {"demo@step0": _heads([0.1, 0.2, 0.3, 0.15], [3.0, 4.0, 5.0, 6.0], ["uniform"] * 4),
             "demo": _heads([0.1, 0.2, 0.9, 0.6], [3.0, 4.0, 1.2, 6.0], ["uniform", "uniform", "local", "uniform"])}
    found = _findings(["demo@step0", "demo"], [("fails", "fails"), ("holds", "holds")])
    t = dynamics_table(points, found, ["P6"], ["sharpest_previous_token", "previous_token_kernel", "heads_per_role"],
                       heads)
    assert list(t.columns) == DYNAMICS_COLUMNS

    def row(ckpt, q):
        (r,) = t[(t.checkpoint == ckpt) & (t.quantity == q)].to_dict("records")
        return r

    assert row("demo@step0", "prev_token_head_fraction")["verdict"] == "fails"
    first, last = row("demo@step0", "largest_prev_token_mass"), row("demo", "largest_prev_token_mass")
    assert (first["value"], first["label"], first["verdict"]) == (0.3, "L1H0", "fails")
    assert (last["value"], last["label"], last["verdict"]) == (0.9, "L1H0", "holds")
    assert row("demo", "largest_prev_token_mass_layer")["value"] == 1
    assert (row("demo", "previous_token_head_etc")["value"], row("demo", "previous_token_head_kernel_type")["label"]) \
        == (1.2, "local")
    # role counts: the same rows at every point of the sweep (a type absent at step 0 counts 0)
    assert row("demo@step0", "n_kernel_local")["value"] == 0 and row("demo", "n_kernel_local")["value"] == 1
    assert row("demo", "n_previous_token_heads")["value"] == 2
    assert list(t.step) == [0] * (len(t) // 2) + [100] * (len(t) // 2)


def test_a_quantity_a_checkpoint_lacks_is_not_measurable_with_the_reason_never_0():
    points = [{"model": "m", "revision": "step5", "step": 5, "checkpoint": "m@step5"}]
    found = _findings(["m@step5"], [("holds", "not measurable")])
    t = dynamics_table(points, found, [], ["previous_token_kernel", "heads_per_role"], {"m@step5": _heads([0.9, 0.1])})
    etc = t[t.quantity == "previous_token_head_etc"].iloc[0]
    assert etc["verdict"] == "not measurable" and math.isnan(etc["value"]) and "kernels family" in etc["reason"]
    missing = t[t.quantity == "n_previous_token_heads"].iloc[0]
    assert missing["value"] == 1 and missing["verdict"] == "holds"
    nothing = dynamics_table(points, found, [], ["sharpest_previous_token"], {})
    assert set(nothing["verdict"]) == {"not measurable"} and nothing["value"].isna().all()
