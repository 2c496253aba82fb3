"""The layer-0 decomposition (K6-K10) and the contextual neurons' layer-0 path (C1-C3) on a
random-init tiny OPT (learned positions stored from row 2 of its position table, scores
``q·k/sqrt(d_head)``, ReLU MLP), read through the forward engine's converter
(:func:`posmech.analyses.contextual.layer0_state`), checked against Hugging Face's own
layer-0 computation:

* the pieces: for every key ``i``, the positional score ``π(n, i)`` plus the content score
  ``κ(n, x_i)`` taken at that key's own LayerNorm scale ``s_i`` (where linear LayerNorm is
  exact) equal Hugging Face's pre-softmax layer-0 score (its ``self_attn_layer_norm`` output
  through ``q_proj·scaling`` and ``k_proj``), and the exact pattern equals its attention
  weights;
* the neurons' layer-0 path (value/output of every head, second LayerNorm, ``fc1``) gives
  Hugging Face's ``fc1`` output (the MLP's pre-activation) at every position;
* a post-LayerNorm OPT (``do_layer_norm_before: false``) is refused, from its config, before
  any job (the applicability table) and by the reader itself.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from posmech.analyses import contextual as cx
from posmech.analyses import neurons as nr
from posmech.pipeline.applicability import not_applicable
from posmech.core.errors import PosmechError
from posmech.models.architecture import architecture
from tests import tiny_archs
from tests.tolerances import FLOAT64_REL

V, T = 60, 20  # vocabulary and text length (the model's context is 24 positions)


def tiny_opt(seed: int = 3, **over):
    from transformers import OPTConfig, OPTForCausalLM

    torch.manual_seed(seed)
    cfg = OPTConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=64,
                    max_position_embeddings=24, word_embed_proj_dim=32, pad_token_id=1, bos_token_id=0,
                    eos_token_id=0, **over)
    cfg._attn_implementation = "eager"
    model = OPTForCausalLM(cfg).eval()
    with torch.no_grad():  # random LayerNorm parameters and biases: a wrong one would show
        for name, p in model.named_parameters():
            if "layer_norm" in name or name.endswith(".bias"):
                p.add_(0.3 * torch.randn_like(p))
    return model


def hf_layer0(model, ids):
    """Hugging Face's layer 0 on ``ids``: pre-softmax scores ``[H, T, T]`` (masked keys
    excluded by the caller), attention weights ``[H, T, T]`` and ``fc1`` output ``[T, M]``."""
    layer = model.model.decoder.layers[0]
    att = layer.self_attn
    seen = {}
    hooks = [layer.self_attn_layer_norm.register_forward_hook(lambda m, i, o: seen.__setitem__("ln", o)),
             layer.fc1.register_forward_hook(lambda m, i, o: seen.__setitem__("fc1", o))]
    try:
        with torch.no_grad():
            out = model(torch.as_tensor(ids)[None], output_attentions=True)
            H = model.config.num_attention_heads
            dh = model.config.hidden_size // H
            x = seen["ln"][0]
            q = (att.q_proj(x) * att.scaling).view(len(ids), H, dh).transpose(0, 1)
            k = att.k_proj(x).view(len(ids), H, dh).transpose(0, 1)
            scores = q @ k.transpose(1, 2)
    finally:
        for h in hooks:
            h.remove()
    fc1 = seen["fc1"].reshape(len(ids), -1)  # OPT flattens batch and positions before its MLP
    return scores.double().numpy(), out.attentions[0][0].double().numpy(), fc1.double().numpy()


@pytest.mark.float32
@pytest.mark.parametrize("bias", [True, False])
def test_pieces_sum_to_opts_own_layer0_scores_and_pattern(bias):
    model = tiny_opt(enable_bias=bias)
    w = cx.weights_from_hf(model, "opt")
    # W_pos is the position table from row 2 (the row of position 0), the scale OPT's own
    table = model.model.decoder.embed_positions.weight.detach().double().numpy()
    np.testing.assert_array_equal(w.W_pos, table[2:].astype(np.float32))
    assert w.attn_scale == pytest.approx(1 / model.model.decoder.layers[0].self_attn.scaling, rel=FLOAT64_REL)
    ids = np.random.default_rng(0).integers(2, V, T)
    scores, pattern, _ = hf_layer0(model, ids)
    pos = np.arange(T)
    q = w.queries(ids, pos)  # [H, T, d_head], exact LayerNorm
    s = w.ln_scale(ids, pos)  # each token's own LayerNorm scale
    assert s.std() > 1e-3 * s.mean()  # the scale varies: linear LayerNorm at one scale would not be exact
    lower = np.tril(np.ones((T, T), dtype=bool))
    pieces = np.empty((w.n_heads, T, T))
    for i in range(T):
        kp = w.positional_keys(float(s[i]))[:, i]  # [H, d_head]
        kc = w.content_keys(float(s[i]), ids[i : i + 1])[:, 0]
        pi = np.einsum("hne,he->hn", q, kp) / w.attn_scale
        kappa = np.einsum("hne,he->hn", q, kc) / w.attn_scale
        pieces[:, :, i] = pi + kappa
    np.testing.assert_allclose(pieces[:, lower], scores[:, lower], atol=2e-5, rtol=1e-5)
    dec = cx.decompose(w, float(np.median(s)), ids, pos, None)
    np.testing.assert_allclose(dec.attention, pattern, atol=2e-6)
    assert dec.tv().max() > 1e-6  # the linear-LN pattern at one scale is not the exact one here


@pytest.mark.float32
def test_neurons_layer0_path_equals_opts_fc1():
    model = tiny_opt()
    w, ov = cx.weights_from_hf(model, "opt"), nr.ov_from_hf(model, "opt")
    ids = np.random.default_rng(1).integers(2, V, T)
    _, _, fc1 = hf_layer0(model, ids)
    np.testing.assert_allclose(nr.hook_pre(w, ov, ids), fc1, atol=2e-5, rtol=1e-5)
    assert ov.d_mlp == 64 and np.abs(fc1).max() > 0.1


def test_directory_reads_the_same_weights(tmp_path):
    """The pipeline reads the saved directory (safetensors, no model built; tests/tiny_archs.py's
    OPT with the character tokenizer): the same weights as the built model's."""
    from transformers import OPTForCausalLM

    d = tiny_archs.opt(tmp_path / "opt")
    model = OPTForCausalLM.from_pretrained(d).eval()
    w0, ov0 = cx.weights_from_hf(model, "opt"), nr.ov_from_hf(model, "opt")
    w, ov, tok = nr.load_weights({"hf_dir": str(d), "name": "opt"}, "opt")
    for a, b in ((w0.W_E, w.W_E), (w0.W_pos, w.W_pos), (w0.W_Q, w.W_Q), (w0.b_K, w.b_K), (ov0.W_V, ov.W_V),
                 (ov0.W_O, ov.W_O), (ov0.W_in, ov.W_in), (ov0.ln2_b, ov.ln2_b)):
        np.testing.assert_array_equal(a, b)
    assert w.W_pos.shape == (tiny_archs.N_CTX, 32) and w.attn_scale == w0.attn_scale == np.sqrt(8)
    assert tok("In the").input_ids and cx.load_weights({"hf_dir": str(d), "name": "opt"}, "opt")[0].n_heads == 4


def test_post_layernorm_opt_is_refused_before_any_job():
    model = tiny_opt(do_layer_norm_before=False)
    arch = architecture(model.config.to_dict(), "model 'post'")
    assert arch.post_ln and not architecture(tiny_opt().config.to_dict()).post_ln
    why = not_applicable(arch)
    assert "do_layer_norm_before: false" in why["layer0_decomposition"]
    assert "layer0_decomposition" in why["extended_token_embeddings"]  # C1 reads the decomposition
    assert {"layer0_head_classes", "layer1_patterns", "bag_of_tokens_fit"} <= set(why)
    assert "positional_kernels" not in why and "posembed_averaging" not in why
    assert not {"layer0_decomposition", "extended_token_embeddings"} & set(not_applicable(
        architecture(tiny_opt().config.to_dict())))
    with pytest.raises(PosmechError, match="do_layer_norm_before false"):
        cx.weights_from_hf(model, "post")
