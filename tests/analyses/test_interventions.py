"""Interventions (P5, P14, P15, P16) on hand-built models whose answers are known exactly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from posmech.analyses import interventions as iv
from posmech.analyses.attention import head_columns
from posmech.analyses.readout import continuation_probability
from posmech.analyses.posembed import group_average
from posmech.core.errors import PosmechError
from posmech.models import handbuilt as hb
from posmech.models.loading import load_bridge, load_model
from posmech.settings import defaults

from tests.tolerances import FLOAT32_FORWARD_ABS, FLOAT32_FORWARD_REL

N = 12  # context of the hand-built models
V = 8  # vocabulary of the copy model


def copy_spec() -> hb.Spec:
    """One layer; L0H1 an exact previous-token head (positional scores) that copies the
    previous *token* into dims 20..27, which the unembedding reads: the logits at position
    q depend only on the token at q − 1 (argmax = that token).  L0H0 writes nothing."""
    spec = hb.positional_spec(n_ctx=N, n_layer=1, n_head=2, d_head=20, d_vocab=V,
                              scores={(0, 1): hb.previous_token_scores(N)})
    d = spec.d_model  # 40: positions 0..11, tokens 12..19, copies 20..27, spares 38, 39
    W_E = np.zeros((V, d))
    W_E[np.arange(V), 12 + np.arange(V)] = 1.0
    W_E[:, 38] = -1.0  # zero mean per row: LN keeps the positional part's geometry
    W_V = np.zeros((d, spec.dh))
    W_V[12 + np.arange(V), np.arange(V)] = 1.0
    W_O = np.zeros((spec.dh, d))
    W_O[np.arange(V), 20 + np.arange(V)] = 10.0
    W_U = np.zeros((d, V))
    W_U[20 + np.arange(V), np.arange(V)] = 1.0
    spec.W_E, spec.W_U = W_E, W_U
    spec.heads[(0, 1)].update(W_V=W_V, W_O=W_O)
    return spec


@pytest.fixture(scope="module")
def copy_dir(tmp_path_factory: pytest.TempPathFactory):
    return hb.save_model_dir(copy_spec(), tmp_path_factory.mktemp("models") / "copy")


@pytest.fixture(scope="module")
def copy_bridge(copy_dir):
    return load_bridge({"hf_dir": str(copy_dir), "name": "copy"}, device="cpu")


@pytest.fixture(scope="module")
def two_prev_dir(tmp_path_factory: pytest.TempPathFactory):
    """Two layers, residual = positional embedding everywhere; L0H1 and L1H0 exact
    previous-token heads reading it, the other heads uniform."""
    spec = hb.positional_spec(n_ctx=N, n_layer=2, n_head=2, scores={
        (0, 1): hb.previous_token_scores(N), (1, 0): hb.previous_token_scores(N)})
    return hb.save_model_dir(spec, tmp_path_factory.mktemp("models") / "twoprev")


@pytest.fixture(scope="module")
def two_prev_bridge(two_prev_dir):
    return load_bridge({"hf_dir": str(two_prev_dir), "name": "twoprev"}, device="cpu")


TOKENS = np.array([0, 3, 5, 5, 1, 7, 2, 2, 2, 6, 4, 3])


def snapshot(bridge) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    params = {k: v.detach().clone() for k, v in bridge.state_dict().items()}
    with torch.inference_mode():
        logits = bridge(torch.as_tensor(TOKENS[None]))
    return params, logits


def assert_unchanged(bridge, snap) -> None:
    params, logits = snap
    now = bridge.state_dict()
    assert params.keys() == now.keys()
    for k, v in params.items():
        assert torch.equal(v, now[k]), f"parameter {k} changed"
    assert all(not hp.fwd_hooks for hp in bridge.hook_dict.values()), "a hook was left behind"
    with torch.inference_mode():
        assert torch.equal(bridge(torch.as_tensor(TOKENS[None])), logits)


# ----------------------------------------------------------------- pure helpers
def test_knockout_rows_every_period():
    rows = iv.knockout_rows(12, 5)
    assert np.flatnonzero(rows).tolist() == [5, 10]
    assert np.flatnonzero(iv.knockout_rows(12, 5, phase=1)).tolist() == [1, 6, 11]
    with pytest.raises(PosmechError):
        iv.knockout_rows(12, 5, phase=5)


def test_repeat_queries():
    assert np.flatnonzero(iv.repeat_queries(TOKENS)).tolist() == [3, 7, 8]


def test_minimal_sequences_drop_extensions():
    assert iv.minimal_sequences([[1], [1, 2], [3, 4], [3, 4], [5, 6, 7], [5, 6]]) == [(1,), (3, 4), (5, 6)]


def test_extended_shift_leaves_first_rows_and_k1_is_zero():
    E = np.random.default_rng(0).normal(size=(11, 3))
    assert not iv.extended_shift(E, 1, 1, group_average).any()
    d = iv.extended_shift(E, 5, 1, group_average)
    assert not d[0].any()
    np.testing.assert_allclose((E + d)[1:6], np.broadcast_to(E[1:6].mean(0), (5, 3)))
    np.testing.assert_allclose((E + d)[6:11], np.broadcast_to(E[6:11].mean(0), (5, 3)))


# ----------------------------------------------------------------- hooks on the copy model
def test_copy_model_predicts_previous_token(copy_bridge):
    _, lg = iv.run_hooked(copy_bridge, TOKENS, logits=True)
    assert (lg[1:].argmax(-1) == TOKENS[:-1]).all()


@pytest.mark.float32
@pytest.mark.parametrize("renormalise", [False, True])
def test_knockout_changes_exactly_the_predicted_rows(copy_bridge, renormalise):
    snap = snapshot(copy_bridge)
    rows = iv.knockout_rows(N, 5)  # queries 5 and 10
    pats0, lg0 = iv.run_hooked(copy_bridge, TOKENS, capture=[(0, 1)], logits=True)
    pats, lg = iv.run_hooked(copy_bridge, TOKENS, iv.knockout_hooks([0], rows, renormalise), capture=[(0, 1)],
                             logits=True)
    changed = np.abs(lg - lg0).max(-1) > 1e-4
    assert np.flatnonzero(changed).tolist() == [5, 10]
    np.testing.assert_array_equal(lg[~rows], lg0[~rows])  # every other row bitwise unchanged
    P = pats[(0, 1)]
    for q in (5, 10):
        assert P[q, q - 1] == 0.0
        if renormalise:
            # the remaining (tiny, equal) scores are renormalised: uniform over keys != q - 1
            keys = [k for k in range(q + 1) if k != q - 1]
            np.testing.assert_allclose(P[q, keys], 1 / len(keys), rtol=1e-4)
            counts = np.bincount(TOKENS[keys], minlength=V)
            assert np.corrcoef(lg[q], counts)[0, 1] > 0.9999  # output = mean of those tokens
        else:
            assert P[q].sum() < 1e-4
            assert np.ptp(lg[q]) < 1e-3  # the head writes ~nothing: uniform prediction
    assert_unchanged(copy_bridge, snap)


def test_knockout_hook_is_removed_on_error(copy_bridge):
    snap = snapshot(copy_bridge)

    def boom(p, hook):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        iv.run_hooked(copy_bridge, TOKENS, [*iv.knockout_hooks([0], iv.knockout_rows(N, 5), False),
                                            ("blocks.0.attn.hook_z", boom)])
    assert_unchanged(copy_bridge, snap)


def test_unchanged_guard_catches_leaks(copy_bridge):
    with iv.unchanged(copy_bridge):
        iv.run_hooked(copy_bridge, TOKENS, iv.knockout_hooks([0], iv.knockout_rows(N, 5), True))
    W = copy_bridge.W_pos
    saved = W.detach().clone()
    try:
        with pytest.raises(PosmechError, match="weights"), iv.unchanged(copy_bridge):
            with torch.no_grad():
                W[3, 0] += 1.0
    finally:
        with torch.no_grad():
            W.copy_(saved)
    with pytest.raises(PosmechError, match="hook"), iv.unchanged(copy_bridge):
        copy_bridge.hook_dict["blocks.0.attn.hook_z"].add_hook(lambda z, hook: z)
    copy_bridge.reset_hooks()
    assert_unchanged(copy_bridge, snapshot(copy_bridge))


def test_redirect_and_scale(copy_bridge):
    snap = snapshot(copy_bridge)
    red = iv.redirect_hook(0, 1, {9: 2})
    pats, lg = iv.run_hooked(copy_bridge, TOKENS, [red], capture=[(0, 1)], logits=True)
    assert pats[(0, 1)][9].tolist() == [0, 0, 1] + [0] * 9
    assert lg[9].argmax() == TOKENS[2]  # the copy head now reads position 2
    got = {}
    grab = ("blocks.0.attn.hook_z", lambda z, hook: got.setdefault("z", z.clone()))
    iv.run_hooked(copy_bridge, TOKENS, [grab])
    iv.run_hooked(copy_bridge, TOKENS, [iv.scale_head_hook(0, 1, 2.0), ("blocks.0.attn.hook_z",
                                        lambda z, hook: got.setdefault("z2", z.clone()))])
    torch.testing.assert_close(got["z2"][:, :, 1], 2 * got["z"][:, :, 1], rtol=0, atol=0)
    torch.testing.assert_close(got["z2"][:, :, 0], got["z"][:, :, 0], rtol=0, atol=0)
    with pytest.raises(PosmechError, match="before the query"):
        iv.redirect_hook(0, 1, {3: 5})
    assert_unchanged(copy_bridge, snap)


@pytest.mark.float32
def test_continuation_probability_sums_sequences(copy_bridge):
    """continuation_probability reads the logits at the prompt's last position only, ``probs``
    from a full pass of another length: float32 rounding apart (another BLAS kernel)."""
    def probs(tokens):
        _, lg = iv.run_hooked(copy_bridge, tokens, logits=True)
        p = np.exp(lg[-1] - lg[-1].max())
        return p / p.sum()

    x = TOKENS[:10]
    p = probs(x)
    assert p.argmax() == x[-2]
    assert continuation_probability(copy_bridge, x, [(1,)]) == pytest.approx(p[1], rel=FLOAT32_FORWARD_REL)
    assert continuation_probability(copy_bridge, x, [(1,), (2,)]) == pytest.approx(p[1] + p[2], rel=FLOAT32_FORWARD_REL)
    # two tokens: P(5) · P(3 | ..., 5), teacher-forced
    p2 = probs(np.append(x, 5))
    assert continuation_probability(copy_bridge, x, [(5, 3)]) == pytest.approx(p[5] * p2[3], rel=FLOAT32_FORWARD_REL)


# ----------------------------------------------------------------- experiments
@pytest.mark.float32
def test_prev_knockout_experiment(copy_bridge):
    snap = snapshot(copy_bridge)
    rows, zoom = iv.prev_knockout(copy_bridge, [TOKENS, TOKENS[:8]], "L0H1", layers=[0], period=5, zoom=6)
    by = {(r["document"], r["condition"], r["query_set"]): r for r in rows}
    assert len(rows) == 2 * 3 * 3
    assert by[(0, "intact", "all")]["prev_mass"] > 0.999
    assert by[(0, "knockout", "knocked")]["prev_mass"] == 0.0
    assert by[(0, "knockout", "knocked")]["n_queries"] == 2
    assert by[(1, "knockout", "knocked")]["n_queries"] == 1  # only query 5 in 8 tokens
    assert by[(0, "knockout", "other")]["prev_mass"] == by[(0, "intact", "other")]["prev_mass"]
    assert by[(0, "knockout", "all")]["prev_mass"] == pytest.approx(by[(0, "intact", "all")]["prev_mass"] * 9 / 11,
                                                                     rel=FLOAT32_FORWARD_REL)
    assert set(zoom.matrices) == {"intact", "knockout", "knockout_renormalised"}
    assert zoom.matrices["intact"].shape == (6, 6) and zoom.marks.tolist() == [False] * 5 + [True]
    assert_unchanged(copy_bridge, snap)


def relay_spec() -> hb.Spec:
    """P5's mechanism, planted (posmech.verdicts.selfcheck.relay_spec): L1H0 finds the previous position
    only through layer 0's copy; at a knocked-out query it attends uniformly, mass 1 / (q + 1)."""
    from posmech.verdicts.selfcheck import relay_spec as planted

    return planted(N)


