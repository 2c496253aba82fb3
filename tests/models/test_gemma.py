"""Gemma and Gemma 2 on the posmech engine (issue 44): their logits and every layer's attention
pattern equal the Hugging Face forward's (eager), in both processing modes; every hook point and
weight equals TransformerLens's bridge (which ran Gemma 2 before); ``engine: auto`` picks posmech.

Gemma 2's layout: the embedding times ``sqrt(d_model)``, RMSNorm with scale ``1 + w``, GeGLU
(``gelu_pytorch_tanh``), four norms per block (input, post-attention, pre-feedforward,
post-feedforward), scores divided by ``sqrt(query_pre_attn_scalar)`` and soft-capped
(``attn_logit_softcapping``), ``sliding_attention`` layers of ``sliding_window`` keys, soft-capped
logits, grouped-query attention, rotary in the halves layout. Models: the tiny Gemma 2 of
tests/tiny_archs.py (caps 50 and 30: they hardly bind), a three-layer one whose caps bind (1 and 2)
and whose sliding window (5 keys) is shorter than the input, and a Gemma (1) with one key/value
head. Every norm weight is drawn (a zero Gemma norm weight is a scale of 1).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from posmech.analyses import anatomy as sa
from posmech.models import lens, scores
from posmech.models.loading import load_bridge, load_model
from tests import tiny_archs
from tests.models.hf_forward import assert_engine_equals_hf
from tests.tolerances import FLOAT64_ABS
from tests.models.test_lens import check_token_tree
from tests.tolerances import FLOAT32_FORWARD_REL

TIGHT = {"num_hidden_layers": 3, "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
         "sliding_window": 5, "attn_logit_softcapping": 1.0, "final_logit_softcapping": 2.0}
#: ``name: (config class, model class, config keys, key/value heads)``
MODELS = {
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", tiny_archs.ARCHS["gemma2"][4], 2),
    "gemma2_tight": ("Gemma2Config", "Gemma2ForCausalLM", {**tiny_archs.ARCHS["gemma2"][4], **TIGHT}, 2),
    "gemma": ("GemmaConfig", "GemmaForCausalLM",
              dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1, head_dim=8,
                   intermediate_size=64, max_position_embeddings=tiny_archs.N_CTX), 1),
}


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    import transformers

    root = tmp_path_factory.mktemp("gemma")
    out = {}
    for seed, (name, (config, model, keys, _)) in enumerate(MODELS.items()):
        made = getattr(transformers, model)(getattr(transformers, config)(**keys, **tiny_archs.COMMON))
        g = torch.Generator().manual_seed(100 + seed)
        with torch.no_grad():
            for pname, p in made.named_parameters():
                if p.ndim == 1 and "norm" in pname:  # Gemma's scale is 1 + w: w drawn around 0
                    p.copy_(0.3 * torch.randn(p.shape, generator=g))
        out[name] = tiny_archs._save(made, root / name, seed)  # draws every matrix
    return out


def _close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    a, b = a.detach().float(), b.detach().float()
    assert a.shape == b.shape, (what, tuple(a.shape), tuple(b.shape))
    fin = torch.isfinite(a) & (a > torch.finfo(a.dtype).min)
    assert torch.equal(fin, torch.isfinite(b) & (b > torch.finfo(b.dtype).min)), f"{what}: masked entries differ"
    scale = max(float(a[fin].abs().max()) if fin.any() else 1.0, 1.0)
    diff = float((a[fin] - b[fin]).abs().max()) if fin.any() else 0.0
    assert diff <= FLOAT32_FORWARD_REL * scale, f"{what}: max |diff| {diff:.3g} (scale {scale:.3g})"


@pytest.mark.float32
@pytest.mark.parametrize("processing", ["raw", "compatibility"])
@pytest.mark.parametrize("which", list(MODELS))
def test_engine_logits_and_patterns_equal_hugging_faces(dirs, which, processing):
    model = assert_engine_equals_hf(dirs[which], processing, MODELS[which][3])  # engine: auto picks posmech
    c = model.cfg
    assert c.positional_embedding_type == "rotary" and c.rotary_dim == c.d_head == 8 and c.gated_mlp
    assert c.embed_scale == pytest.approx(32**0.5) and c.act_fn == "gelu_pytorch_tanh"
    gemma2 = which.startswith("gemma2")
    assert c.post_norms is gemma2 and (c.attn_scores_soft_cap > 0) is gemma2
    if which == "gemma2_tight":  # the caps bind, the window is shorter than the input
        assert c.windows == [5, 0, 5] and c.attn_scores_soft_cap == 1.0 and c.output_logits_soft_cap == 2.0


@pytest.mark.float32
@pytest.mark.parametrize("processing", ["raw", "compatibility"])
@pytest.mark.parametrize("which", list(MODELS))
def test_every_hook_and_weight_equals_the_bridge(dirs, which, processing):
    """Every hook point the engine has (``hook_q``/``hook_k`` before the rotation, ``hook_cos``/
    ``hook_sin``, the soft-capped masked scores, the four norms of each block, the MLP's gate and
    up projections) and every weight equal the bridge's, which ran Gemma 2 before the engine did;
    the scores are :class:`~posmech.models.scores.ScoreFunction`'s (q and k rotated, divided by
    ``sqrt(query_pre_attn_scalar)``, soft-capped), as the analyses compute them."""
    d = dirs[which]
    bridge = load_bridge({"hf_dir": str(d), "name": which}, "cpu", "float32", processing)
    model = load_model({"hf_dir": str(d), "name": which}, "cpu", "float32", processing, "posmech")
    names = [n for n in model.hook_dict if not n.endswith("hook_result")]  # bridge: needs use_attn_result
    assert all(n in bridge.hook_dict for n in names), [n for n in names if n not in bridge.hook_dict]
    if which.startswith("gemma2"):
        assert "blocks.0.ln1_post.hook_scale" in names and "blocks.0.ln2_post.hook_out" in names
    x = torch.as_tensor(np.random.default_rng(1).integers(1, tiny_archs.V, size=(2, 20)))
    with torch.inference_mode():
        lb, cb = bridge.run_with_cache(x)
        ll, cl = model.run_with_cache(x, names_filter=names)
    _close(lb, ll, "logits")
    compared = [n for n in names if n in cb]
    for n in compared:
        _close(cb[n], cl[n], f"{which} {processing}: {n}")
    assert len(compared) == len(names)
    fn = scores.score_function(model.cfg)
    assert fn.scheme == "rotary" and fn.scale == pytest.approx(8**0.5)
    assert fn.softcap == (MODELS[which][2].get("attn_logit_softcapping", 50.0) if which != "gemma" else None)
    for i in range(model.cfg.n_layers):
        a = f"blocks.{i}.attn."
        raw = fn.full(cl[a + "hook_q"], cl[a + "hook_k"], {h: cl[a + h] for h in fn.extra_hooks})
        sa.check_scores(raw, cl[a + "hook_attn_scores"], f"layer {i}", fn.scale, fn.row_constant)
    for w in ("W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V", "W_O", "b_O", "W_in", "W_gate", "W_out", "W_E", "W_U", "b_U"):
        try:
            ref = getattr(bridge, w)
        except AttributeError:  # no stacked bias for bias-free projections
            continue
        if ref is not None:
            _close(ref, getattr(model, w), w)


@pytest.mark.float32
def test_token_trees_and_every_token_at_position_0(dirs):
    """A prompt with two continuations in one pass equals each alone (the sliding window counted
    in the tree's positions); every token at position 0 (the L rules' token-only input) scores
    ``cap(q·k / scale)`` with no rotation."""
    model = load_model({"hf_dir": str(dirs["gemma2_tight"]), "name": "g"}, "cpu", "float32", "raw", "posmech")
    check_token_tree(model, np.random.default_rng(3).integers(1, tiny_archs.V, 9), [[5, 7, 9, 11], [8, 2]],
                     _close, "gemma2")
    T = 12
    x = torch.as_tensor(np.random.default_rng(4).integers(1, tiny_archs.V, size=(1, T)))
    got = {}
    keep = lambda t, hook: got.__setitem__(hook.name.split(".")[-1], t.clone())  # noqa: E731
    hooks = [(f"blocks.0.attn.{h}", keep) for h in ("hook_q", "hook_k", "hook_attn_scores")]
    with torch.inference_mode(), model.hooks(fwd_hooks=hooks):
        model(x, positions=torch.zeros(T, dtype=torch.long), visible=torch.ones(T, T, dtype=torch.bool).tril())
    k = got["hook_k"].repeat_interleave(2, dim=2)
    want = torch.tanh(torch.einsum("bqhd,bkhd->bhqk", got["hook_q"], k) / 8**0.5 / 1.0) * 1.0
    seen = torch.ones(T, T, dtype=torch.bool).tril()
    _close(want[..., seen], got["hook_attn_scores"][..., seen], "scores at position 0")


def test_variants_the_engine_does_not_run_are_refused_with_their_reason(dirs):
    c = json.loads((dirs["gemma2"] / "config.json").read_text())
    assert lens.unsupported_hf(c) is None
    assert "use_bidirectional_attention" in lens.unsupported_hf({**c, "use_bidirectional_attention": True})
    assert "layer_types" in lens.unsupported_hf({**c, "layer_types": ["chunked_attention", "full_attention"]})
    scaled = {**c, "rope_parameters": {**c["rope_parameters"], "rope_type": "linear", "factor": 2.0}}
    assert "rope_type 'linear'" in lens.unsupported_hf(scaled)
    assert "activation 'relu2'" in lens.unsupported_hf({**c, "hidden_activation": "relu2"})


@pytest.mark.float32
def test_layer0_decomposition_is_gemma2s_layer0_with_its_window_and_cap(dirs):
    """K6-K10's layer-0 reader on the Gemma 2 whose layer 0 slides over 5 keys and whose cap (1)
    binds: the decomposition's exact pattern is the model's layer-0 pattern on a 20-token text
    (keys beyond the window 0), its positional score the position-only input's layer-0 score
    before the cap (π splits the logit before it), and the stored positional pattern is 0 beyond
    the window."""
    from posmech.analyses import attn_only as ao
    from posmech.analyses import contextual as cx
    from posmech.analyses.contextual.relative import relative_from_model
    from posmech.models.handbuilt import char_tokenizer

    m = lens.from_hf_dir(str(dirs["gemma2_tight"]), char_tokenizer(tiny_archs.V), "raw", "cpu", "float32")
    w = relative_from_model(m, "gemma2")
    assert w.window == 5 and w.softcap == 1.0
    ids = np.random.default_rng(0).integers(1, tiny_archs.V, size=20)
    dec = cx.decompose(w, 1.0, ids, np.arange(1, 20))
    heads = [(0, h) for h in range(4)]
    P = ao.run_variant(m, ids[None], "both", heads).patterns[0][:, 1:, :]
    np.testing.assert_allclose(dec.attention, P, atol=1e-6)
    assert float(np.abs(dec.attention[:, -1, :14]).max()) == 0.0  # query 19 sees keys 15..19
    dest = 7
    fixed = cx.decompose(w, 1.0, ids, np.arange(1, 20), destination=dest)
    S = ao.run_variant(m, np.full((1, 20), dest), "position_only", heads).scores[0][:, 1:, :]  # capped, causal
    fin = np.isfinite(fixed.pi)  # causal and within the window
    assert fin.sum(-1).max() == 5 and np.isfinite(S[fin]).all()
    np.testing.assert_allclose(np.tanh(fixed.pi[fin]), S[fin], atol=1e-5)
    stored = cx.positional_pattern(w.queries(np.full(20, dest), np.arange(20)), w.positional_keys(1.0, dest), 19,
                                   w.attn_scale, w.window)
    np.testing.assert_allclose(stored, fixed.p[:, -1], atol=FLOAT64_ABS)  # the same float64 computation
    assert float(np.abs(stored[:, :15]).max()) == 0.0


@pytest.mark.float32
@pytest.mark.parametrize("which", ["gemma2", "gemma2_tight"])
def test_contextual_neurons_read_gemma2s_pre_activation(dirs, which):
    """C1-C3's layer 0 on Gemma 2 (``posmech.analyses.neurons``): the neurons' pre-activation
    computed from the decomposition's layer 0 (its window and cap) and the weights (the
    attention output through its RMSNorm, then the pre-feedforward norm, then the gate) equals
    Hugging Face's ``gate_proj`` output on a 24-token text; the same with the post-attention norm
    treated as linear at the scale of each position (what ``s_a`` fixes at its median) equals it too."""
    from transformers import AutoModelForCausalLM

    from posmech.analyses import neurons as nr
    from posmech.models.handbuilt import char_tokenizer
    from posmech.models.lens import hf_dir_reader
    from posmech.models.loading import WeightView

    get, cfg = hf_dir_reader(dirs[which], framework="numpy")
    view = WeightView(get, get.names, cfg)
    b0, _ = nr.blocks_from_hf(view, which)
    ov = nr.ov_from_blocks(b0, None, which)
    assert ov.attn_norm is not None and ov.layer == 0 and ov.gated and ov.ln2_rms
    m = lens.from_hf_dir(str(dirs[which]), char_tokenizer(tiny_archs.V), "raw", "cpu", "float32")
    w = nr.relative_layer0(m, b0.ln1, which)
    ids = np.random.default_rng(5).integers(1, tiny_archs.V, size=24)
    got = nr.hook_pre(w, ov, ids)
    hf = AutoModelForCausalLM.from_pretrained(dirs[which], attn_implementation="eager").eval()
    seen = {}
    hf.model.layers[0].mlp.gate_proj.register_forward_hook(lambda mod, i, o: seen.__setitem__("pre", o))
    with torch.no_grad():
        hf(torch.as_tensor(ids)[None])
    want = seen["pre"][0].double().numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=FLOAT32_FORWARD_REL * max(1.0, np.abs(want).max()))
    # the norm of the attention output is linear at each position's own scale: the bag of tokens' sum
    x = w.ln(ids, np.arange(24))
    P = nr.layer0_patterns(w, ids)
    s = ov.attn_norm_scale(x, P)
    parts = ov.b_O + sum(P[h] @ ov.ov(h, x) for h in range(ov.W_V.shape[0]))
    linear = w.resid(ids) + parts * ov.attn_norm.w / s[:, None]
    np.testing.assert_allclose(ov.ln2(linear) @ ov.W_in + ov.b_in, want, rtol=0,
                               atol=FLOAT32_FORWARD_REL * max(1.0, np.abs(want).max()))
