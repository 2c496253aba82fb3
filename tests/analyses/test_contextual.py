"""The layer-0 decomposition and the contextual-head analyses (K6–K10) on hand-built
models whose answers are known.

The models here have a residual stream laid out as ``[one-hot positions | spare |
one-hot tokens | spare]`` with ``W_pos[i] = a(e_i − e_spare)`` and ``W_E[x] = b(e_x −
e_spare')``: every residual has zero mean and the same variance, so the layer-0 LayerNorm
scale is the same constant σ for every token at every position, and the linear-LN
decomposition is exact.  Each head's query/key weights plant a score
``P[n, i] + C[x_i] + D·[x_i = x_n]`` (positional matrix ``P``, content vector ``C``,
duplicate-token strength ``D``)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from posmech.analyses import kernels as kn
from posmech.analyses import contextual as cx
from posmech.data.tokens import TokenSet
from posmech.core.errors import PosmechError
from posmech.models import handbuilt as hb
from posmech.models.loading import load_bridge

from tests.tolerances import FLOAT32_FORWARD_ABS, FLOAT32_STORAGE_REL, FLOAT64_ABS, FLOAT64_REL

N_CTX, V, H, DH = 48, 8, 4, 64
A, B = 1.0, 0.7  # positional and token amplitudes


def plant(heads: dict[int, dict], n_ctx: int = N_CTX, d_vocab: int = V, n_head: int = H, d_head: int = DH,
          a: float = A, b: float = B) -> tuple[hb.Spec, float]:
    """A one-layer model with the layout of the module docstring and planted heads
    ``heads[h] = {"P": [n_ctx, n_ctx], "C": [d_vocab], "D": float}``; returns the spec and σ."""
    d = n_head * d_head
    assert d >= n_ctx + d_vocab + 2
    t0 = n_ctx + 1
    W_pos = np.zeros((n_ctx, d))
    W_pos[np.arange(n_ctx), np.arange(n_ctx)] = a
    W_pos[:, n_ctx] = -a
    W_E = np.zeros((d_vocab, d))
    W_E[np.arange(d_vocab), t0 + np.arange(d_vocab)] = b
    W_E[:, t0 + d_vocab] = -b
    sigma = math.sqrt((2 * a * a + 2 * b * b) / d + 1e-12)
    spec = hb.Spec(1, n_head, d, n_ctx, d_vocab, d_head, W_E=W_E, W_pos=W_pos)
    root = math.sqrt(d_head)
    for h, plan in heads.items():
        W_Q, W_K = np.zeros((d, d_head)), np.zeros((d, d_head))
        b_Q = np.zeros(d_head)
        P = plan.get("P", np.zeros((n_ctx, n_ctx)))
        U, S, Vt = np.linalg.svd(P)
        r = int((S > 1e-10 * max(1.0, S[0])).sum())
        W_Q[:n_ctx, :r] = U[:, :r] * np.sqrt(S[:r]) * sigma / a
        W_K[:n_ctx, :r] = Vt[:r].T * np.sqrt(S[:r]) * sigma / a * root
        b_Q[r] = 1.0
        W_K[t0 : t0 + d_vocab, r] = np.asarray(plan.get("C", np.zeros(d_vocab))) * sigma / b * root
        if plan.get("D"):
            cols = r + 1 + np.arange(d_vocab)
            assert cols[-1] < d_head
            W_Q[t0 + np.arange(d_vocab), cols] = sigma / b
            W_K[t0 + np.arange(d_vocab), cols] = plan["D"] * sigma / b * root
        spec.heads[(0, h)] = {"W_Q": W_Q, "W_K": W_K, "b_Q": b_Q}
    return spec, sigma


def offsets(n: int) -> np.ndarray:
    return np.subtract.outer(np.arange(n), np.arange(n)).astype(float)


def previous_token(n: int, strength: float = 10.0) -> np.ndarray:
    P = np.zeros((n, n))
    P[np.arange(1, n), np.arange(n - 1)] = strength
    return P


RNG = np.random.default_rng(0)
C_PLANTED = RNG.normal(0, 1.0, V)
P_ADDITIVE = -0.15 * offsets(N_CTX) + RNG.normal(0, 0.3, (N_CTX, N_CTX))
PLANS = {
    0: {"D": 10.0},  # duplicate-token
    1: {"P": previous_token(N_CTX)},  # local (detokenization)
    2: {"P": -0.1 * offsets(N_CTX), "C": C_PLANTED},  # slowly decaying (contextual), content planted
    3: {},  # uniform (other)
}


@pytest.fixture(scope="module")
def planted():
    spec, sigma = plant(PLANS)
    model = hb.to_hf(spec)
    return model, cx.weights_from_hf(model), measured(model, sigma)


def measured(model, sigma):
    """The LN scale of the float32 model: constant over tokens and positions, σ to float32 rounding."""
    w = cx.weights_from_hf(model)
    s = w.ln_scale(np.repeat(np.arange(V), N_CTX), np.tile(np.arange(N_CTX), V))
    assert s.std() < 1e-15 * s.mean() + 1e-18 and s[0] == pytest.approx(sigma, rel=FLOAT32_STORAGE_REL)
    return float(s[0])


@pytest.fixture(scope="module")
def additive():
    spec, sigma = plant({0: {"P": P_ADDITIVE, "C": C_PLANTED}, 1: {"P": P_ADDITIVE, "C": -C_PLANTED, "D": 3.0}})
    model = hb.to_hf(spec)
    return model, cx.weights_from_hf(model), measured(model, sigma)


def hf_layer0(model, ids):
    with torch.no_grad():
        return model(torch.as_tensor(ids)[None], output_attentions=True).attentions[0][0].double().numpy()


def built(tmp_path, w, texts, destination=5):
    """``layer0.h5`` of the planted model over ``texts`` (positions up to N_CTX − 2), read back."""
    path = tmp_path / "layer0.h5"
    info = cx.build_decomposition(w, destination, "x", tokenset(texts),
                                  [{"corpus": "c", "doc_index": j, "title": f"t{j}", "ids": t}
                                   for j, t in enumerate(texts)], N_CTX - 2, None, path, {"model": "planted"})
    return cx.read_decomposition(path), info


def tokenset(texts):
    lengths = np.array([len(t) for t in texts])
    return TokenSet(np.concatenate(texts).astype(np.int32), np.concatenate([[0], np.cumsum(lengths)]), {},
                    [f"text {j}" for j in range(len(texts))])


# --------------------------------------------------------------------------- decomposition
def test_ln_scale_is_the_planted_constant(additive):
    _, w, sigma = additive
    ids = RNG.integers(0, V, N_CTX)
    np.testing.assert_allclose(w.ln_scale(ids, np.arange(N_CTX)), sigma, rtol=FLOAT64_REL)


@pytest.mark.float32
def test_planted_additive_scores_recover_p_c_z_exactly(additive):
    model, w, sigma = additive
    ids = RNG.integers(0, V, N_CTX)
    pos = np.arange(1, N_CTX)
    dec = cx.decompose(w, sigma, ids, pos, None)
    for q, n in enumerate(pos):
        p = np.exp(P_ADDITIVE[n, : n + 1] - P_ADDITIVE[n, : n + 1].max())
        p /= p.sum()
        c = np.exp(C_PLANTED[ids[: n + 1]])
        # float64 from the float32 weights (each rounded once): relative, every p > 0
        np.testing.assert_allclose(dec.p[0, q, : n + 1], p, rtol=1e-5)
        # κ is defined up to nothing here: b_K = 0 and the query's content coordinate is exactly 1
        np.testing.assert_allclose(dec.c[0, q, : n + 1], c, rtol=1e-5)
        np.testing.assert_allclose(np.exp(dec.log_z[0, q]), (p * c).sum(), rtol=1e-5)
        dup = 3.0 * (ids[: n + 1] == ids[n])
        np.testing.assert_allclose(dec.c[1, q, : n + 1], np.exp(-C_PLANTED[ids[: n + 1]] + dup), rtol=1e-5)
        assert dec.p[0, q, n + 1 :].sum() == 0 and dec.c[0, q, n + 1 :].sum() == 0
    # A = p·c/Z is an identity, and with a constant LN scale the exact pattern is the same
    np.testing.assert_allclose(dec.p * dec.c / np.exp(dec.log_z)[..., None], dec.linear, atol=FLOAT64_ABS)
    np.testing.assert_allclose(dec.linear, dec.attention, atol=FLOAT64_ABS)
    np.testing.assert_allclose(dec.log_z, dec.log_z_exact, atol=FLOAT64_ABS)
    assert dec.tv().max() < 1e-9
    # ... and it is the model's own layer-0 pattern
    np.testing.assert_allclose(dec.attention[:, :, : N_CTX], hf_layer0(model, ids)[:, 1:], atol=2e-5)


def test_fixed_destination_token_sits_at_key_n(additive):
    _, w, sigma = additive
    ids = RNG.integers(0, V, N_CTX)
    dest = int((ids[10] + 1) % V)
    dec = cx.decompose(w, sigma, ids[:10], [10], dest)
    keys = np.concatenate([ids[:10], [dest]])
    np.testing.assert_allclose(dec.c[0, 0, :11], np.exp(C_PLANTED[keys]), rtol=1e-5)
    np.testing.assert_allclose(dec.c[1, 0, :11], np.exp(-C_PLANTED[keys] + 3.0 * (keys == dest)), rtol=1e-5)


@pytest.mark.float32
def test_exact_pattern_equals_the_model_and_linear_ln_is_close(tmp_path):
    """A random GPT-2 (LN scale varies): the exact pattern is the model's, the linear one
    is not identical but close, and the TV says how close."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=50, n_positions=32, n_embd=32, n_layer=1, n_head=4, bos_token_id=0, eos_token_id=0)
    cfg._attn_implementation = "eager"
    model = GPT2LMHeadModel(cfg).eval()
    w = cx.weights_from_hf(model)
    ids = np.random.default_rng(1).integers(0, 50, 32)
    s = float(np.median(w.ln_scale(ids, np.arange(32))))
    dec = cx.decompose(w, s, ids, np.arange(32), None)
    np.testing.assert_allclose(dec.attention, hf_layer0(model, ids), atol=FLOAT32_FORWARD_ABS)
    gap = dec.tv()
    assert 1e-6 < gap.mean() < 0.05
    np.testing.assert_allclose(gap, 0.5 * np.abs(dec.linear - dec.attention).sum(-1))


