"""Positional kernels of rotary and ALiBi heads (`posmech.analyses.kernels.head_kernels` with `rotary`/`slope`).

Exact cases: an ALiBi head with zero query/key weights attends ``∝ exp(−m·(n − i))`` over
its causal window, so its kernel and ETC have closed forms (:func:`alibi_kernel`,
:func:`truncated_geometric_etc`); a random-init tiny BLOOM whose query/key weights are
zeroed attends exactly so (its own ``hook_pattern``), and its kernel computed from the
model's weights and layer inputs is the closed form.  A rotary head whose layer input is
the same at every position (layer 0 of a Llama on one repeated token) has the model's own
attention pattern as its kernel.  Every case (learned, rotary, ALiBi, both) equals the
definition written out.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from posmech.analyses import kernels as kn
from posmech.models.scores import alibi_slopes
from posmech.models.handbuilt import char_tokenizer
from posmech.models.loading import load_bridge
from tests.analyses.test_kernels import hf_config, pattern, same_text_kernels
from tests.analyses.test_anatomy_raw_scores import model_dirs  # noqa: F401 (a fixture)
from tests.tolerances import FLOAT32_FORWARD_ABS, FLOAT64_ABS, FLOAT64_REL

V = 40


def _pattern(bridge, tokens: np.ndarray, layer: int) -> np.ndarray:
    got = {}

    def keep(t, hook):
        got["p"] = t[0].double().cpu().numpy()

    with torch.inference_mode(), bridge.hooks(fwd_hooks=[(f"blocks.{layer}.attn.hook_pattern", keep)]):
        bridge(torch.as_tensor(tokens)[None], return_type=None)
    return got["p"]


@pytest.mark.parametrize("k0, window", [(0, 0), (2, 0), (0, 5), (3, 4)])
def test_an_alibi_head_with_zero_query_key_weights_has_the_closed_form_kernel_and_etc(k0, window):
    rng = np.random.default_rng(0)
    d, dh, P, C = 16, 8, 30, 3
    means, x = rng.normal(size=(P, d)), rng.normal(size=(C, 6, d))
    positions = np.array([5, 9, 14, 20, 25, 29])
    zero_w, zero_b = np.zeros((d, dh)), np.zeros(dh)
    for m in alibi_slopes(6):
        pi = kn.head_kernels(means, x, positions, zero_w, zero_b, zero_w, zero_b, np.sqrt(dh), k0, window,
                                 slope=m)
        closed = kn.alibi_kernel(positions, m, k0, window)
        assert np.allclose(pi, closed[None], rtol=0, atol=FLOAT64_ABS)
        n_keys = kn.n_keys(positions, k0, window)
        want = np.array([kn.truncated_geometric_etc(m, int(w)) for w in n_keys])
        assert np.allclose(kn.effective_token_count(pi), want[None], rtol=FLOAT64_REL)
        # the decay is real: the ETC is below the number of keys, and larger slopes are more local
        assert (want < n_keys).all()
    steep, flat = (kn.effective_token_count(kn.alibi_kernel(positions, m, k0, window)) for m in (0.7, 0.01))
    assert (steep < flat).all()


def test_the_kernel_is_the_softmax_of_the_rotated_scores_plus_the_bias():
    """Against the definition written out: learned positions (no rotation, no bias), a
    rotation, an ALiBi bias, over a sliding window with k0 = 2."""
    rng = np.random.default_rng(1)
    d, dh, P = 12, 4, 20
    means, x = rng.normal(size=(P, d)), rng.normal(size=(2, 5, d))
    W_Q, W_K, b_Q, b_K = rng.normal(size=(d, dh)), rng.normal(size=(d, dh)), rng.normal(size=dh), rng.normal(size=dh)
    pos = np.array([3, 7, 11, 15, 19])
    cos, sin = kn.rope_tables(P, dh)

    def rot(v, j):  # the rotation written out pair by pair: (a, b) -> (a cos - b sin, b cos + a sin)
        a, b = v[..., : dh // 2], v[..., dh // 2:]
        c, s_ = cos[j, : dh // 2], sin[j, : dh // 2]
        return np.concatenate([a * c - b * s_, b * c + a * s_], -1)

    for rotary, slope in ((None, 0.0), ((cos, sin), 0.0), (None, 0.3), ((cos, sin), 0.3)):
        got = kn.head_kernels(means, x, pos, W_Q, b_Q, W_K, b_K, 2.0, 2, 6, rotary=rotary, slope=slope)
        for qi, n in enumerate(pos):
            keys = np.arange(max(2, n - 5), n + 1)
            q = x[:, qi] @ W_Q + b_Q
            k = means[keys] @ W_K + b_K
            if rotary is not None:
                q, k = rot(q, n), np.stack([rot(k[j], i) for j, i in enumerate(keys)])
            sc = q @ k.T / 2.0 + slope * (keys - n)
            want = np.exp(sc - sc.max(-1, keepdims=True))
            want /= want.sum(-1, keepdims=True)
            assert np.allclose(got[:, qi, keys], want, rtol=0, atol=FLOAT64_ABS)
            assert np.abs(np.delete(got[:, qi], keys, axis=-1)).max() == 0
    flat = (np.ones_like(cos), np.zeros_like(sin))  # a zero-angle rotation changes nothing
    assert np.allclose(kn.head_kernels(means, x, pos, W_Q, b_Q, W_K, b_K, 2.0, 2, 6, rotary=flat),
                       kn.head_kernels(means, x, pos, W_Q, b_Q, W_K, b_K, 2.0, 2, 6), rtol=0, atol=FLOAT64_ABS)


@pytest.fixture(scope="module")
def zero_qk_bloom(tmp_path_factory):
    """A random-init BLOOM (6 heads) whose layer-0 query and key weights and biases are zero."""
    from transformers import BloomConfig, BloomForCausalLM

    d = tmp_path_factory.mktemp("bloom-zero-qk")
    m = BloomForCausalLM(BloomConfig(vocab_size=V, hidden_size=48, n_layer=2, n_head=6, bos_token_id=0,
                                     eos_token_id=0))
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(0.4 * torch.randn(p.shape, generator=g))
        qkv = m.transformer.h[0].self_attention.query_key_value  # rows: [head, (q, k, v), d_head]
        w = qkv.weight.view(6, 3, 8, 48)
        b = qkv.bias.view(6, 3, 8)
        w[:, :2] = 0.0
        b[:, :2] = 0.0
    m.save_pretrained(d, safe_serialization=True)
    char_tokenizer(V).save_pretrained(d)
    return d


@pytest.mark.float32
def test_a_zero_query_key_alibi_models_attention_and_kernel_are_the_closed_form(zero_qk_bloom):
    bridge = load_bridge({"hf_dir": str(zero_qk_bloom), "name": "bloom"}, device="cpu", processing="raw")
    n = 24
    tokens = np.random.default_rng(2).integers(1, V, n)
    slopes = alibi_slopes(6)
    positions = np.arange(n)
    # the model itself attends exp(-m·offset) over its causal window
    pattern = _pattern(bridge, tokens, 0)
    for h, m in enumerate(slopes):
        assert np.allclose(pattern[h], kn.alibi_kernel(positions, m), rtol=0, atol=FLOAT32_FORWARD_ABS)
    # the kernel from the model's weights and layer inputs (means over random texts)
    texts = [np.random.default_rng(s).integers(1, V, n) for s in range(4)]
    x = kn.query_embeddings(bridge, texts, positions)[:, 0]  # [C, Q, d]
    means = x.mean(axis=0)
    W_Q, W_K = (getattr(bridge, a)[0].detach().double().numpy() for a in ("W_Q", "W_K"))
    b_Q, b_K = (getattr(bridge, a)[0].detach().double().numpy() for a in ("b_Q", "b_K"))
    assert np.abs(W_Q).max() == 0 and np.abs(W_K).max() == 0
    for h, m in enumerate(slopes):
        # zero query/key weights: the float32 layer inputs drop out, the kernel is float64 arithmetic
        pi = kn.head_kernels(means, x[:, 1:], positions[1:], W_Q[h], b_Q[h], W_K[h], b_K[h], np.sqrt(8), 0,
                                 slope=m)
        assert np.allclose(pi, kn.alibi_kernel(positions[1:], m)[None], rtol=0, atol=FLOAT64_ABS)
        etc = kn.effective_token_count(pi)
        want = [kn.truncated_geometric_etc(m, int(p) + 1) for p in positions[1:]]
        assert np.allclose(etc, np.asarray(want)[None], rtol=FLOAT64_REL)


@pytest.mark.float32
def test_a_rotary_kernel_with_position_independent_inputs_is_the_models_attention(tmp_path):
    """Layer 0 of a Llama on one token repeated: the layer input is the same at every
    position, so the mean key is the key and the kernel is the model's own pattern."""
    from transformers import LlamaConfig, LlamaForCausalLM

    m = LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                     bos_token_id=0, eos_token_id=0))
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for name, p in m.named_parameters():
            p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g) if "norm" in name else
                    0.5 * torch.randn(p.shape, generator=g))
    m.save_pretrained(tmp_path, safe_serialization=True)
    char_tokenizer(V).save_pretrained(tmp_path)
    bridge = load_bridge({"hf_dir": str(tmp_path), "name": "llama"}, device="cpu", processing="raw")
    n = 20
    tokens = np.full(n, 7)
    pattern = _pattern(bridge, tokens, 0)
    x = kn.query_embeddings(bridge, [tokens], np.arange(n))[:, 0]  # [1, n, d]
    W_Q = bridge.W_Q[0].detach().double().numpy()
    W_K = np.repeat(bridge.W_K[0].detach().double().numpy(), 2, axis=0)  # grouped keys: 2 query heads each
    zero = np.zeros(W_Q.shape[-1])
    cos, sin = kn.rope_tables(n, W_Q.shape[-1], float(m.config.rope_parameters["rope_theta"]))
    for h in range(4):
        pi = kn.head_kernels(x[0], x, np.arange(n), W_Q[h], zero, W_K[h], zero, np.sqrt(8), 0,
                                 rotary=(cos, sin))[0]
        assert np.allclose(pi, pattern[h], rtol=0, atol=1e-5)
        assert np.ptp(pi[n - 1, : n - 1]) > 1e-3  # not uniform: the rotation shapes it