@pytest.mark.float32
@pytest.mark.parametrize("engine", ["bridge", "posmech"])
def test_knockout_disrupts_a_later_head_only_if_it_reads_layer_0(tmp_path, two_prev_dir, engine):
    """P5 tells the two ways a layer-1 previous-token head can work apart.  Reading layer 0's
    copy of the previous position (``relay_spec``), knocking out layer 0's attention to the
    previous position at queries 5 and 10 leaves L1H0 uniform there (mass 1/6 and 1/11,
    every other query unchanged at ~1); reading the positions itself (``two_prev_dir``, as
    the trained demo model's L1H0 does), the same knock-out changes nothing."""
    relay = load_model({"hf_dir": str(hb.save_model_dir(relay_spec(), tmp_path / "relay")), "name": "relay"},
                       device="cpu", engine=engine)
    rows, zoom = iv.prev_knockout(relay, [TOKENS], "L1H0", layers=[0], period=5, zoom=N)
    by = {(r["condition"], r["query_set"]): r["prev_mass"] for r in rows}
    assert by[("intact", "all")] > 0.999
    assert by[("knockout", "knocked")] == pytest.approx((1 / 6 + 1 / 11) / 2, abs=1e-5)
    assert by[("knockout", "other")] > 0.999
    assert by[("knockout_renormalised", "knocked")] < 0.2  # layer 0 copied some other position
    knocked = zoom.matrices["knockout"]
    for q in (5, 10):
        np.testing.assert_allclose(knocked[q, : q + 1], 1.0 / (q + 1), atol=1e-5)
    params = {**head_columns("L1H0"), "layers": [0], "period": 5, "phase": 0}
    card = {r["quantity"]: r for r in iv.knockout_scorecard(iv.tidy(rows, "P5", "relay", params), "relay", "f.png")}
    assert card["prev_token_mass_ratio"]["value"] == pytest.approx((9 + 1 / 6 + 1 / 11) / 11, abs=1e-4)
    assert "no effect" not in card["prev_token_mass_ratio"]["detail"]

    direct = load_model({"hf_dir": str(two_prev_dir), "name": "twoprev"}, device="cpu", engine=engine)
    rows, _ = iv.prev_knockout(direct, [TOKENS], "L1H0", layers=[0], period=5, zoom=N)
    by = {(r["condition"], r["query_set"]): r["prev_mass"] for r in rows}
    assert by[("intact", "all")] > 0.999
    for condition in ("knockout", "knockout_renormalised"):
        for query_set in ("all", "knocked", "other"):
            assert by[(condition, query_set)] == pytest.approx(by[("intact", query_set)], abs=FLOAT32_FORWARD_ABS)
    card = {r["quantity"]: r for r in iv.knockout_scorecard(iv.tidy(rows, "P5", "direct", params), "direct", "f.png")}
    for quantity in ("prev_token_mass_ratio", "prev_token_mass_ratio_renormalised"):
        assert card[quantity]["value"] == pytest.approx(1.0, abs=FLOAT32_FORWARD_ABS)
        assert card[quantity]["detail"].startswith(
            "no effect (prev-token mass +0.000): L1H0 does not rely on layer 0's attention to the previous position;")