def test_artifact_round_trip_and_denominators(tmp_path, additive):
    _, w, sigma = additive
    texts = [RNG.integers(0, V, N_CTX) for _ in range(3)]
    dec, s = built(tmp_path, w, texts)
    assert s["ln_scale_used"] == pytest.approx(sigma, rel=FLOAT64_REL)
    assert dec.attrs["kind"] == cx.KIND and dec.attrs["destination_id"] == 5
    assert list(dec.positions) == list(range(1, N_CTX - 1))
    # the stored factors give the positional pattern of the fixed token, and the stored
    # denominators equal a direct decomposition of each text
    for n in (3, 20, N_CTX - 2):
        p = np.exp(P_ADDITIVE[n, : n + 1] - P_ADDITIVE[n, : n + 1].max())
        np.testing.assert_allclose(dec.pattern(n)[0], p / p.sum(), rtol=1e-5)  # float32 weights, as above
        direct = cx.decompose(w, sigma, texts[1], [n], 5)
        np.testing.assert_allclose(dec.log_z_linear[1, :, n - 1], direct.log_z[:, 0], atol=FLOAT64_ABS)
        keys = np.concatenate([texts[1][:n], [5]])
        np.testing.assert_allclose(np.exp(dec.log_z_linear[1, 0, n - 1]), (p / p.sum() * np.exp(C_PLANTED[keys])).sum(),
                                   rtol=1e-5)
    np.testing.assert_allclose(dec.log_z_linear, dec.log_z_exact, atol=FLOAT64_ABS)
    # stored as float32
    np.testing.assert_allclose(dec.content_key([2, 2, 7]), w.content_keys(sigma, [2, 2, 7]), rtol=FLOAT32_STORAGE_REL)
    assert dec.ln_scale["quantiles"][0] == pytest.approx(sigma) and dec.ln_scale["n_tokens"] == 3 * (N_CTX - 1)


