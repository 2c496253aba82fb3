"""The attention-only family (L1-L5) on hand-built attention-only models with planted scores
(``posmech.handbuilt.AttnOnlySpec``): every number is checked against its analytic value."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from scipy.special import softmax

from posmech.models import handbuilt as hb
from posmech.analyses import attn_only as ao
from posmech.core.errors import PosmechError
from posmech.models.loading import is_tl_legacy_dir, load_bridge, prepare_local_model
from posmech.settings import Settings, defaults
from posmech.verdicts.selfcheck import LB2_OFFSETS

from tests.tolerances import FLOAT32_FORWARD_ABS, FLOAT64_ABS, float32_logit_tol

N, V = 16, 24
PREV, LB2, IND = (0, 0), (0, 1), (1, 0)


def _spec() -> hb.AttnOnlySpec:
    """L0H0: exact previous-token head that copies the previous token (query 1 attends to itself:
    the L3 exception); L0H1: look-back-two head with planted position scores and random token
    scores; L1H0: induction head with a BOS sink (posmech.verdicts.selfcheck.planted_attn_only_spec)."""
    from posmech.verdicts.selfcheck import planted_attn_only_spec

    return planted_attn_only_spec(N, V)


def _params(**over):
    """The ``attn_only`` settings of these tests (the rest: the schema's defaults), ``over``
    replaced without the schema's validation (the library's own checks are under test); a
    nested section given as a dict updates its defaults."""
    s = defaults("attn_only", seed=0, n_sequences=40, n_tokens=12, query=8, first_query=3, bos="model",
                 batch_size=16, induction_score={"n_sequences": 8, "half_length": 6},
                 bos_induction={"n_samples": 30, "n_random": 7}, pin={})
    for key, value in over.items():
        old = getattr(s, key)
        if isinstance(old, Settings):
            value = type(old).from_section({**old.as_dict(), **value})
        s = s.replace(**{key: value})
    return s


ENTRY = {"prepend_bos": True}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    spec = _spec()
    d = hb.save_attn_only_dir(spec, tmp_path_factory.mktemp("ao") / "model")
    bridge = load_bridge({"hf_dir": str(d), "name": "hand"}, "cpu", "float32", "compatibility")
    return spec, bridge


def _tokens(n=6, T=13, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.integers(1, V, size=(n, T))
    x[:, 0] = 0
    return x


@pytest.mark.float32
def test_three_variants_give_exactly_the_planted_scores(model):
    spec, bridge = model
    x = _tokens()
    S_pos, S_tok = spec.scores_pos[LB2], spec.scores_tok[LB2]
    w_pos, w_tok = spec.both_weights()
    lower = np.tril(np.ones((13, 13), dtype=bool))
    f = {v: ao.run_variant(bridge, x, v, [LB2]) for v in ao.VARIANTS}
    for b in range(len(x)):
        tok = S_tok[np.ix_(x[b], x[b])]
        expect = {"position_only": S_pos[:13, :13], "token_only": tok, "both": w_pos * S_pos[:13, :13] + w_tok * tok}
        for v, E in expect.items():
            S, P = f[v].head(LB2)
            np.testing.assert_allclose(S[b][lower], E[lower], atol=2e-4, err_msg=v)
            assert np.isnan(S[b][~lower]).all()
            # patterns are the softmax of those scores over keys <= query
            Em = np.where(lower, E, -np.inf)
            np.testing.assert_allclose(P[b], softmax(Em, axis=-1), atol=2e-5, err_msg=v)


def test_position_only_input_ignores_the_tokens(model):
    _, bridge = model
    a = ao.run_variant(bridge, _tokens(seed=1), "position_only", [LB2, PREV])
    b = ao.run_variant(bridge, _tokens(seed=2), "position_only", [LB2, PREV])
    np.testing.assert_array_equal(a.patterns, b.patterns)


@pytest.mark.float32
def test_roles_found_and_look_back_two_masses_equal_the_analytic_softmax(model):
    spec, bridge = model
    p = _params()
    setup = ao.prepare(bridge, p, "hand", ENTRY)
    out = ao.random_token_patterns(bridge, p, setup)
    roles = {r["role"]: r["head_name"] for r in out["roles"]}
    assert roles == {"previous": "L0H0", "look_back_two": "L0H1", "induction": "L1H0"}
    assert all(r["source"] == "found" for r in out["roles"])
    rows = ao.input_decomposition(bridge, p, setup, {"previous": PREV, "look_back_two": LB2})
    df = ao.decomposition_table(rows, "hand")  # the table rule input_decomposition writes
    assert list(df.columns) == ["claim", "model", *ao.DECOMPOSITION_COLUMNS[1:]] and len(df) == len(rows)
    assert (df["model"] == "hand").all()
    assert list(ao.decomposition_table([], "hand").columns) == list(df.columns)  # no role filled: no rows
    # position-only: the analytic softmax of the planted offsets at query 8
    P = ao.mean_matrix(df, "L0H1", "position_only", "pattern_mean")
    expect = softmax(spec.scores_pos[LB2][8, :9])
    np.testing.assert_allclose(P[8, :9], expect, atol=FLOAT32_FORWARD_ABS)
    assert P[8, 6] == pytest.approx(np.exp(5) / (np.exp(5) + np.exp(4) + np.exp(3) + 6), abs=FLOAT32_FORWARD_ABS)
    # both inputs: the mean over the same sequences of per-sample softmaxes of w·S_pos + w·S_tok
    x = ao.random_tokens(setup.vocab, p.n_sequences, p.n_tokens, setup.bos, p.seed)
    w_pos, w_tok = spec.both_weights()
    per = [softmax(w_pos * spec.scores_pos[LB2][8, :9] + w_tok * spec.scores_tok[LB2][s[8], s[:9]]) for s in x]
    np.testing.assert_allclose(ao.mean_matrix(df, "L0H1", "both", "pattern_mean")[8, :9], np.mean(per, 0),
                               atol=1e-5)
    # the masses of L1 are those of the mean pattern
    masses = {(m["head_name"], m["mass"]): m["value"] for m in out["masses"]}
    mean_both = ao.mean_matrix(df, "L0H1", "both", "pattern_mean")
    q = np.arange(3, 13)
    # the same sequences in the same batches: the same float32 patterns, averaged in float64 in another order
    assert masses[("L0H1", "offset_2")] == pytest.approx(np.nanmean(mean_both[q, q - 2]), abs=FLOAT64_ABS)
    # the exact previous-token head: position-only row 1 attends to itself (the planted L3 exception)
    Pp = ao.mean_matrix(df, "L0H0", "position_only", "pattern_mean")
    assert Pp[1, 1] == pytest.approx(1.0, abs=FLOAT32_FORWARD_ABS)
    assert Pp[5, 4] == pytest.approx(1.0, abs=FLOAT32_FORWARD_ABS)
    assert set(df.loc[(df.role == "previous") & (df.variant == "position_only"), "claim"]) == {"L2,L3"}


@pytest.mark.float32
def test_bos_induction_gives_the_analytic_probability(model):
    spec, bridge = model
    p = _params()
    setup = ao.prepare(bridge, p, "hand", ENTRY, need_bos=True)
    rows, mean_rows = ao.bos_induction(bridge, p, setup, IND)
    got = {r["condition"]: r["value"] for r in rows if r["quantity"] == "p_B"}
    draws = ao.distinct_tokens(setup.vocab, 30, 9, p.seed + 2)
    expect = {}
    for cond, bos in (("with_bos", 0), ("without_bos", None)):
        x, _ = ao.induction_sequences(draws, bos)
        T = x.shape[1]
        prev_key = np.concatenate([[0, 1], np.arange(1, T - 1)])  # copy head: 0→0, 1→1 (L3), k→k-1
        res = [hb.induction_probability(spec, s, prev_key) for s in x]
        expect[cond] = np.mean([pr[d[1]] for (_, pr), d in zip(res, draws)])
        np.testing.assert_allclose(mean_rows[cond], np.mean([pat for pat, _ in res], 0), atol=1e-5)
    assert got["with_bos"] == pytest.approx(expect["with_bos"], rel=1e-4)
    assert got["without_bos"] == pytest.approx(expect["without_bos"], rel=1e-4)
    assert got["with_bos"] > 10 * got["without_bos"]  # the post's BOS effect, planted
    labels = [r["key_label"] for r in rows if r["condition"] == "with_bos" and r["quantity"] == "attention"]
    assert labels[:3] == ["BOS", "A", "B"] and labels[-1] == "A (query)"
    df = ao.claim_table("L4", "hand", rows, layer=IND[0], head=IND[1], head_name="L1H0")
    assert list(df.columns[:5]) == ["claim", "model", "layer", "head", "head_name"] and len(df) == len(rows)
    assert df.loc[df["quantity"] == "p_B", "value"].tolist() == [got["with_bos"], got["without_bos"]]


def _forward_counter(bridge):
    calls = []
    handle = bridge.register_forward_pre_hook(lambda *a: calls.append(1))
    return calls, handle


@pytest.mark.parametrize(
    "over, key",
    [
        ({"pin": {"hand": {"induction": "L2H0"}}}, "attn_only.pin.hand.induction"),
        ({"pin": {"hand": {"previous": "L0H7"}}}, "attn_only.pin.hand.previous"),
        ({"pin": {"hand": {"previous": "head3"}}}, "attn_only.pin.hand.previous"),
        ({"n_tokens": 20}, "attn_only.n_tokens"),
        ({"induction_score": {"n_sequences": 4, "half_length": 9}}, "attn_only.induction_score.half_length"),
        ({"bos_induction": {"n_samples": 4, "n_random": 13}}, "attn_only.bos_induction.n_random"),
        ({"query": 13}, "attn_only.query"),
        ({"n_sequences": 0}, "attn_only.n_sequences"),
    ],
)
def test_bad_settings_fail_naming_the_key_before_any_forward(model, over, key):
    _, bridge = model
    calls, h = _forward_counter(bridge)
    try:
        with pytest.raises(PosmechError, match=key.replace(".", r"\.")):
            ao.prepare(bridge, _params(**over), "hand", ENTRY)
    finally:
        h.remove()
    assert not calls


def test_tokenizer_without_bos_fails_naming_the_key(model):
    _, bridge = model
    tok = bridge.tokenizer
    saved = tok.bos_token
    calls, h = _forward_counter(bridge)
    try:
        tok.bos_token = None
        with pytest.raises(PosmechError, match=r"attn_only\.bos.*no BOS token"):
            ao.prepare(bridge, _params(bos=True), "hand", ENTRY)
        ao.prepare(bridge, _params(bos=False), "hand", ENTRY)  # without BOS nothing is asked of it
    finally:
        tok.bos_token = saved
        h.remove()
    assert not calls


def test_rotary_model_on_the_bridge_is_refused(tmp_path):
    """A rotary model (GPT-NeoX) has no positional embedding to zero: its token-only input runs
    every token at position 0, which the bridge cannot (the engine can:
    tests/analyses/test_attn_only_schemes.py)."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    cfg = GPTNeoXConfig(vocab_size=V, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=N, bos_token_id=0, eos_token_id=0)
    d = tmp_path / "neox"
    GPTNeoXForCausalLM(cfg).save_pretrained(d, safe_serialization=True)
    hb.char_tokenizer(V).save_pretrained(d)
    bridge = load_bridge({"hf_dir": str(d), "name": "neox"}, "cpu", "float32", "raw")
    calls, h = _forward_counter(bridge)
    with pytest.raises(PosmechError, match=r"model `neox`.*rotary.*engine"):
        ao.prepare(bridge, _params(), "neox", ENTRY)
    h.remove()
    assert not calls


