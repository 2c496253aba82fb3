"""GPT-BigCode (StarCoder's layout: learned positions, multi-query attention) on the posmech
engine: its logits and attention patterns equal the Hugging Face forward's (eager), in both
processing modes, on the tiny random GPT-BigCode of tests/tiny_archs.py and on a multi-head
one (``multi_query`` false: the head-interleaved fused ``c_attn``); its one key head is
recorded as one (``hook_k``), as the bridge records it."""

from __future__ import annotations

import pytest

from tests import tiny_archs
from tests.models.hf_forward import assert_engine_equals_hf


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    import transformers

    root = tmp_path_factory.mktemp("bigcode")
    mq = tiny_archs.BUILDERS["gpt_bigcode"](root / "mq")
    keys = {**tiny_archs.ARCHS["gpt_bigcode"][4], "multi_query": False, **tiny_archs.COMMON}
    mh = tiny_archs._save(transformers.GPTBigCodeForCausalLM(transformers.GPTBigCodeConfig(**keys)), root / "mh", 13)
    return {"mq": mq, "mh": mh}


@pytest.mark.float32
@pytest.mark.parametrize("processing", ["raw", "compatibility"])
@pytest.mark.parametrize("which", ["mq", "mh"])
def test_engine_logits_and_patterns_equal_hugging_faces(dirs, which, processing):
    assert_engine_equals_hf(dirs[which], processing, 1 if which == "mq" else 4)


# --------------------------------------------------------------------------- layer 0 (K6-K10, C1-C3)
V, T = 60, 20  # vocabulary and text length (the model's context is 24 positions)


def tiny_bigcode(multi_query: bool, seed: int = 5):
    """A random-init tiny GPT-BigCode in memory (eager attention), its LayerNorms and biases
    randomised too: a wrong one would show."""
    import torch
    from transformers import GPTBigCodeConfig, GPTBigCodeForCausalLM

    torch.manual_seed(seed)
    cfg = GPTBigCodeConfig(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_inner=64, n_positions=24,
                           multi_query=multi_query, bos_token_id=0, eos_token_id=0)
    cfg._attn_implementation = "eager"
    model = GPTBigCodeForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "ln_" in name or name.endswith(".bias"):
                p.add_(0.3 * torch.randn_like(p))
    return model


def hf_layer0(model, ids):
    """Hugging Face's layer 0 on ``ids``, from its own modules: the pre-softmax scores ``[H, T, T]``
    (``c_attn`` of ``ln_1``'s output split as GPT-BigCode splits it: multi-query ``q | k | v``,
    else per head ``[q, k, v]``; times ``d_head^-1/2``), the attention weights ``[H, T, T]`` and
    ``c_fc``'s output ``[T, M]`` (the MLP's pre-activation)."""
    import torch

    blk = model.transformer.h[0]
    seen = {}
    hooks = [blk.ln_1.register_forward_hook(lambda m, i, o: seen.__setitem__("ln", o)),
             blk.mlp.c_fc.register_forward_hook(lambda m, i, o: seen.__setitem__("fc", o))]
    try:
        with torch.no_grad():
            out = model(torch.as_tensor(ids)[None], output_attentions=True)
            H = model.config.n_head
            dh = model.config.n_embd // H
            qkv = blk.attn.c_attn(seen["ln"][0])  # [T, rows]
            if model.config.multi_query:
                q, k = qkv[:, : H * dh].view(len(ids), H, dh).transpose(0, 1), qkv[:, H * dh : H * dh + dh][None]
            else:
                per = qkv.view(len(ids), H, 3 * dh).transpose(0, 1)
                q, k = per[..., :dh], per[..., dh : 2 * dh]
            scores = q @ k.transpose(1, 2) / dh**0.5
    finally:
        for h in hooks:
            h.remove()
    return (scores.double().numpy(), out.attentions[0][0].double().numpy(),
            seen["fc"][0].double().numpy())


@pytest.mark.float32
@pytest.mark.parametrize("multi_query", [True, False])
def test_layer0_pieces_sum_to_hugging_faces_scores_and_neurons_its_pre_activation(multi_query):
    """K6-K10's decomposition on GPT-BigCode, read through the engine's converter: for every key
    ``i``, the positional score ``π(n, i)`` plus the content score ``κ(n, x_i)`` at that key's
    own LayerNorm scale equal Hugging Face's layer-0 score (its one key head read by every query
    head under multi-query attention), the exact pattern its attention weights; C1-C3's
    layer-0 path (values, output, ln_2, c_fc) gives its ``c_fc`` output at every position."""
    import numpy as np

    from posmech.analyses import contextual as cx
    from posmech.analyses import neurons as nr

    model = tiny_bigcode(multi_query)
    w, ov = cx.weights_from_hf(model, "bigcode"), nr.ov_from_hf(model, "bigcode")
    assert w.n_heads == 4 and w.W_K.shape == w.W_Q.shape
    if multi_query:  # one key head, read by every query head
        assert all(np.array_equal(w.W_K[0], w.W_K[h]) for h in range(4))
    ids = np.random.default_rng(0).integers(1, V, T)
    scores, pattern, fc = hf_layer0(model, ids)
    pos = np.arange(T)
    q, s = w.queries(ids, pos), w.ln_scale(ids, pos)
    assert s.std() > 1e-3 * s.mean()  # the scale varies: one linear LayerNorm would not be exact
    lower = np.tril(np.ones((T, T), dtype=bool))
    pieces = np.empty((w.n_heads, T, T))
    for i in range(T):
        kp = w.positional_keys(float(s[i]))[:, i]
        kc = w.content_keys(float(s[i]), ids[i : i + 1])[:, 0]
        pieces[:, :, i] = (np.einsum("hne,he->hn", q, kp) + np.einsum("hne,he->hn", q, kc)) / w.attn_scale
    np.testing.assert_allclose(pieces[:, lower], np.broadcast_to(scores, pieces.shape)[:, lower], atol=2e-5, rtol=1e-5)
    dec = cx.decompose(w, float(np.median(s)), ids, pos, None)
    np.testing.assert_allclose(dec.attention, pattern, atol=2e-6)
    np.testing.assert_allclose(nr.hook_pre(w, ov, ids), fc, atol=2e-5, rtol=1e-5)
    assert np.abs(fc).max() > 0.1 and ov.d_mlp == 64


def test_layer0_reads_the_directory_as_the_model(dirs):
    """The pipeline's path (the directory's weights, no model built) reads what the model holds."""
    import numpy as np
    from transformers import GPTBigCodeForCausalLM

    from posmech.analyses import contextual as cx
    from posmech.analyses import neurons as nr

    model = GPTBigCodeForCausalLM.from_pretrained(dirs["mq"]).eval()
    w0, ov0 = cx.weights_from_hf(model, "mq"), nr.ov_from_hf(model, "mq")
    w, ov, _ = nr.load_weights({"hf_dir": str(dirs["mq"]), "name": "mq"}, "mq", tokenizer=False)
    for a in ("W_E", "W_pos", "ln_w", "ln_b", "W_Q", "W_K", "b_Q", "b_K"):
        np.testing.assert_allclose(getattr(w, a), getattr(w0, a), rtol=1e-6, atol=0)
    np.testing.assert_allclose(ov.W_in, ov0.W_in, rtol=1e-6, atol=0)
    assert w.attn_scale == w0.attn_scale