# --------------------------------------------------------------------------- K6, K7
def test_planted_heads_get_their_classes(tmp_path, planted):
    _, w, sigma = planted
    texts = [RNG.integers(0, V, N_CTX) for _ in range(3)]
    dec, _ = built(tmp_path, w, texts, 3)
    mass, excess, count = cx.duplicate_scores(w, sigma, list(dec.token_ids), N_CTX - 2)
    assert count > 50
    # the planted duplicate-token head shares its attention between the earlier copies and
    # itself (the destination matches its own token too)
    assert excess[0] > 0.4 and mass[0] > 0.45
    np.testing.assert_allclose(excess[[1, 3]], 0.0, atol=FLOAT64_ABS)  # no content score: nothing added
    assert abs(excess[2]) < 0.05  # a content score that does not single out copies
    thr = {"duplicate_min_excess": 0.25, "local_min_mass": 0.5, "uniform_min_fraction": 0.5}
    df = cx.head_classes(dec, mass, excess, count, N_CTX - 2, 1, 3, thr, "planted")
    assert list(df["head_class"]) == ["duplicate_token", "detokenization", "contextual", "other"]
    n_keys = N_CTX - 2
    lam = 0.1
    assert df["etc"][2] == pytest.approx(kn.truncated_geometric_etc(lam, n_keys), rel=1e-5)
    assert df["etc"][3] == pytest.approx(n_keys, rel=FLOAT64_REL) and df["local_mass"][1] > 0.99