def test_legacy_pth_checkpoint_is_converted_and_loads(tmp_path, model):
    """A hand-made legacy directory (TransformerLens config.json + model_final.pth) goes through
    fetch_model's conversion (prepare_local_model) and gives the same scores as the model."""
    spec, bridge = model
    src = hb.save_attn_only_dir(spec, tmp_path / "legacy", weights="pth")
    assert is_tl_legacy_dir(src) and not list(src.glob("*.safetensors"))
    m = prepare_local_model("legacy", {"source": str(src)}, tmp_path / "resources")
    assert m["hf_dir"] != str(src) and (tmp_path / "resources/hf/model.safetensors").is_file()
    loaded = load_bridge(m, "cpu", "float32", "compatibility")
    x = _tokens()
    a = ao.run_variant(loaded, x, "both", [LB2, IND])
    b = ao.run_variant(bridge, x, "both", [LB2, IND])
    np.testing.assert_allclose(a.scores, b.scores, atol=1e-6)


def test_shortformer_checkpoint_is_refused_by_name(tmp_path, model):
    spec, _ = model
    src = hb.save_attn_only_dir(spec, tmp_path / "short", weights="pth", positional="shortformer")
    assert json.loads((src / "config.json").read_text())["positional_embedding_type"] == "shortformer"
    with pytest.raises(PosmechError, match=r"models\.short\.source.*shortformer"):
        prepare_local_model("short", {"source": str(src)}, tmp_path / "resources")
    assert not (tmp_path / "resources/hf").exists()
    s2 = hb.save_attn_only_dir(spec, tmp_path / "short2", positional="shortformer")  # already safetensors
    with pytest.raises(PosmechError, match="shortformer"):
        load_bridge({"hf_dir": str(s2), "name": "short2"}, "cpu", "float32", "raw")


