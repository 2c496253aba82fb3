"""Positional kernels and ETC (K1–K5) on hand-built models with known answers."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from posmech.analyses import kernels as kn
from posmech.core.errors import PosmechError
from posmech.models import handbuilt as hb
from posmech.models.loading import load_bridge

from tests.tolerances import FLOAT32_FORWARD_ABS, FLOAT32_FORWARD_REL, FLOAT32_STORAGE_REL, FLOAT64_ABS, FLOAT64_REL

N = 12  # n_ctx of the hand-built models


def bridge_for(path, processing="compatibility"):
    return load_bridge({"hf_dir": str(path), "name": "t"}, device="cpu", processing=processing)


def hf_config(path):
    return json.loads((path / "config.json").read_text())


def pattern(bridge, tokens, layer):
    """The model's own attention pattern ``[H, n, n]`` from a forward pass."""
    store = {}

    def grab(t, hook):
        store["p"] = t[0].double().numpy()

    with torch.inference_mode():
        bridge.run_with_hooks(torch.as_tensor(tokens)[None], fwd_hooks=[(f"blocks.{layer}.attn.hook_pattern", grab)])
    return store["p"]


def same_text_kernels(bridge, path, tokens, k0):
    """Kernels whose means ``p_i`` are the text's own ln1 embeddings, queries at every n >= k0."""
    all_pos = np.arange(len(tokens))
    x_all = kn.query_embeddings(bridge, [tokens], all_pos)[0]  # [L, n, d]
    w = kn.bridge_head_weights(bridge, hf_config(path))
    pos = np.arange(k0, len(tokens))
    x = kn.query_embeddings(bridge, [tokens], pos)  # [1, L, Q, d]
    return list(kn.model_kernels(x_all, x, pos, w, k0)), pos


@pytest.fixture(scope="module")
def prevtok(prev_token_model_dir):
    """The shared positional model (L0H1 previous-token, L1H0 kernel -0.5·(n-i), others
    zero-query) with position-only means and queries."""
    bridge = bridge_for(prev_token_model_dir)
    tokens = np.full(N, 5)
    layers, pos = same_text_kernels(bridge, prev_token_model_dir, tokens, k0=2)
    return bridge, layers, pos


def test_zero_query_head_is_uniform_with_etc_window(prevtok):
    _, layers, pos = prevtok
    lk = layers[0]  # L0H0 has zero query weights
    for q, n in enumerate(pos):
        np.testing.assert_allclose(lk.mean[0, q, 2 : n + 1], 1.0 / (n - 1), atol=FLOAT64_ABS)
        assert lk.mean[0, q, :2].sum() == 0 and lk.mean[0, q, n + 1 :].sum() == 0
    np.testing.assert_allclose(lk.etc[0, 0], pos - 2 + 1, rtol=FLOAT64_REL)
    assert list(lk.n_keys) == list(pos - 1)


@pytest.mark.float32
def test_exact_previous_token_head_has_etc_one(prevtok):
    _, layers, pos = prevtok
    etc = layers[0].etc[0, 1]
    np.testing.assert_allclose(etc, 1.0, atol=FLOAT32_FORWARD_ABS)
    assert np.argmax(layers[0].mean[1, 3]) == pos[3] - 1


@pytest.mark.float32
def test_exponential_head_has_truncated_geometric_etc(prevtok):
    _, layers, pos = prevtok
    expected = [kn.truncated_geometric_etc(0.5, n - 2 + 1) for n in pos]
    np.testing.assert_allclose(layers[1].etc[0, 0], expected, rtol=FLOAT32_FORWARD_REL)
    # the analytic formula itself, against a direct sum
    p = np.exp(-0.5 * np.arange(7))
    assert kn.truncated_geometric_etc(0.5, 7) == pytest.approx(1 / np.square(p / p.sum()).sum(), rel=FLOAT64_REL)