def test_positional_patterns_grids_and_distances(planted):
    _, w, sigma = planted
    ids = RNG.integers(0, V, N_CTX)
    grids, df = cx.positional_patterns(w, sigma, ids, [20, 40], 3, 25, 1)
    assert grids[20]["fixed"].shape == (H, 25) and np.isnan(grids[20]["fixed"][0, :4]).all()
    # uniform head: every positional pattern is 1/(n+1); the planted-content head's real row
    # differs from its positional pattern by exactly the content factor
    np.testing.assert_allclose(grids[40]["fixed"][3], 1 / 41, atol=FLOAT64_ABS)
    row = df[(df["head"] == 3) & (df["n"] == 40)].iloc[0]
    assert row["etc_fixed"] == pytest.approx(40) and row["tv_fixed_vs_real"] == pytest.approx(0, abs=FLOAT64_ABS)
    ctx = df[(df["head"] == 2) & (df["n"] == 40)].iloc[0]
    assert ctx["tv_fixed_vs_own"] == pytest.approx(0, abs=FLOAT64_ABS)  # content never reaches the query here
    assert ctx["tv_fixed_vs_real"] > 0.05
    assert cx.window_grid(np.arange(5.0), 4, 3).tolist() == [2.0, 3.0, 4.0]


# --------------------------------------------------------------------------- K8, K9
def test_denominator_spread_and_most_varying():
    rng = np.random.default_rng(3)
    log_z = rng.normal(0, 1e-3, (4, 3, 50))
    log_z[:, 1] += np.array([0.0, 1.0, -1.0, 0.5])[:, None]  # head 1 differs by text
    log_z[:, 2] += 0.2 * np.array([0.0, 1.0, -1.0, 0.5])[:, None]
    spread = cx.denominator_spread(log_z, np.arange(1, 51), 10)
    assert np.argmax(spread) == 1
    assert cx.most_varying(spread, ["contextual", "other", "contextual"], 2) == ["L0H2", "L0H0"]
    with pytest.raises(PosmechError, match="denominator_from"):
        cx.denominator_spread(log_z, np.arange(1, 51), 100)


def test_iid_content_factors_match_the_independent_model():
    """Content factors drawn i.i.d. from a known distribution: the observed variance of Z
    matches Σ p² · Var(c) within its sampling error, for local and broad patterns."""
    values = np.array([[0.5, 1.0, 3.0], [0.2, 1.0, 1.5]])
    weights = np.array([0.5, 0.3, 0.2])
    m = 200
    broad = np.exp(-0.02 * np.arange(m))[::-1]
    local = np.exp(-1.5 * np.arange(m))[::-1]
    p = np.stack([broad / broad.sum(), local / local.sum()])
    r = cx.resampled_variance(p, values, weights * 10, 4000, np.random.default_rng(0), fixed=np.array([0.1, 0.2]))
    mean = values @ weights
    var_c = (values - mean[:, None]) ** 2 @ weights
    np.testing.assert_allclose(r["var_c"], var_c, rtol=FLOAT64_REL)
    np.testing.assert_allclose(r["predicted"], np.square(p).sum(-1) * var_c, rtol=FLOAT64_REL)
    assert np.all(np.abs(r["observed"] - r["predicted"]) < 4 * r["observed_se"])
    np.testing.assert_allclose(r["mean_z"], mean + [0.1, 0.2], rtol=0.02)
    assert r["sum_p2"][1] > 20 * r["sum_p2"][0]  # a local pattern: "confetti"
    corr, slope = cx.loglog_fit(np.array([1e-3, 1e-2, 1e-1]), np.array([2e-3, 2e-2, 2e-1]))
    assert corr == pytest.approx(1.0) and slope == pytest.approx(1.0)