@pytest.mark.float32
def test_scores_match_the_pattern_on_a_random_legacy_model(tmp_path):
    """On random weights (no planted structure) the recomputed scores still give the model's pattern."""
    from tests.models.test_loading import _legacy_dir

    d, _ = _legacy_dir(tmp_path / "legacy")
    bridge = load_bridge({"hf_dir": str(d), "name": "r"}, "cpu", "float32", "compatibility")
    x = np.random.default_rng(0).integers(1, 20, size=(3, 10))
    for v in ao.VARIANTS:
        f = ao.run_variant(bridge, x, v)
        S = np.where(np.isnan(f.scores), -np.inf, f.scores)
        np.testing.assert_allclose(softmax(S, axis=-1), f.patterns, atol=1e-5)
    assert torch.is_grad_enabled()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return hb.save_attn_only_dir(_spec(), tmp_path_factory.mktemp("ao") / "model_dir")


@pytest.mark.float32
@pytest.mark.parametrize("engine", ["bridge", "posmech"])
def test_target_logprob_read_at_the_last_position_equals_the_full_logits(model_dir, engine):
    """run_variant makes logits only at the last position (and none without targets): the
    log-probabilities equal the full pass's, and the scores/patterns do not depend on it."""
    from posmech.models.loading import load_model

    m = load_model({"hf_dir": str(model_dir), "name": "hand"}, "cpu", "float32", "compatibility", engine)
    x = _tokens(n=7)
    targets = np.random.default_rng(3).integers(0, V, size=len(x))
    for v in ao.VARIANTS:
        f = ao.run_variant(m, x, v, [PREV, IND], targets=targets, batch_size=3)
        with torch.inference_mode(), m.hooks(fwd_hooks=ao.variant_hooks(v)):
            logits = m(torch.as_tensor(x))[:, -1].double()
        ref = torch.log_softmax(logits, -1)[np.arange(len(x)), targets].numpy()
        # float32 rounding: a few ulps of the largest logit (|l| up to ~40 here)
        np.testing.assert_allclose(f.target_logprob, ref, rtol=0, atol=float32_logit_tol(logits), err_msg=v)
        g = ao.run_variant(m, x, v, [PREV, IND], batch_size=3)
        assert g.target_logprob is None
        np.testing.assert_array_equal(g.patterns, f.patterns)
        np.testing.assert_array_equal(np.isnan(g.scores), np.isnan(f.scores))
    assert all(not hp.fwd_hooks for hp in m.hook_dict.values())