@pytest.mark.float32
def test_position_only_kernel_equals_models_attention_pattern():
    rng = np.random.default_rng(0)
    scores = {(0, 0): rng.normal(0, 2, (N, N)), (1, 1): np.tril(rng.normal(0, 3, (N, N)))}
    spec = hb.positional_spec(n_ctx=N, n_layer=2, n_head=2, d_head=N + 1, scores=scores)
    # give the model an arbitrary query bias as well: it counts in the kernel and in the pattern
    spec.heads[(1, 1)]["b_Q"] = rng.normal(0, 1, N + 1)
    import tempfile
    from pathlib import Path

    path = hb.save_model_dir(spec, Path(tempfile.mkdtemp()) / "pos")
    bridge = bridge_for(path)
    tokens = np.full(N, 7)
    for k0 in (0, 2):
        layers, pos = same_text_kernels(bridge, path, tokens, k0)
        for layer in (0, 1):
            pat = pattern(bridge, tokens, layer)  # [H, n, n]
            for h in range(2):
                ref = pat[h, pos, :]
                ref[:, :k0] = 0
                ref /= ref.sum(axis=1, keepdims=True)
                np.testing.assert_allclose(layers[layer].mean[h], ref, atol=2e-5)


def test_key_bias_leaves_kernels_unchanged(tmp_path):
    rng = np.random.default_rng(1)
    S = -0.3 * np.subtract.outer(np.arange(N), np.arange(N)).astype(float)
    spec = hb.positional_spec(n_ctx=N, n_layer=1, n_head=2, scores={(0, 0): S, (0, 1): hb.previous_token_scores(N, 3.0)})
    plain = bridge_for(hb.save_model_dir(spec, tmp_path / "plain"))
    for h in (0, 1):
        spec.heads[(0, h)]["b_K"] = rng.normal(0, 5, spec.dh)
    biased_dir = hb.save_model_dir(spec, tmp_path / "biased")
    biased = bridge_for(biased_dir)
    w_plain = kn.bridge_head_weights(plain, hf_config(biased_dir))
    w_biased = kn.bridge_head_weights(biased, hf_config(biased_dir))
    assert np.abs(w_biased.b_K).max() > 1.0  # the bias really is there
    tokens = np.full(N, 3)
    pos = np.arange(2, N)
    means = kn.query_embeddings(plain, [tokens], np.arange(N))[0]
    x = kn.query_embeddings(plain, [tokens], pos)
    a = next(kn.model_kernels(means, x, pos, w_plain, 2))
    b = next(kn.model_kernels(means, x, pos, w_biased, 2))
    np.testing.assert_allclose(a.mean, b.mean, atol=FLOAT64_ABS)  # the same float32 inputs, float64 kernels