def test_variance_model_on_a_text(tmp_path, additive):
    _, w, sigma = additive
    texts = [RNG.integers(0, V, N_CTX) for _ in range(2)]
    dec, _ = built(tmp_path, w, texts)
    r = cx.variance_model(dec, dec.token_ids[0], 40, 3000, 0)
    p = dec.pattern(40)[0, 1:40]
    toks, counts = np.unique(texts[0][1:40], return_counts=True)
    c = np.exp(C_PLANTED[toks])
    var_c = ((c - (c * counts).sum() / counts.sum()) ** 2 * counts).sum() / counts.sum()
    assert r["predicted"][0] == pytest.approx((p**2).sum() * var_c, rel=1e-4)
    assert abs(r["observed"][0] - r["predicted"][0]) < 4 * r["observed_se"][0]


# --------------------------------------------------------------------------- K10
@pytest.mark.float32
def test_positional_layer1_head_is_mostly_positional(prev_token_model_dir):
    """The shared positional model (token embeddings zero): layer 1's real rows are its
    positional kernels, so every head is mostly positional with TV 0."""
    import json

    bridge = load_bridge({"hf_dir": str(prev_token_model_dir), "name": "t"}, device="cpu")
    ids = np.full(12, 5)
    n = 10
    rows, x = cx.layer_rows(bridge, ids, n, 1)
    means = kn.query_embeddings(bridge, [ids], np.arange(12))[0]  # [L, 12, d]: position-only, = every mean
    w = kn.bridge_head_weights(bridge, json.loads((prev_token_model_dir / "config.json").read_text()))
    kernel = kn.layer_kernels(means[1], x[None, None], [n], w, 1, 0).mean[:, 0]
    df = cx.layer1_table(rows, kernel, n, 0, 0.05, "t")
    np.testing.assert_allclose(df["tv_row_vs_kernel"], 0.0, atol=1e-5)
    assert df["mostly_positional"].all()
    # L1H0's kernel is the planted exponential -0.5·(n - i)
    e = np.exp(-0.5 * (n - np.arange(n + 1)))
    np.testing.assert_allclose(rows[0], e / e.sum(), atol=1e-5)
    shuffled = cx.layer1_table(rows[:, ::-1][:, -(n + 1):], kernel, n, 0, 0.05, "t")
    assert not shuffled["mostly_positional"][0]


# --------------------------------------------------------------------------- bad input
def test_positions_beyond_the_context_name_the_key():
    from posmech.settings import defaults, positions_for

    settings = defaults("contextual", positions=[20, 40], variance_positions=[10, 30], k0=1, local_window=3)
    ok = positions_for(settings, N_CTX, "m")
    assert ok.max_position == N_CTX - 2 and ok.classify_position == 40
    with pytest.raises(PosmechError,
                       match=r"`contextual.positions` \(model m\): position\(s\) \[399\] are outside 1..47"):
        positions_for(settings.replace(positions=[20, 399]), N_CTX, "m")
    with pytest.raises(PosmechError, match="contextual.max_position"):
        positions_for(settings.replace(max_position=48), N_CTX, "m")
    with pytest.raises(PosmechError, match="contextual.variance_positions.*beyond"):
        positions_for(settings.replace(max_position=25, positions=[20], variance_positions=[10, 30]), N_CTX, "m")


def test_split_destination_token_names_the_key():
    from posmech.models.training import build_char_tokenizer

    tok = build_char_tokenizer(["In the beginning"])
    assert cx.single_token(tok, " ", "contextual.destination_token") == tok(" ", add_special_tokens=False).input_ids[0]
    with pytest.raises(PosmechError, match=r"`contextual.destination_token`: ' the' is 4 tokens"):
        cx.single_token(tok, " the", "contextual.destination_token")
    with pytest.raises(PosmechError, match=r"`contextual.destination_token`: 'z' does not decode back .*<\|unk\|>"):
        cx.single_token(tok, "z", "contextual.destination_token")  # an unknown character is <|unk|>
    with pytest.raises(PosmechError, match=r"does not decode back"):
        cx.single_token(hb.char_tokenizer(60), " the", "contextual.destination_token")