def test_a_twins_knockout_computes_only_the_claimed_conditions(tmp_path):
    """A random-init twin's null (config ``twins.claims_only``) computes only the conditions P5's
    claim reads (intact, knockout): the same rows as the full run's for them, the same
    ``prev_token_mass_ratio_knocked``; the renormalised rows say they were not computed."""
    relay = load_model({"hf_dir": str(hb.save_model_dir(relay_spec(), tmp_path / "relay")), "name": "relay"},
                       device="cpu", engine="posmech")
    full, _ = iv.prev_knockout(relay, [TOKENS, TOKENS[:8]], "L1H0", layers=[0], period=5, zoom=N)
    only, zoom = iv.prev_knockout(relay, [TOKENS, TOKENS[:8]], "L1H0", layers=[0], period=5, zoom=N,
                                  conditions=iv.CLAIMED_KNOCKOUT_CONDITIONS)
    assert {r["condition"] for r in full} == set(iv.KNOCKOUT_CONDITIONS)
    assert only == [r for r in full if r["condition"] in iv.CLAIMED_KNOCKOUT_CONDITIONS]
    assert set(zoom.matrices) == set(iv.CLAIMED_KNOCKOUT_CONDITIONS)
    params = {**head_columns("L1H0"), "layers": [0], "period": 5, "phase": 0}

    def card(rows):
        return {r["quantity"]: r for r in iv.knockout_scorecard(iv.tidy(rows, "P5", "m", params), "m", "f.png")}

    a, b = card(full), card(only)
    assert a.keys() == b.keys()
    for q in ("prev_token_mass_ratio_knocked", "prev_token_mass_ratio", "prev_token_mass_intact"):
        assert b[q] == a[q]
    for q in ("prev_token_mass_ratio_renormalised", "prev_token_mass_knockout_renormalised"):
        assert b[q]["value"] is None and "twins.claims_only" in b[q]["detail"]
    with pytest.raises(PosmechError, match="conditions"):
        iv.prev_knockout(relay, [TOKENS], "L1H0", layers=[0], period=5, conditions=("knockout",))