@pytest.mark.float32
def test_kernels_match_attention_of_a_trained_like_model_in_both_processing_modes(tmp_path):
    """Random GPT-2 (LN weights, biases, MLPs all nonzero): with p_i = x_i of the same
    text and k0 = 0 the kernel is exactly the model's pattern, so the processed weights,
    the scale and the cached hook agree in compatibility and raw mode."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=40, n_positions=N, n_embd=16, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "ln" in name or "bias" in name:
                p.add_(torch.randn_like(p) * 0.5)
    model.save_pretrained(tmp_path, safe_serialization=True)
    hb.char_tokenizer(40).save_pretrained(tmp_path)
    tokens = np.random.default_rng(0).integers(1, 40, N)
    for processing in ("compatibility", "raw"):
        bridge = bridge_for(tmp_path, processing)
        layers, pos = same_text_kernels(bridge, tmp_path, tokens, 0)
        for layer in (0, 1):
            np.testing.assert_allclose(layers[layer].mean, pattern(bridge, tokens, layer)[:, pos], atol=2e-5)


@pytest.mark.float32
def test_gpt_neo_layout_unscaled_and_local_window(tmp_path):
    from transformers import GPTNeoConfig, GPTNeoForCausalLM

    torch.manual_seed(0)
    cfg = GPTNeoConfig(vocab_size=40, max_position_embeddings=N, hidden_size=16, num_layers=2, num_heads=2,
                       attention_types=[[["global", "local"], 1]], window_size=4, bos_token_id=0, eos_token_id=0)
    GPTNeoForCausalLM(cfg).save_pretrained(tmp_path, safe_serialization=True)
    hb.char_tokenizer(40).save_pretrained(tmp_path)
    scale, window = kn.attention_layout(hf_config(tmp_path), 2, 8)
    assert list(scale) == [1.0, 1.0] and list(window) == [0, 4]
    bridge = bridge_for(tmp_path)
    tokens = np.random.default_rng(0).integers(1, 40, N)
    layers, pos = same_text_kernels(bridge, tmp_path, tokens, 0)
    for layer in (0, 1):
        np.testing.assert_allclose(layers[layer].mean, pattern(bridge, tokens, layer)[:, pos], atol=2e-5)
    assert list(layers[1].n_keys) == [min(n + 1, 4) for n in pos]


def test_rotary_and_alibi_layouts_and_their_windows():
    """Rotary/ALiBi models get sqrt(d_head) (Gemma sqrt(query_pre_attn_scalar)) and the windows
    their config gives: Mistral's sliding_window on every layer, `layer_types`' sliding layers
    (Gemma 2, Qwen2 with use_sliding_window), none when use_sliding_window is false. What the
    score function does not compute (GPT-J's interleaved pairs, soft-capped scores) is decided
    before any job (posmech.pipeline.applicability), not here."""
    for mtype in ("gpt_neox", "llama", "qwen2", "bloom", "phi", "falcon", "gptj"):
        scale, window = kn.attention_layout({"model_type": mtype}, 2, 16)
        assert list(scale) == [4.0, 4.0] and list(window) == [0, 0]
    assert list(kn.attention_layout({"model_type": "mistral", "sliding_window": 7}, 2, 16)[1]) == [7, 7]
    gemma = {"model_type": "gemma2", "query_pre_attn_scalar": 64, "sliding_window": 5,
             "layer_types": ["sliding_attention", "full_attention"]}
    scale, window = kn.attention_layout(gemma, 2, 16)
    assert list(scale) == [8.0, 8.0] and list(window) == [5, 0]
    assert list(kn.attention_layout({"model_type": "qwen2", "sliding_window": 9, "use_sliding_window": False},
                                    2, 16)[1]) == [0, 0]
    with pytest.raises(PosmechError, match="give 3 layers, the model has 2"):
        kn.attention_layout({"model_type": "gemma2", "layer_types": ["full_attention"] * 3}, 2, 16)


def test_spread_across_texts_and_key_positions():
    """Pure-array checks: several texts give a mean and a spread; identical texts none."""
    rng = np.random.default_rng(2)
    d, dh = 6, 3
    means = rng.normal(size=(10, d))
    W = kn.HeadWeights(rng.normal(size=(1, 1, d, dh)), np.zeros((1, 1, dh)), rng.normal(size=(1, 1, d, dh)),
                       np.zeros((1, 1, dh)), np.array([1.0]), np.array([0]))
    pos = np.array([4, 9])
    x_same = np.repeat(rng.normal(size=(1, 2, d)), 3, axis=0)
    lk = kn.layer_kernels(means, x_same, pos, W, 0, k0=2)
    assert lk.std.max() < 1e-12 and lk.tv.max() < 1e-12
    lk = kn.layer_kernels(means, rng.normal(size=(3, 2, d)), pos, W, 0, k0=2)
    assert lk.tv.max() > 0.01 and lk.std.max() > 0
    np.testing.assert_allclose(lk.mean.sum(-1), 1.0)
    assert np.all(lk.etc_of_mean >= lk.etc.min(axis=0) - 1e-9)  # mixing spreads a distribution
    with pytest.raises(PosmechError, match="k0"):
        kn.head_kernels(means, x_same, [1, 4], W.W_Q[0, 0], W.b_Q[0, 0], W.W_K[0, 0], W.b_K[0, 0], 1.0, k0=2)


def test_a_head_without_a_finite_etc_has_no_kernel_type():
    """A NaN ETC (a head whose query is not a number: no kernel, K1) is ``undefined``, not
    ``slow_decay`` (it fell between the two thresholds): K3 counts only the real types."""
    assert kn.classify(np.array([np.nan, np.inf, 0.001, 0.3]), 0.02, 0.5).tolist() == [
        "undefined", "undefined", "local", "slow_decay"]
    assert "undefined" not in kn.KERNEL_TYPES


def test_classify_and_translation_equivariance():
    types = kn.classify(np.array([0.001, 0.019, 0.02, 0.3, 0.5, 1.0]), 0.02, 0.5)
    assert list(types) == ["local", "local", "slow_decay", "slow_decay", "uniform", "uniform"]
    pos = np.arange(2, 30)
    K = 30
    shifted = np.zeros((len(pos), K))
    for q, n in enumerate(pos):  # depends only on n - i: equivariant
        i = np.arange(2, n + 1)
        shifted[q, i] = np.exp(-(n - i))
        shifted[q] /= shifted[q].sum()
    assert kn.translation_tv(shifted, pos, 2, 5) < 1e-12
    fixed = np.zeros((len(pos), K))
    for q, n in enumerate(pos):  # peaked at the absolute key 15: not equivariant
        i = np.arange(2, n + 1)
        fixed[q, i] = np.exp(-np.abs(i - 15.0))
        fixed[q] /= fixed[q].sum()
    assert kn.translation_tv(fixed, pos, 2, 5) > 0.1


def test_select_documents_is_seeded_and_checks_length():
    lengths = np.array([5, 50, 60, 70, 3, 80])
    a = kn.select_documents(lengths, 50, 3, seed=0)
    assert list(a) == list(kn.select_documents(lengths, 50, 3, seed=0))
    assert set(a) <= {1, 2, 3, 5}
    with pytest.raises(PosmechError, match="kernels.n_chapters"):
        kn.select_documents(lengths, 50, 5, seed=0)


def test_artifact_roundtrip_and_tables(prevtok, tmp_path):
    _, layers, pos = prevtok
    path = tmp_path / "kernels.h5"
    chapters = {"doc_index": [0], "title": ["t"], "length": [N]}
    kn.write_kernels(path, iter(layers), 2, 2, pos, chapters, np.ones(N, dtype=np.int64), {"model": "prevtok", "k0": 2})
    ks = kn.read_kernels(path)
    np.testing.assert_allclose(ks.kernel(1, 0), layers[1].mean[0], atol=FLOAT32_STORAGE_REL)  # stored as float32
    df = kn.etc_frame(ks, "prevtok", 0.2, 0.9)
    assert len(df) == 2 * 2 * len(pos)
    last = df[df["n"] == pos[-1]].set_index("head_name")
    assert last.loc["L0H1", "kernel_type"] == "local"
    assert last.loc["L0H0", "kernel_type"] == "uniform"
    assert last.loc["L1H0", "kernel_type"] == "slow_decay"  # ETC 3.9 of 10 keys
    eq = {"L0H1": kn.translation_tv(ks.kernel(0, 1), pos, 2, 1)}
    arts = {"table": "t.csv", "kernels": "k.png", "heatmap": "h.png", "profiles": "p.png"}
    sc = kn.scorecard(df, "prevtok", int(pos[-1]), arts, eq)
    rows = sc.set_index("quantity")
    assert json.loads(rows.loc["layer0_local_heads", "value"]) == ["L0H1"]
    assert json.loads(rows.loc["layer0_uniform_heads", "value"]) == ["L0H0"]
    assert rows.loc["positional_kernels", "value"] == 4
    assert float(rows.loc["kernel_consistency", "value"]) == pytest.approx(1.0)  # one text: no spread
    assert float(rows.loc["local_translation_tv", "value"]) < 1e-6
    assert set(sc["claim"]) == {"K1", "K2", "K3", "K4", "K5"}


def test_blockwise_layer_kernels_equal_the_direct_softmax():
    rng = np.random.default_rng(3)
    d, dh, P = 8, 4, 40
    means = rng.normal(size=(P, d))
    x = rng.normal(size=(2, 9, d))
    pos = np.array([2, 3, 5, 8, 13, 21, 30, 34, 39])
    for window in (0, 6):
        W = kn.HeadWeights(rng.normal(size=(1, 2, d, dh)), rng.normal(size=(1, 2, dh)), rng.normal(size=(1, 2, d, dh)),
                           rng.normal(size=(1, 2, dh)), np.array([2.0]), np.array([window]))
        small = kn.layer_kernels(means, x, pos, W, 0, k0=2, block=2)
        big = kn.layer_kernels(means, x, pos, W, 0, k0=2, block=100)
        direct = kn.head_kernels(means, x, pos, W.W_Q[0, 1], W.b_Q[0, 1], W.W_K[0, 1], W.b_K[0, 1], 2.0, 2, window)
        np.testing.assert_allclose(small.mean, big.mean, atol=FLOAT64_ABS)
        np.testing.assert_allclose(small.mean[1], direct.mean(axis=0), atol=FLOAT64_ABS)
        np.testing.assert_allclose(small.etc[:, 1], kn.effective_token_count(direct), rtol=FLOAT64_REL)
        if window:
            assert np.all(small.mean[:, pos >= 10, :3] == 0)  # outside the window
            np.testing.assert_array_equal(small.n_keys, np.minimum(pos - 1, window))


def test_means_and_config_errors_name_the_key():
    count = np.array([5, 5, 5, 0, 0])
    with pytest.raises(PosmechError, match="kernels.means_corpus"):
        kn.check_means(count, 4, {}, "compatibility", "unknown", "act.h5")
    with pytest.raises(PosmechError, match="forcerun cache_activations"):
        kn.check_means(count, 3, {"processing": "raw"}, "compatibility", "unknown", "act.h5")
    kn.check_means(count, 3, {"processing": "compatibility"}, "compatibility", "unknown", "act.h5")


def test_config_section_is_validated():
    import yaml

    from posmech.core.config import load_schema, validate_config
    from tests.conftest import REPO

    schema = load_schema(REPO / "workflow/schemas/config.schema.yaml")
    cfg = yaml.safe_load((REPO / "config/ci.yaml").read_text())
    validate_config(cfg, schema)
    assert cfg["kernels"]["k0"] == 2
    bad = yaml.safe_load((REPO / "config/ci.yaml").read_text())
    bad["kernels"]["means_corpus"] = "webtxt"
    with pytest.raises(PosmechError, match="kernels.means_corpus"):
        validate_config(bad, schema)
    bad = yaml.safe_load((REPO / "config/ci.yaml").read_text())
    bad["kernels"]["selected_heads"] = ["5.1"]
    with pytest.raises(PosmechError, match="kernels.selected_heads"):
        validate_config(bad, schema)


def test_build_kernels_refuses_positions_beyond_context(prevtok, tmp_path):
    from posmech.data.tokens import TokenSet
    from posmech.settings import defaults

    bridge = prevtok[0]
    toks = TokenSet(np.full(3 * N, 5), np.array([0, N, 2 * N, 3 * N]), {}, ["a", "b", "c"])
    means = np.zeros((2, N, bridge.cfg.d_model))
    settings = defaults("kernels", k0=2, heatmap_max_position=8, etc_positions=[N], etc_heatmap_position=N,
                        n_chapters=2, seed=0)
    with pytest.raises(PosmechError, match="beyond the model's context"):
        kn.build_kernels(bridge, {}, means, np.ones(N), toks, settings, tmp_path / "k.h5", {})
    settings = settings.replace(etc_positions=[10], etc_heatmap_position=9)
    with pytest.raises(PosmechError, match="etc_heatmap_position"):
        kn.build_kernels(bridge, {}, means, np.ones(N), toks, settings, tmp_path / "k.h5", {})
    settings = settings.replace(etc_heatmap_position=10)
    s = kn.build_kernels(bridge, {}, means, np.ones(N), toks, settings, tmp_path / "k.h5", {"model": "t"})
    assert len(s["texts"]) == 2 and s["n_queries"] == 8
    ks = kn.read_kernels(tmp_path / "k.h5")
    np.testing.assert_allclose(ks.etc_of_mean[0, 0], ks.n_keys[0])  # zero means: every kernel uniform


def test_settings_resolve_the_corpora_and_keep_the_recorded_positions():
    """The rule's settings: the corpora left null are the first corpus (kernels.h5 records
    them so), the positions left null scale with the context, and the rules reading
    kernels.h5 take its recorded positions (`kernels_config`)."""
    from posmech.core.config import scale_to_context
    from posmech.settings import defaults

    config = {"corpora": {"bible": {}, "web": {}}}
    s = defaults("kernels", config, query_corpus="web")
    assert (s.means_corpus, s.query_corpus) == ("bible", "web")
    raw = defaults("kernels").as_dict()
    assert s.as_dict() == {**raw, "means_corpus": "bible", "query_corpus": "web"}
    scaled = s.scaled(64)
    assert scaled.as_dict() == scale_to_context("kernels", s.as_dict(), 64)
    assert scaled.etc_positions == (6, 12, 25, 38, 50, 62) and scaled.etc_heatmap_position == 62
    assert s.recorded(scaled.as_dict()) == scaled
    assert s.recorded({"k0": 9}) == s  # only the context-scaled keys are taken