def test_texts_shorter_than_the_largest_position_name_the_key():
    toks = tokenset([np.arange(10), np.arange(30), np.arange(50)])
    got = cx.choose_texts({"c": toks}, 2, 30, 0, "contextual.max_position")
    assert sorted(len(t["ids"]) for t in got) == [30, 30]
    with pytest.raises(PosmechError, match=r"`contextual.max_position`: corpus 'c' has 1 document"):
        cx.choose_texts({"c": toks}, 2, 31, 0, "contextual.max_position")


def test_duplicate_score_over_nothing_is_an_error(planted):
    _, w, sigma = planted
    with pytest.raises(PosmechError, match="average over nothing"):
        cx.duplicate_scores(w, sigma, [np.arange(V)], V - 1)


@pytest.mark.parametrize("cfg", [{"model_type": "gpt_neox"}, {"model_type": "llama"},
                                 {"d_model": 8, "n_layers": 2, "shortformer_pos": True}])
def test_rotary_and_shortformer_models_are_refused_by_name(cfg):
    with pytest.raises(PosmechError, match=r"remove .*'m'.*`contextual.models`|remove it from `contextual.models`"):
        cx.refuse_unsupported(cfg, "m")


@pytest.mark.float32
def test_legacy_transformerlens_checkpoint_matches_its_bridge(tmp_path):
    """A legacy TransformerLens attention-only checkpoint (the format of attn-only-2l and
    of the demo's attention-only model): the weights read from its state dict give the
    layer-0 pattern TransformerLens computes."""
    import json

    from safetensors.numpy import save_file

    from posmech.models.training import build_char_tokenizer

    rng = np.random.default_rng(5)
    d, h, dh, n_ctx = 16, 2, 8, 12
    tok = build_char_tokenizer(["abcdefghij klmnop"])
    vocab = len(tok)
    r = lambda *shape: rng.normal(0, 0.5, shape).astype(np.float32)  # noqa: E731
    state = {"embed.W_E": r(vocab, d), "pos_embed.W_pos": r(n_ctx, d), "ln_final.w": 1 + r(d), "ln_final.b": r(d),
             "unembed.W_U": r(d, vocab), "unembed.b_U": r(vocab)}
    for layer in range(2):
        p = f"blocks.{layer}."
        state.update({p + "ln1.w": 1 + r(d), p + "ln1.b": r(d), p + "attn.W_Q": r(h, d, dh),
                      p + "attn.W_K": r(h, d, dh),
                      p + "attn.W_V": r(h, d, dh), p + "attn.W_O": r(h, dh, d), p + "attn.b_Q": r(h, dh),
                      p + "attn.b_K": r(h, dh), p + "attn.b_V": r(h, dh), p + "attn.b_O": r(d)})
    save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({
        "d_model": d, "n_layers": 2, "d_mlp": -1, "d_head": dh, "n_heads": h, "n_ctx": n_ctx, "d_vocab": vocab,
        "act_fn": "solu_ln", "attn_only": True, "normalization_type": "LN", "positional_embedding_type": "standard",
        "shortformer_pos": False, "tokenizer_name": None}))
    tok.save_pretrained(tmp_path)
    w, t = cx.load_weights({"hf_dir": str(tmp_path), "name": "legacy"}, "legacy")
    assert len(t) == vocab
    ids = rng.integers(1, vocab, n_ctx)
    ids[0] = 0
    bridge = load_bridge({"hf_dir": str(tmp_path), "name": "legacy"}, device="cpu")
    store = {}
    with torch.inference_mode():
        bridge.run_with_hooks(torch.as_tensor(ids)[None], return_type=None, fwd_hooks=[
            ("blocks.0.attn.hook_pattern", lambda a, hook: store.__setitem__("p", a[0].double().numpy()))])
    dec = cx.decompose(w, float(np.median(w.ln_scale(ids, np.arange(n_ctx)))), ids, np.arange(n_ctx), None)
    np.testing.assert_allclose(dec.attention, store["p"], atol=1e-5)