@pytest.mark.float32
@pytest.mark.parametrize("processing", ["compatibility", "raw"])
@pytest.mark.parametrize("which", ["llama", "neox", "bloom"])
def test_kernels_with_the_texts_own_means_are_the_models_attention(which, processing, model_dirs):
    """The rule's path (``bridge_head_weights``: the model's rotary tables / ALiBi slopes,
    GQA key heads repeated, zero biases where the projection has none; ``model_kernels``):
    with means ``p_i`` the text's own layer inputs, the kernel is the attention the model
    pays, in every layer."""
    bridge = load_bridge({"hf_dir": str(model_dirs[which]), "name": which}, device="cpu", processing=processing)
    tokens = np.random.default_rng(5).integers(1, V, 16)
    layers, pos = same_text_kernels(bridge, model_dirs[which], tokens, 0)
    w = kn.bridge_head_weights(bridge, hf_config(model_dirs[which]))
    assert (w.rotary is not None) == (which != "bloom") and (w.slopes is not None) == (which == "bloom")
    for layer, lk in enumerate(layers):
        np.testing.assert_allclose(lk.mean, pattern(bridge, tokens, layer)[:, pos], atol=2e-5)
    assert np.ptp(layers[0].etc_of_mean[:, -1]) > 0.1  # heads differ: a wrong rotation or slope would show