def test_knockout_rows_say_what_this_run_knocked_out(tmp_path):
    """P5's row text is written from the run (issue 27): the head, the layers, the queries
    and the documents of this table, not the post's L4H11 / layers 0-3 / every 5th query."""
    rows = [{"document": d, "n_tokens": 40, "condition": c, "query_set": qs, "n_queries": n, "prev_mass": m}
            for d in range(3) for c, m in (("intact", 0.9), ("knockout", 0.3), ("knockout_renormalised", 0.5))
            for qs, n in (("all", 39), ("knocked", 13), ("other", 26))]
    params = {**head_columns("L2H1"), "layers": [0, 1], "period": 3, "phase": 1}
    card = {r["quantity"]: r for r in iv.knockout_scorecard(iv.tidy(rows, "P5", "m", params), "m", "f.png")}
    for q in ("prev_token_mass_ratio", "prev_token_mass_ratio_knocked"):
        detail = card[q]["detail"]
        assert detail.startswith("L2H1:") and "3 document(s)" in detail
        assert detail.endswith("knocked out: layers 0–1, every 3rd query (q % 3 == 1)")
        assert "L4H11" not in detail and "5th" not in detail and "0–3" not in detail
    assert card["prev_token_mass_intact"]["detail"] == "L2H1, all queries >= 1 of 3 document(s)"
    assert [iv.queries_words(p) for p in (1, 2, 5, 11, 21, 22)] == [
        "every query", "every 2nd query (q % 2 == 0)", "every 5th query (q % 5 == 0)",
        "every 11th query (q % 11 == 0)", "every 21st query (q % 21 == 0)", "every 22nd query (q % 22 == 0)"]