def test_blocked_denominators_equal_one_decomposition(additive):
    """Blocks of positions sharing one text's keys (with a destination token the text may
    not contain) give what one decomposition of every position gives."""
    _, w, sigma = additive
    ids = RNG.integers(0, V - 2, N_CTX)  # the destination V-1 never occurs: its keys must still be there
    ids[-1] = V - 2  # ... and the last token occurs only where the destination replaces it
    pos = np.arange(1, N_CTX)
    lz, lze, tvs = cx.denominators(w, sigma, ids, pos, V - 1, block=7)
    whole = cx.decompose(w, sigma, ids, pos, V - 1)
    np.testing.assert_allclose(lz, whole.log_z, atol=FLOAT64_ABS)
    np.testing.assert_allclose(lze, whole.log_z_exact, atol=FLOAT64_ABS)
    np.testing.assert_allclose(tvs, whole.tv(), atol=FLOAT64_ABS)


def test_within_text_variance_follows_the_independent_model(tmp_path, additive):
    """Along one text of i.i.d. tokens the denominator of a head with a constant positional
    pattern (P = −0.15·(n − i) + noise) and planted content factors varies over n as the
    independent model predicts; ``exp C`` drawn uniformly, so Var(c) is known."""
    _, w, sigma = additive
    rng = np.random.default_rng(11)
    texts = [rng.integers(0, V, N_CTX) for _ in range(2)]
    dec, _ = built(tmp_path, w, texts)
    r = cx.within_text_variance(dec, 0, 20)
    assert r["n_positions"][0] == N_CTX - 2 - 20 + 1
    ratio = r["observed"][0] / r["predicted"][0]
    assert 0.3 < ratio < 3.0  # 27 correlated draws: the variance is known to a factor ~2
    with pytest.raises(PosmechError, match="denominator_from"):
        cx.within_text_variance(dec, 0, N_CTX)


def test_k_scorecard_rows_read_the_analysis():
    """K6–K10 rows come from the library (scripts only write them), with known values."""
    summary = {"quantiles": {0.01: 1.0, 0.05: 2.00004, 0.5: 3.0, 0.95: 4.0, 0.99: 5.0}, "ln_scale_used": 3.0,
               "tv_median": 0.0123456789}
    k6, k8 = cx.decomposition_scorecard(summary, 100, "web", " the", "m", "f.png", "l.h5")
    assert (k6["claim"], k6["quantity"], k6["value"], k6["model"]) == ("K6", "ln1_scale_range", [2.0, 4.0], "m")
    assert "over 100 web tokens" in k6["detail"] and "s = 3.0000" in k6["detail"]
    assert (k8["claim"], k8["value"], k8["artifact"]) == ("K8", 0.012346, "l.h5") and "' the'" in k8["detail"]
    classes = pd.DataFrame({"head_name": ["L0H0", "L0H1", "L0H2"], "head_class": ["contextual", "other", "contextual"]})
    k7 = {r["quantity"]: r["value"] for r in cx.head_class_scorecard(classes, {"t": 1}, 3, 50, 7, "m", "c.csv")}
    assert k7 == {"detokenization_heads": [], "contextual_heads": ["L0H0", "L0H2"], "duplicate_token_heads": [],
                  "other_heads": ["L0H1"]}
    pat = pd.DataFrame({"head_name": ["L0H0", "L0H1", "L0H0"], "n": [20, 20, 10], "tv_fixed_vs_real": [0.1, 0.2, 0.9],
                        "tv_fixed_vs_own": [0.3, 0.4, 0.9]})
    grids, real, own = cx.positional_pattern_scorecard(pat, [20, 10], "T", " the", "m", "f.png", "p.csv")
    assert grids["detail"] == "n = [10, 20] on T" and real["value"] == {"L0H0": 0.1, "L0H1": 0.2}
    assert own["value"] == {"L0H0": 0.3, "L0H1": 0.4} and "n = 20" in own["detail"]
    spread = {"linear": np.array([0.5, 0.1, 0.9]), "exact": np.array([0.6, 0.1, 0.2])}
    top, top_exact, broad = cx.denominator_scorecard(spread, ["contextual", "other", "contextual"], 1, 4, 8, "m",
                                                     "f.png", "d.csv")
    assert top["value"] == ["L0H2"] and top_exact["value"] == ["L0H0"]
    assert "all heads: L0H2 0.900, L0H0 0.500, L0H1 0.100" in top["detail"] and broad["value"] == 0.9
    x = np.array([1.0, 2.0, 4.0, 8.0])
    var = pd.DataFrame({"method": ["resampled"] * 4 + ["within_text"] * 4, "predicted": np.r_[x, x],
                        "observed": np.r_[x ** 2, 0 * x]})
    fit, within, slope = cx.variance_scorecard(var, 8, "m", "f.png", "v.csv")
    assert fit["value"] == 1.0 and slope["value"] == 2.0  # observed = predicted²: log-log slope 2
    assert within["value"] is None and "nothing to fit" in within["detail"]
    l1 = pd.DataFrame({"head_name": ["L1H0", "L1H1", "L1H2", "L1H3"], "mostly_positional": [True, False, False, True]})
    _, heads, frac = cx.layer1_scorecard(l1, "T", 30, 0.2, "m", "f.png", "l1.csv")
    assert heads["value"] == ["L1H0", "L1H3"] and frac["value"] == 0.5 and "(2 of 4)" in heads["detail"]