def test_settings_select_models_and_check_lengths_before_any_job():
    """posmech.settings.attn_only: the models of the section (by BOS), the longest sequence of
    the memory estimate, and the checks the config alone allows (what common.smk runs when
    the workflow is parsed); the library's checks take the same settings."""
    from posmech.settings import attn_only as aos

    config = {"corpora": {"bible": {}},
              "models": {"a": {"prepend_bos": False, "train": {"n_ctx": 16}}, "b": {"source": "gpt2"}}}
    s = defaults("attn_only", induction_score={"half_length": 7})
    assert aos.models(s, config) == ["a", "b"]
    assert aos.models(s, config, bos=True) == ["b"] and aos.models(s, config, bos=False) == ["a"]
    assert aos.models(s.replace(models=["b"]), config) == ["b"]
    assert s.bos_for(config["models"]["a"]) is False and s.replace(bos=True).bos_for({}) is True
    assert s.bos_for(config["models"]["b"]) is True
    assert s.sequence_lengths(True) == {"attn_only.n_tokens": 13, "attn_only.induction_score.half_length": 15,
                                           "attn_only.bos_induction.n_random": 11}
    assert s.longest_sequence("n_tokens", "induction_score.half_length") == 15
    aos.check(s, config)  # 14 tokens without BOS fit model a's 16
    with pytest.raises(PosmechError, match=r"attn_only\.induction_score\.half_length: sequences of 18 tokens are "
                                           r"longer than model `a`'s context \(models\.a\.train\.n_ctx = 16\)"):
        aos.check(_params(induction_score={"half_length": 9}), config)
    with pytest.raises(PosmechError, match=r"attn_only\.query: 13 is not a query position"):
        aos.check(s.replace(query=13), config)
    with pytest.raises(PosmechError, match=r"attn_only\.first_query"):
        s.replace(first_query=2).check()