def test_knockout_verdict_names_the_layers_and_keeps_quiet_about_an_effect():
    assert iv.knockout_verdict(0.93, 0.94, "L4H11", [0, 1, 2, 3]) == (
        "no effect (prev-token mass +0.010): L4H11 does not rely on layers 0–3's attention to the previous position")
    assert iv.knockout_verdict(0.93, 0.90, "L4H11", [0, 1, 2, 3]) is None  # moved by NO_EFFECT or more
    assert iv.knockout_verdict(0.93, float("nan"), "L4H11", [0]) is None


@pytest.mark.float32
def test_extended_averaging_on_positional_model(two_prev_bridge):
    b = two_prev_bridge
    snap = snapshot(b)
    W = b.W_pos.detach().double().numpy()
    E = W - W.mean(0)
    # k = 1: nothing changes, bitwise
    rows1, _ = iv.extended_averaging(b, [TOKENS], ["L0H1", "L1H0"], {0: iv.extended_shift(E, 1, 0, group_average)})
    for r in [r for r in rows1 if r["condition"] == "averaged"]:
        twin = next(x for x in rows1 if x["condition"] == "intact" and x["head_name"] == r["head_name"])
        assert r["prev_mass"] == twin["prev_mass"]
    # k = 4 just before layer 1: positions of a group are identical there, so a query whose
    # previous position is in its group splits its attention evenly between the two
    deltas = {layer: iv.extended_shift(E, 4, 0, group_average) for layer in (0, 1)}
    rows, zooms = iv.extended_averaging(b, [TOKENS], ["L0H1", "L1H0"], deltas, zoom=N)
    got = {(r["head_name"], r["averaged_layer"], r["condition"]): r["prev_mass"] for r in rows}
    assert ("L0H1", 1, "averaged") not in got  # a head before the averaged layer is not measured
    assert got[("L1H0", 1, "intact")] > 0.999 and got[("L0H1", 0, "intact")] > 0.999
    assert got[("L1H0", 1, "averaged")] < 0.5
    assert got[("L0H1", 0, "averaged")] < 0.5
    P = zooms[1].matrices["averaged_L1"]
    for q in range(1, N):
        if q // 4 == (q - 1) // 4:
            assert P[q, q - 1] == pytest.approx(P[q, q], abs=FLOAT32_FORWARD_ABS)
    assert set(zooms[0].matrices) == {"intact", "averaged_L0"}
    assert_unchanged(b, snap)


@pytest.mark.float32
def test_repeated_tokens_on_positional_head(two_prev_bridge):
    snap = snapshot(two_prev_bridge)
    rows, zoom = iv.repeated_tokens(two_prev_bridge, [TOKENS, np.arange(N)], "L1H0", zoom=6, context=2)
    by = {(r["document"], r["query_set"]): r for r in rows}
    assert by[(0, "repeat")]["n_queries"] == 3 and by[(0, "other")]["n_queries"] == 8
    # a purely positional head ignores tokens: the same mass on repeats and elsewhere
    assert by[(0, "repeat")]["prev_mass"] == pytest.approx(by[(0, "other")]["prev_mass"], abs=FLOAT32_FORWARD_ABS)
    assert by[(1, "repeat")]["n_queries"] == 0 and np.isnan(by[(1, "repeat")]["prev_mass"])
    assert zoom.start == 1 and zoom.marks.tolist() == [False, False, True, False, False, False]
    assert_unchanged(two_prev_bridge, snap)


def test_build_induction_prompt_positions():
    tok = hb.char_tokenizer(60)  # printable characters up to "Z"
    spec = {"prompt": "AB CD EF; AB", "words": {"a": "AB", "b": " CD", "c": " EF"},
            "redirect": [{"query": "c", "key": "a"}, {"query": "b", "key": "before_a"}],
            "targets": {"cd": [" CD", " C", " CDX"], "ef": [" EF"]}}
    p = iv.build_induction_prompt(spec, tok, bos_id=0, n_ctx=20)
    assert p.tokens[0] == 0 and len(p.tokens) == 13
    assert p.positions == {"a": (1, 2), "b": (3, 5), "c": (6, 8), "before_a": (0, 0)}
    assert p.redirects == {6: 2, 3: 0}  # " EF" → "B" of "AB"; " CD" → the token before "AB"
    assert p.dropped["cd"] == [" CD", " CDX"]  # both extend " C"
    assert [len(s) for s in p.targets["cd"]] == [2]
    with pytest.raises(PosmechError, match="context"):
        iv.build_induction_prompt(spec, tok, bos_id=0, n_ctx=13)
    with pytest.raises(PosmechError, match="earlier positions"):
        iv.build_induction_prompt({**spec, "redirect": [{"query": "b", "key": "c"}]}, tok, bos_id=0, n_ctx=20)
    with pytest.raises(PosmechError, match="does not contain"):
        iv.build_induction_prompt({**spec, "prompt": "AB EF CD"}, tok, bos_id=0, n_ctx=20)