def test_k8_table_summarises_each_text_and_head_over_n_from():
    """Two texts, two heads, positions 0..3, from n = 2: the means and stds are over n = 2, 3."""
    from types import SimpleNamespace

    log_z = np.arange(16, dtype=float).reshape(2, 2, 4)  # [text, head, n]
    dec = SimpleNamespace(texts=pd.DataFrame({"title": ["t0", "t1"], "corpus": ["c", "d"]}),
                          positions=np.arange(4), log_z_linear=log_z, log_z_exact=2 * log_z,
                          tv_linear_exact=np.full((2, 2, 4), 0.25))
    spread = {"linear": np.array([1.0, 2.0]), "exact": np.array([3.0, 4.0])}
    df = cx.denominator_table(dec, ["local", "contextual"], spread, 2, "m")
    assert df[["text", "head_name", "head_class"]].values.tolist() == [
        ["t0", "L0H0", "local"], ["t0", "L0H1", "contextual"], ["t1", "L0H0", "local"], ["t1", "L0H1", "contextual"]]
    assert df["mean_log_z_linear"].tolist() == [2.5, 6.5, 10.5, 14.5]
    assert df["mean_log_z_exact"].tolist() == [5.0, 13.0, 21.0, 29.0]
    assert df["std_log_z_linear_over_n"].tolist() == [0.5] * 4
    assert df["spread_exact"].tolist() == [3.0, 4.0, 3.0, 4.0] and (df["tv_linear_exact_mean"] == 0.25).all()
    assert (df["claim"] == "K8").all() and df["corpus"].tolist() == ["c", "c", "d", "d"]


def test_k6_table_names_heads_and_decodes_tokens():
    class Tok:
        def decode(self, ids):
            return "".join(chr(ord("a") + i) for i in ids)

    df = pd.DataFrame({"head": [0, 1], "n": [5, 5], "own_token_id": [2, 3]})
    cx.positional_pattern_table(df, "m", Tok())
    assert list(df.columns) == ["claim", "model", "layer", "head", "head_name", "n", "own_token_id", "own_token"]
    assert df["head_name"].tolist() == ["L0H0", "L0H1"] and df["own_token"].tolist() == ["c", "d"]
    assert (df["claim"] == "K6").all() and (df["layer"] == 0).all()


def test_settings_resolve_the_corpora_pattern_first():
    """`contextual.corpora` (empty: all) in the config's order with the pattern corpus
    first, the LN-scale corpus (null: the first corpus) read too; resolving twice changes
    nothing (layer0.h5 records the resolved section)."""
    from posmech.settings import defaults
    from posmech.analyses.contextual import check_contexts

    config = {"corpora": {"a": {}, "b": {}, "c": {}}}
    s = defaults("contextual", config)
    assert (s.corpora, s.pattern_corpus, s.scale_corpus, s.token_corpora) == (("a", "b", "c"), "a", "a", ("a", "b", "c"))
    s = defaults("contextual", config, corpora=["c", "b"], scale_corpus="a")
    assert (s.corpora, s.pattern_corpus, s.token_corpora) == (("b", "c"), "b", ("b", "c", "a"))
    s = defaults("contextual", config, corpora=["c", "b"], pattern_corpus="c")
    assert s.corpora == ("c", "b") and s.resolved(config) == s
    assert s.as_dict()["corpora"] == ["c", "b"]
    s = s.replace(positions=[20, 40], variance_positions=[10, 30])
    check_contexts(s, ["m"], lambda m: N_CTX)
    with pytest.raises(PosmechError, match=r"`contextual.positions` \(model small\)"):
        check_contexts(s, ["m", "small"], {"m": N_CTX, "small": 32}.get)
