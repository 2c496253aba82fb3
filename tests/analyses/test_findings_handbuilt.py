"""Findings judged on hand-built models whose answer is known: for each claim family (P, L, K,
C) a model where a finding holds and one where it fails, and models lacking the finding's
object (no contextual head, no look-back-two or induction head) where it is not measurable
and the rules still write their rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from posmech.verdicts import findings as fd
from posmech.analyses import attn_only as ao
from posmech.analyses import contextual as cx
from posmech.analyses import interventions as iv
from posmech.analyses import neurons as nr
from posmech.analyses.attention import head_columns
from posmech.core.config import load_schema
from posmech.models import handbuilt as hb
from posmech.models.loading import load_bridge, load_model
from posmech.store.tables import read_table, write_table

from .test_attn_only import ENTRY, LB2, _params
from .test_attn_only import _spec as attn_only_spec
from .test_contextual import N_CTX, V, built, offsets, plant, previous_token, tokenset
from .test_interventions import N, TOKENS, relay_spec
from .test_neurons import C, LAM, U_VEC, V_VEC, ov_head, real_pre
from tests.tolerances import FLOAT32_FORWARD_ABS

REPO = Path(__file__).resolve().parents[2]
SCHEMA = load_schema(REPO / "workflow" / "schemas" / "config.schema.yaml")
THRESHOLDS = {k: v["default"] for k, v in SCHEMA["properties"]["findings"]["properties"].items()}
FINDINGS = {f.claim: f for f in fd.load_findings(REPO / "resources" / "findings.yaml")}


def verdict(claim: str, rows: list[dict], model: str = "hand") -> fd.Verdict:
    """The shipped finding of ``claim`` judged on the scorecard ``rows`` of one rule."""
    f = FINDINGS[claim]
    row = next((r for r in rows if r["quantity"] == f.quantity), None)
    return fd.judge(f, model, THRESHOLDS, None if row is None else {"value": row["value"], "detail": row["detail"]}, True)


# --------------------------------------------------------------------------- P5
@pytest.mark.float32
def test_p5_holds_when_the_sharp_head_reads_layer_0_and_fails_when_it_reads_positions(tmp_path):
    """relay: the layer-1 head finds the previous position through layer 0's copy, so at the
    knocked-out queries it is uniform (mass (1/6 + 1/11) / 2); direct: it reads the positions
    itself and the knock-out changes nothing (ratio 1)."""
    params = {**head_columns("L1H0"), "layers": [0], "period": 5, "phase": 0}
    relay = load_model({"hf_dir": str(hb.save_model_dir(relay_spec(), tmp_path / "relay")), "name": "relay"},
                       device="cpu")
    rows, _ = iv.prev_knockout(relay, [TOKENS], "L1H0", layers=[0], period=5, zoom=N)
    held = verdict("P5", iv.knockout_scorecard(iv.tidy(rows, "P5", "relay", params), "relay", "f.png"))
    assert held.verdict == "holds" and held.value == pytest.approx((1 / 6 + 1 / 11) / 2, abs=1e-4)

    direct_spec = hb.positional_spec(n_ctx=N, n_layer=2, n_head=2, scores={
        (0, 1): hb.previous_token_scores(N), (1, 0): hb.previous_token_scores(N)})
    direct = load_model({"hf_dir": str(hb.save_model_dir(direct_spec, tmp_path / "direct")), "name": "direct"},
                        device="cpu")
    rows, _ = iv.prev_knockout(direct, [TOKENS], "L1H0", layers=[0], period=5, zoom=N)
    failed = verdict("P5", iv.knockout_scorecard(iv.tidy(rows, "P5", "direct", params), "direct", "f.png"))
    assert failed.verdict == "fails" and failed.value == pytest.approx(1.0, abs=FLOAT32_FORWARD_ABS)



# --------------------------------------------------------------------------- L
@pytest.fixture(scope="module")
def attn_only_model(tmp_path_factory):
    d = hb.save_attn_only_dir(attn_only_spec(), tmp_path_factory.mktemp("ao") / "model")
    return load_bridge({"hf_dir": str(d), "name": "hand"}, "cpu", "float32", "compatibility")


def decomposition_card(bridge, p, roles: dict[str, str], missing=None) -> list[dict]:
    setup = ao.prepare(bridge, p, "hand", ENTRY)
    used = {r: ao.parse_head(h) for r, h in roles.items() if h != ao.NONE}
    rows = ao.input_decomposition(bridge, p, setup, used)
    art = {"L2": "a.png", "L3": "b.png", "L5": "c.png"}
    return ao.decomposition_scorecard(pd.DataFrame(rows), roles, p, True, "hand", art, missing)


@pytest.mark.float32
def test_l2_holds_on_an_exact_previous_token_head(attn_only_model):
    card = decomposition_card(attn_only_model, _params(), {"previous": "L0H0", "look_back_two": "L0H1"})
    l2 = verdict("L2", card)
    assert l2.verdict == "holds" and l2.value == pytest.approx(1.0, abs=FLOAT32_FORWARD_ABS)


def roles_card(bridge, p) -> list[dict]:
    setup = ao.prepare(bridge, p, "hand", ENTRY)
    return ao.random_token_scorecard(ao.random_token_patterns(bridge, p, setup), p, setup, "hand", "f.png")


def test_l1_l5_hold_with_planted_heads_and_l5_fails_without_a_look_back_two_head(attn_only_model, tmp_path):
    """With the planted look-back-two head (position scores 5, 4, 3 at offsets -2, -1, -3) both
    existence findings hold; a model whose only planted layer-0 head is the previous-token one
    has no other head above uniform at offset -2: L5 fails (it is not 'not measurable')."""
    role_min = {k: v["default"] for k, v in
                SCHEMA["properties"]["attn_only"]["properties"]["role_min_score"]["properties"].items()}
    p = _params(role_min_score=role_min)
    card = roles_card(attn_only_model, p)
    l1, l5 = verdict("L1", card), verdict("L5", card)
    assert l1.verdict == "holds" and l1.value > 0.99
    assert l5.verdict == "holds" and l5.value > THRESHOLDS["l5_min_offset2_mass"]
    spec = attn_only_spec()
    spec.scores_pos.pop(LB2)
    spec.scores_tok.pop(LB2)
    d = hb.save_attn_only_dir(spec, tmp_path / "prev_only")
    bridge = load_bridge({"hf_dir": str(d), "name": "hand"}, "cpu", "float32", "compatibility")
    card = {r["quantity"]: r for r in roles_card(bridge, p)}
    failed = verdict("L5", list(card.values()))
    assert failed.verdict == "fails" and failed.value < 0.2
    assert card["look_back_two_head"]["value"] == []  # the role is none: below role_min_score
    assert "no look-back-two head" in card["look_back_two_head"]["detail"]


def test_a_role_below_its_threshold_is_none_and_its_findings_not_measurable(attn_only_model, tmp_path):
    p = _params(role_min_score={"previous": 0.2, "look_back_two": 0.99, "induction": 0.99})
    setup = ao.prepare(attn_only_model, p, "hand", ENTRY)
    out = ao.random_token_patterns(attn_only_model, p, setup)
    roles = {r["role"]: r for r in out["roles"]}
    assert roles["previous"]["head_name"] == "L0H0" and roles["previous"]["layer"] == 0 and roles["previous"]["passes"]
    for role, cand in (("look_back_two", "L0H1"), ("induction", "L1H0")):
        assert roles[role]["head_name"] == ao.NONE and roles[role]["layer"] is None and roles[role]["head"] is None
        assert roles[role]["candidate"] == cand and not roles[role]["passes"]
    # written and read back: a role no head fills keeps head_name "none" and empty integer layer/head
    write_table(ao.roles_frame("hand", out["roles"]), tmp_path / "head_roles.csv")
    back = read_table(tmp_path / "head_roles.csv").set_index("role")
    assert str(back["layer"].dtype) == "Int64" and str(back["head"].dtype) == "Int64"
    assert back.loc["previous", ["layer", "head", "head_name"]].tolist() == [0, 0, "L0H0"]
    assert back.loc["induction", "head_name"] == ao.NONE and back["head"].isna().sum() == 2
    assert ao.read_roles(tmp_path / "head_roles.csv")["induction"] == ao.NONE
    card = {r["quantity"]: r for r in ao.random_token_scorecard(out, p, setup, "hand", "f.png")}
    assert card["induction_head"]["value"] == [] and "no induction head: the best candidate L1H0" in \
        card["induction_head"]["detail"]
    missing = {r: ao.role_missing(r, roles[r]) for r in ("look_back_two",)}
    rows = decomposition_card(attn_only_model, p, {"previous": "L0H0", "look_back_two": ao.NONE}, missing)
    l5 = [r for r in rows if r["quantity"] == "posonly_pattern_offset2"][0]
    assert l5["value"] is None and "no look-back-two head" in l5["detail"]
    assert verdict("L2", rows).verdict == "holds"  # the other role is still measured
    # every L5 quantity is written (without a value), the same names as when the head exists
    assert {r["quantity"] for r in rows if r["claim"] == "L5"} == {q for _, q in ao.DECOMPOSITION_QUANTITIES[
        "look_back_two"]}
    present = decomposition_card(attn_only_model, p, {"previous": "L0H0", "look_back_two": "L0H1"})
    assert [(r["claim"], r["quantity"]) for r in present if r["value"] is not None] == [
        (r["claim"], r["quantity"]) for r in present]
    names = {(r["claim"], r["quantity"]) for r in present}
    assert names == set(ao.DECOMPOSITION_QUANTITIES["previous"] + ao.DECOMPOSITION_QUANTITIES["look_back_two"]
                        + ao.DECOMPOSITION_BOS_QUANTITIES)


# --------------------------------------------------------------------------- K
def k_rows(tmp_path, plans) -> tuple[list[dict], list[str]]:
    """K7 classes and the K8 broad-spread row of a planted one-layer model over 3 texts."""
    spec, sigma = plant(plans)
    w = cx.weights_from_hf(hb.to_hf(spec))
    rng = np.random.default_rng(1)  # the texts (the shared RNG's state depends on the tests run before)
    texts = [rng.integers(0, V, N_CTX) for _ in range(3)]
    dec, _ = built(tmp_path, w, texts, 3)
    mass, excess, count = cx.duplicate_scores(w, sigma, list(dec.token_ids), N_CTX - 2)
    thr = {"duplicate_min_excess": 0.25, "local_min_mass": 0.5, "uniform_min_fraction": 0.5}
    classes = cx.head_classes(dec, mass, excess, count, N_CTX - 2, 1, 3, thr, "hand")["head_class"].tolist()
    spread = cx.denominator_spread(dec.log_z_linear, dec.positions, 8)
    k7 = [{"claim": "K7", "quantity": "contextual_heads", "value": [f"L0H{h}" for h, c in enumerate(classes)
                                                                    if c == "contextual"], "detail": ""}]
    return k7 + [cx.broad_spread_row(spread, classes, "hand", "f.png")], classes


def test_k7_k8_hold_with_a_contextual_head_and_are_not_measurable_or_fail_without(tmp_path):
    rows, classes = k_rows(tmp_path / "a", {0: {"D": 10.0}, 1: {"P": previous_token(N_CTX)},
                                            2: {"P": -0.1 * offsets(N_CTX), "C": np.random.default_rng(2).normal(0, 1.0, V)}})
    assert classes[:3] == ["duplicate_token", "detokenization", "contextual"]
    assert verdict("K7", rows).verdict == "holds"
    k8 = verdict("K8", rows)
    # the planted content scores make the contextual head's denominator depend on the text
    assert k8.verdict == "holds" and k8.value > 0.1
    rows, classes = k_rows(tmp_path / "b", {0: {"D": 10.0}, 1: {"P": previous_token(N_CTX)}, 2: {"D": 10.0},
                                            3: {"P": previous_token(N_CTX)}})
    assert "contextual" not in classes and "other" not in classes
    failed = verdict("K7", rows)
    assert failed.verdict == "fails" and failed.value == 0.0
    k8 = verdict("K8", rows)
    assert k8.verdict == "not measurable" and "no layer-0 head is contextual or other" in k8.reason


def test_k9_without_a_token_dependent_denominator_is_not_measurable(tmp_path):
    """Purely positional heads: every Var Z is 0, nothing to fit; the rule gives the reason."""
    spec, _ = plant({0: {"P": previous_token(N_CTX)}, 1: {"P": -0.1 * offsets(N_CTX)}})
    w = cx.weights_from_hf(hb.to_hf(spec))
    rng = np.random.default_rng(3)
    dec, _ = built(tmp_path, w, [rng.integers(0, V, N_CTX) for _ in range(3)], 3)
    res = [cx.variance_model(dec, dec.token_ids[j], n, 20, j) for j in range(3) for n in (8, 16)]
    r, slope, why = cx.loglog_fit_or_reason(np.concatenate([x["predicted"] for x in res]),
                                            np.concatenate([x["observed"] for x in res]))
    assert np.isnan(r) and "no layer-0 head's denominator varies" in why
    v = verdict("K9", [{"quantity": "variance_model_fit", "value": None, "detail": why}])
    assert v.verdict == "not measurable" and v.reason == why


# --------------------------------------------------------------------------- C
def c2_row(tmp_path, writes: bool, mlp: bool = True, c3: bool = False) -> dict | list[dict]:
    """C2's finding row on the model of tests/analyses/test_neurons.py: neuron 7 reads the
    contextual head 2's output; with ``writes`` false that head's OV circuit writes nothing;
    with ``mlp`` false the MLP's input weights are zero (the modules exist, every neuron's
    pre-activation is 0); with ``c3`` also C3's rows (:func:`posmech.analyses.neurons.fit_scorecard`
    over the three best-ranked neurons, as rule bag_of_tokens_fit)."""
    spec, _ = plant({0: {"D": 10.0}, 2: {"P": -LAM * offsets(N_CTX), "C": C}, 3: {"P": 30.0 * np.eye(N_CTX)}})
    for h, vecs in ((2, U_VEC if writes else 0 * U_VEC), (3, V_VEC)):
        W_V, W_O = ov_head(vecs)
        spec.heads[(0, h)].update({"W_V": W_V, "W_O": W_O})
    W_in = np.zeros((256, 1024))
    W_in[:, 7] = 0.0
    W_in[120:136, 7] = np.random.default_rng(5).normal(0, 1, 16)  # reads only what head 2 writes
    W_in[140:150, 3] = 1.0  # neuron 3 reads head 3's output
    spec.mlps[0] = {"W_in": W_in if mlp else 0 * W_in}
    m = hb.to_hf(spec)
    w, ov = cx.weights_from_hf(m), nr.ov_from_hf(m)
    rng = np.random.default_rng(11)  # its own texts: the shared RNG's state depends on the tests run before
    texts = [rng.integers(0, V, N_CTX) for _ in range(3)]
    path = tmp_path / "layer0.h5"
    cx.build_decomposition(w, 2, "x", tokenset(texts), [{"corpus": "c", "doc_index": j, "title": f"t{j}", "ids": t}
                                                        for j, t in enumerate(texts)], N_CTX - 2, None, path,
                           {"model": "planted"})
    dec = cx.read_decomposition(path)
    st, _ = nr.build_setup(dec, w, ov, [2], 0, 10, None)
    keys = nr.content_keys(dec)
    real = [nr.hook_pre(w, ov, t) for t in dec.token_ids]
    np.testing.assert_allclose(real[0], real_pre(m, dec.token_ids[0]), atol=2e-5)
    context = [nr.approximate(st, keys, t)["context"] for t in dec.token_ids]
    ranking = nr.neuron_ranking(real, context, "hand", 10)
    row = nr.best_explained_row(ranking, "hand", "r.csv")
    if not c3:
        return row
    fits = pd.DataFrame([{"neuron": j, **nr.fit_metrics(a[10:, j], nr.approximate(st, keys, t)["pre"][10:, j])}
                         for t, a in zip(dec.token_ids, real) for j in nr.resolve_neurons([], ranking, 3, 1024, "h")])
    return [row, *nr.fit_scorecard(fits, 10, "hand", "f.csv")]


def test_c2_holds_when_a_neuron_reads_the_contextual_head_and_fails_when_the_head_writes_nothing(tmp_path):
    held = verdict("C2", [c2_row(tmp_path / "a", True)])
    assert held.verdict == "holds" and held.value > 0.9
    failed = verdict("C2", [c2_row(tmp_path / "b", False)])
    assert failed.verdict == "fails" and failed.value <= 1e-6


def test_a_zero_mlp_makes_c2_c3_not_measurable_with_the_reason(tmp_path):
    """The GPT-2 layout keeps its MLP modules when their weights are zero: every neuron's real
    pre-activation is 0 at every position, so the variance it explains and Pearson r are
    undefined.  The C2/C3 rows then carry no value and say why (rule bag_of_tokens_fit stopped
    with an error here before); with the neuron reading the contextual head, both hold."""
    rows = c2_row(tmp_path / "a", True, mlp=False, c3=True)
    for claim in ("C2", "C3"):
        v = verdict(claim, rows)
        assert v.verdict == "not measurable" and v.reason == nr.CONSTANT_PRE
    assert [r["value"] for r in rows if r["quantity"] == "median_fvu"] == [None]
    rows = c2_row(tmp_path / "b", True, c3=True)
    assert verdict("C2", rows).verdict == "holds"
    c3 = verdict("C3", rows)
    assert c3.verdict == "holds" and c3.value > 0.9  # neuron 7 (the others are constant: left out)
    assert "left out: their real pre-activation is constant" in next(
        r["detail"] for r in rows if r["quantity"] == "median_pearson_r")


def test_no_broad_head_makes_c1_c3_not_measurable_with_the_reason(tmp_path):
    classes = pd.DataFrame({"head": [0, 1], "head_name": ["L0H0", "L0H1"],
                            "head_class": ["duplicate_token", "detokenization"]})
    why = nr.missing_heads(classes, [], ["contextual", "other"])
    assert why.startswith("no broad layer-0 head") and "L0H1: detokenization" in why
    assert nr.missing_heads(classes, ["L0H1"], ["contextual"]) is None  # pinned heads are used
    path = tmp_path / "extended_tokens.h5"
    nr.write_not_measurable(path, why, {"model": "hand"})
    assert nr.not_measurable(path) == why
    v = verdict("C3", [{"quantity": "median_pearson_r", "value": None, "detail": why}])
    assert v.verdict == "not measurable" and v.reason == why