def test_induction_intervention_on_copy_model(copy_bridge):
    snap = snapshot(copy_bridge)
    prompt = iv.InductionPrompt(TOKENS, {}, {11: 4}, {"prev": [(int(TOKENS[10]),)], "redirected": [(int(TOKENS[4]),)]},
                                {}, {})
    rows, pats = iv.induction_intervention(copy_bridge, prompt, "L0H1", 2.0)
    p = {(r["condition"], r["target"]): r["probability"] for r in rows}
    assert p[("baseline", "prev")] > 0.9
    assert p[("redirect", "redirected")] > 0.9 and p[("redirect", "prev")] < 0.05
    assert p[("scale", "prev")] > p[("baseline", "prev")]  # doubled copy signal: sharper
    assert pats["redirect"][11, 4] == 1.0 and pats["baseline"][11, 10] > 0.999
    assert_unchanged(copy_bridge, snap)


def test_a_twins_induction_intervention_computes_only_the_claimed_condition(copy_bridge):
    """A random-init twin's null (config ``twins.claims_only``) computes only the condition P16's
    claim reads (``redirect_scale``): the same probabilities as in the full run, and the same
    ``p_redirected_after`` in the scorecard; the full run has all four conditions."""
    import pandas as pd

    prompt = iv.InductionPrompt(TOKENS, {}, {11: 4}, {"prev": [(int(TOKENS[10]),)], "redirected": [(int(TOKENS[4]),)]},
                                {}, {})
    full, _ = iv.induction_intervention(copy_bridge, prompt, "L0H1", 2.0)
    only, pats = iv.induction_intervention(copy_bridge, prompt, "L0H1", 2.0, iv.CLAIMED_CONDITIONS)
    assert {r["condition"] for r in full} == set(iv.INDUCTION_CONDITIONS)
    assert {r["condition"] for r in only} == {"redirect_scale"} and pats == {}
    assert only == [r for r in full if r["condition"] == "redirect_scale"]

    def after(rows):
        df = pd.DataFrame(rows).assign(head_name="L0H1")
        return next(r for r in iv.induction_scorecard(df, "m", "f.png", "redirected")
                    if r["quantity"] == "p_redirected_after")["value"]

    assert after(only) == after(full) and after(only) > 0.9
    with pytest.raises(PosmechError, match="conditions"):
        iv.induction_intervention(copy_bridge, prompt, "L0H1", 2.0, ("redirected",))


def _induction_intervention_one_pass_each(bridge, prompt, sharp, scale):
    """The previous implementation (a pass per condition and target, one more per
    multi-token sequence, two more for the patterns): the oracle of the batched one."""
    from scipy.special import log_softmax

    def prob(seqs, hooks):
        _, lg = iv.run_hooked(bridge, prompt.tokens, hooks, logits=True)
        first, total = log_softmax(lg[-1]), 0.0
        for s in seqs:
            lp = first[s[0]]
            if len(s) > 1:
                _, lg2 = iv.run_hooked(bridge, np.concatenate([prompt.tokens, np.asarray(s[:-1])]), hooks, logits=True)
                lsm = log_softmax(lg2[len(prompt.tokens):], axis=-1)
                lp += sum(lsm[i, s[i + 1]] for i in range(len(s) - 1))
            total += float(np.exp(lp))
        return total

    layer, head = iv.check_head(bridge, sharp)
    red, sc = iv.redirect_hook(layer, head, prompt.redirects), iv.scale_head_hook(layer, head, scale)
    hooks = {"baseline": [], "redirect": [red], "scale": [sc], "redirect_scale": [red, sc]}
    rows = [{"condition": c, "target": t, "probability": prob(seqs, hooks[c])}
            for c in iv.INDUCTION_CONDITIONS for t, seqs in prompt.targets.items()]
    base, _ = iv.run_hooked(bridge, prompt.tokens, capture=[(layer, head)])
    after, _ = iv.run_hooked(bridge, prompt.tokens, [red], capture=[(layer, head)])
    return rows, {"baseline": base[(layer, head)], "redirect": after[(layer, head)]}