def test_the_rule_path_gives_the_closed_form_on_a_zero_query_key_alibi_layer(zero_qk_bloom):
    bridge = load_bridge({"hf_dir": str(zero_qk_bloom), "name": "bloom"}, device="cpu")
    tokens = np.random.default_rng(6).integers(1, V, 16)
    layers, pos = same_text_kernels(bridge, zero_qk_bloom, tokens, 2)
    for h, m in enumerate(alibi_slopes(6)):
        assert np.allclose(layers[0].mean[h], kn.alibi_kernel(pos, m, 2), rtol=0, atol=FLOAT64_ABS)
        want = [kn.truncated_geometric_etc(m, int(w)) for w in kn.n_keys(pos, 2)]
        assert np.allclose(layers[0].etc_of_mean[h], want, rtol=FLOAT64_REL)


@pytest.mark.float32
def test_rotary_tables_are_the_default_rope_of_the_config(model_dirs):
    """The model's own tables (``rotary_tables``) are the default RoPE of its config:
    Llama on the whole head, GPT-NeoX on its first quarter (partial_rotary_factor 0.25)."""
    for which, r in (("llama", 8), ("neox", 4)):
        bridge = load_bridge({"hf_dir": str(model_dirs[which]), "name": which}, device="cpu")
        cos, sin = kn.rotary_tables(bridge, 30)
        c0, s0 = kn.rope_tables(30, r)
        assert cos.shape == (30, r)
        assert np.allclose(cos, c0, atol=1e-6) and np.allclose(sin, s0, atol=1e-6)