@pytest.mark.float32
@pytest.mark.parametrize("engine", ["bridge", "posmech"])
def test_induction_intervention_equals_one_pass_per_sequence(copy_dir, engine):
    """Batched conditions (shared prompt rows, multi-token variants in one pass) give the
    previous implementation's numbers to float32 rounding, with and without the hooks."""
    model = load_model({"hf_dir": str(copy_dir), "name": "copy"}, device="cpu", engine=engine)
    tokens = TOKENS[:8]
    targets = {"one": [(2,), (6,)], "two": [(5, 3), (4, 4)], "three": [(5, 1, 7)], "shared": [(5, 3, 2), (1,)]}
    prompt = iv.InductionPrompt(tokens, {}, {7: 3, 6: 1}, targets, {}, {})
    rows, pats = iv.induction_intervention(model, prompt, "L0H1", 2.0)
    ref_rows, ref_pats = _induction_intervention_one_pass_each(model, prompt, "L0H1", 2.0)
    assert [(r["condition"], r["target"]) for r in rows] == [(r["condition"], r["target"]) for r in ref_rows]
    for r, ref in zip(rows, ref_rows):
        # float32 rounding of the logits, relative (some probabilities are ~1e-6: no absolute term)
        assert r["probability"] == pytest.approx(ref["probability"], rel=FLOAT32_FORWARD_REL, abs=0), r
    for k in ("baseline", "redirect"):
        np.testing.assert_allclose(pats[k], ref_pats[k], rtol=0, atol=FLOAT32_FORWARD_ABS)
    assert pats["redirect"][7, 3] == 1.0 and pats["baseline"][7, 6] > 0.99
    assert len({r["probability"] for r in rows}) > 4  # the conditions differ: the test can fail


def test_ninja_prompt_file_with_byte_level_bpe():
    """The shipped P16 prompt file, tokenized by a GPT-2-style byte-level BPE (trained here on
    the prompt, offline): the triple's words are single tokens with their leading space, the
    redirects hit " pirate" → " ninja" and " turtle" → the opening quote."""
    import yaml
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    spec = yaml.safe_load((Path(__file__).resolve().parents[2] / "resources/prompts/induction_ninja.yaml").read_text())
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    words = " ninja turtle pirate Turtle TURTLE turtles Turtles Pirate PIRATE pirates Pirates"
    tk.train_from_iterator([spec["prompt"], words] * 50, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<|endoftext|>")
    p = iv.build_induction_prompt(spec, tok, bos_id=tok.bos_token_id, n_ctx=1024)
    dec = lambda i: tok.decode([int(p.tokens[i])])  # noqa: E731
    assert [dec(p.positions[w][0]) for w in "abc"] == [" ninja", " turtle", " pirate"]
    assert dec(p.positions["before_a"][0]).strip() == '"'  # the opening quote (' "' in GPT-2's vocabulary)
    assert p.redirects == {p.positions["c"][0]: p.positions["a"][1], p.positions["b"][0]: p.positions["a"][0] - 1}
    assert tok.decode(p.tokens[-2:].tolist()).endswith('" ninja')  # the reply opens the triple again
    assert [tok.decode(list(s)) for s in p.targets["turtle"]][0] == " turtle"


@pytest.fixture(scope="module")
def self_suppressing_bridge(tmp_path_factory: pytest.TempPathFactory):
    """One head (L0H1) that finds the previous token the way the post says early heads do:
    scores grow with the key's position (8·i, halved by the token embedding's share of the
    layer norm) and a *token match* with the query is penalised (negative self-attention),
    so the current position loses to the previous one, except when that one holds the same
    token (P13, P14: footnote 3 of the post)."""
    spec = hb.positional_spec(n_ctx=N, n_layer=1, n_head=2, d_head=20, d_vocab=V,
                              scores={(0, 1): np.tile(8.0 * np.arange(N), (N, 1))})
    d = spec.d_model
    W_E = np.zeros((V, d))
    W_E[np.arange(V), 12 + np.arange(V)] = 1.0
    W_E[:, 38] = -1.0
    spec.W_E = W_E
    c = np.sqrt(20 * np.sqrt(spec.dh) / (d / 4))  # token-match penalty of 20 after LN
    W_Q, W_K = spec.heads[(0, 1)]["W_Q"], spec.heads[(0, 1)]["W_K"]
    W_Q[12 + np.arange(V), 1 + np.arange(V)] = c
    W_K[12 + np.arange(V), 1 + np.arange(V)] = -c
    path = hb.save_model_dir(spec, tmp_path_factory.mktemp("models") / "selfsup")
    return load_bridge({"hf_dir": str(path), "name": "selfsup"}, device="cpu")


def test_repeated_tokens_break_a_self_suppressing_head(self_suppressing_bridge):
    b = self_suppressing_bridge
    pats, _ = iv.run_hooked(b, TOKENS, capture=[(0, 1)])
    P = pats[(0, 1)]
    assert P[7].argmax() == 5 and P[8].argmax() == 5  # "2 2 2": both earlier 2s are suppressed too
    rows, zoom = iv.repeated_tokens(b, [TOKENS], "L0H1", zoom=N, context=0)
    by = {r["query_set"]: r for r in rows}
    assert by["repeat"]["n_queries"] == 3 and by["repeat"]["prev_mass"] < 0.01
    assert by["other"]["prev_mass"] > 0.95
    assert zoom.start == 0 and np.flatnonzero(zoom.marks).tolist() == [3, 7, 8]
    # the P14 rows name this run's head and query counts (issue 27: not the post's L4H11)
    card = {r["quantity"]: r for r in iv.repeated_scorecard(iv.tidy(rows, "P14", "m", head_columns("L0H1")), "m", "f")}
    n_other = by["other"]["n_queries"]
    assert card["repeat_token_blip"]["value"] > 0.9
    assert card["repeat_token_blip"]["detail"] == (
        f"L0H1: previous-token mass on the {n_other} other queries minus on the 3 repeated ones")


@pytest.mark.parametrize("engine", ["bridge", "posmech"])
def test_run_hooked_without_logits_captures_the_same_patterns(two_prev_dir, engine):
    """run_hooked asks for no logits unless they are read (the engine may stop after the last
    hooked layer): the captured patterns are those of the full pass, bitwise."""
    model = load_model({"hf_dir": str(two_prev_dir), "name": "twoprev"}, device="cpu", engine=engine)
    hooks = iv.knockout_hooks([0], iv.knockout_rows(N, 5), True)
    full, lg = iv.run_hooked(model, TOKENS, hooks, capture=[(0, 1), (1, 0)], logits=True)
    short, none = iv.run_hooked(model, TOKENS, hooks, capture=[(0, 1), (1, 0)])
    assert lg is not None and none is None
    for k in full:
        np.testing.assert_array_equal(short[k], full[k])
    first, _ = iv.run_hooked(model, TOKENS, hooks, capture=[(0, 1)])  # the posmech engine stops after layer 0
    np.testing.assert_array_equal(first[(0, 1)], full[(0, 1)])


@pytest.mark.float32
@pytest.mark.parametrize("engine", ["bridge", "posmech"])
def test_documents_of_equal_length_share_passes_with_the_same_results(two_prev_dir, engine, monkeypatch):
    """Consecutive documents of equal length run in one batched pass per condition
    (``BATCH_TOKENS``); the rows and zooms equal one pass per document (float32 rounding),
    documents of another length break the batch, and the order of the rows is the documents'."""
    model = load_model({"hf_dir": str(two_prev_dir), "name": "twoprev"}, device="cpu", engine=engine)
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 8, N) for _ in range(5)] + [TOKENS[:9]] + [rng.integers(0, 8, N) for _ in range(3)]
    W = model.W_pos.detach().double().numpy()
    deltas = {layer: iv.extended_shift(W - W.mean(0), 4, 0, group_average) for layer in (0, 1)}
    runs = {
        "P5": lambda: iv.prev_knockout(model, docs, "L1H0", [0], period=3, zoom=6),
        "P14": lambda: iv.repeated_tokens(model, docs, "L1H0", zoom=6, context=2),
        "P15": lambda: iv.extended_averaging(model, docs, ["L0H1", "L1H0"], deltas, zoom=6),
    }
    passes = []
    real = iv.run_hooked

    def counting(bridge, tokens, *a, **k):
        passes.append(np.asarray(tokens).shape)
        return real(bridge, tokens, *a, **k)

    monkeypatch.setattr(iv, "run_hooked", counting)
    for claim, experiment in runs.items():
        passes.clear()
        batched = experiment()
        shapes = set(passes)
        assert shapes == {(5, N), (1, 9), (3, N)}, (claim, passes)  # 3 groups per condition
        monkeypatch.setattr(iv, "BATCH_TOKENS", N)  # one document per pass
        passes.clear()
        single = experiment()
        monkeypatch.setattr(iv, "BATCH_TOKENS", 1024)
        assert set(passes) == {(1, N), (1, 9)}
        rows_b, rows_s = pd.DataFrame(batched[0]), pd.DataFrame(single[0])
        pd.testing.assert_frame_equal(rows_b, rows_s, check_exact=False, atol=FLOAT32_FORWARD_ABS, rtol=0)
        zb = batched[1] if isinstance(batched[1], list) else [batched[1]]
        zs = single[1] if isinstance(single[1], list) else [single[1]]
        for a, b in zip(zb, zs):
            assert a.matrices.keys() == b.matrices.keys()
            for key in a.matrices:
                np.testing.assert_allclose(a.matrices[key], b.matrices[key], atol=FLOAT32_FORWARD_ABS)


def test_table_meta_records_the_section_as_configured():
    """The tables record the ``interventions`` section as the config gives it (corpus null
    stays null; context-scaled keys as the job scaled them), and its hash."""
    from posmech.core.config import config_hash, scale_to_context

    s = defaults("interventions", corpus=None, prev_knockout={"layers": [0, 1]})
    raw = s.as_dict()
    assert raw["corpus"] is None and raw["prev_knockout"]["layers"] == [0, 1]
    assert s.corpus_or_first({"corpora": {"web": {}, "bible": {}}}) == "web"
    entry = {"processing": "compatibility"}
    meta = iv.table_meta({"source": "x"}, entry, s.scaled(128), {"sharp": ["L1H0"]})
    assert meta["interventions_config"] == scale_to_context("interventions", raw, 128)
    assert meta["config_hash"] == config_hash({"model": entry, "interventions": scale_to_context("interventions", raw, 128)})
