"""The posmech forward engine on OPT, GPT-NeoX/Pythia, Llama-style (Llama, Qwen2) and BLOOM
models equals Hugging Face and TransformerLens's bridge.

Random-weight tiny models built from ``transformers`` configs (no Hub), every weight drawn
so that it matters (norm scales around 1, non-zero biases), saved with the character
tokenizer: an OPT (learned positions from row 2, ReLU, biases), an OPT with
``do_layer_norm_before: false`` (post-LayerNorm blocks), a GPT-NeoX (Pythia's layout:
rotary on a quarter of each head, parallel residual), a Llama (full rotary with a rope
theta of 500, grouped-query attention: 4 query heads, 2 key/value heads, SwiGLU, RMSNorm),
a Mistral (one key/value head, a sliding window of 6 keys), a Qwen2 (the Llama layout
with q/k/v biases) and a BLOOM (ALiBi with 6 heads, not a power
of two; an embedding LayerNorm).

For each, in both processing modes where the engine runs it: its logits equal Hugging
Face's (up to a constant per row in the compatibility mode, which centres the
unembedding: compared after ``log_softmax``), its ``hook_pattern`` equals Hugging Face's
attention weights (``output_attentions``, eager attention), and every hook point and
weight equals the bridge's where the bridge is right (raw mode; OPT's bridge records the
pattern at ``hook_attn_scores``, and its compatibility mode computes a GPT-NeoX MLP
wrongly: those are compared with q·k and Hugging Face instead). Interventions (a pattern
replaced, scores scaled, a head's ``z`` scaled) change the engine's output as they change
the bridge's. Tolerance: float32 rounding, 5e-5 relative to the tensor's largest value.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from posmech.analyses import anatomy as sa
from posmech.core.errors import PosmechError
from posmech.models import scores
from posmech.models import lens as lens_mod
from posmech.models.handbuilt import char_tokenizer
from posmech.models.loading import load_bridge, load_model
from tests.models.test_lens import check_token_tree, check_wpos_edit

V, N = 40, 20
RTOL = 5e-5


def _save(model: torch.nn.Module, d: Path, seed: int) -> Path:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g)
            norm_w = "norm" in name.lower() and name.endswith("weight") or name.endswith("ln_f.weight")
            p.copy_(1.0 + 0.3 * r if norm_w else 0.3 * r)
    model.save_pretrained(d, safe_serialization=True)
    char_tokenizer(V).save_pretrained(d)
    return d


COMMON = {"vocab_size": V, "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0}


def _build(which: str, d: Path) -> Path:
    import transformers as tf

    if which in ("opt", "opt_post_ln"):
        m = tf.OPTForCausalLM(tf.OPTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=48,
                                           max_position_embeddings=N, word_embed_proj_dim=32, dropout=0.0,
                                           do_layer_norm_before=which == "opt", **COMMON))
    elif which == "neox":
        m = tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                   intermediate_size=48, max_position_embeddings=N,
                                                   rotary_pct=0.25, partial_rotary_factor=0.25, **COMMON))
    elif which == "llama":
        m = tf.LlamaForCausalLM(tf.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                               num_key_value_heads=2, intermediate_size=48, max_position_embeddings=N,
                                               rope_theta=500.0, **COMMON))
    elif which == "mistral":  # a sliding window of 6 keys on every layer
        m = tf.MistralForCausalLM(tf.MistralConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                   num_key_value_heads=1, intermediate_size=48,
                                                   max_position_embeddings=N, sliding_window=6, **COMMON))
    elif which == "qwen2":
        m = tf.Qwen2ForCausalLM(tf.Qwen2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                               num_key_value_heads=2, intermediate_size=48, max_position_embeddings=N,
                                               **COMMON))
    else:
        m = tf.BloomForCausalLM(tf.BloomConfig(hidden_size=48, n_layer=2, n_head=6, **COMMON))
    return _save(m, d, {"opt": 0, "opt_post_ln": 1, "neox": 2, "llama": 3, "qwen2": 4, "bloom": 5, "mistral": 6}[which])


ARCHS = ("opt", "opt_post_ln", "neox", "llama", "mistral", "qwen2", "bloom")


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lens-archs")
    return {a: _build(a, root / a) for a in ARCHS}


def _man(d: Path) -> dict:
    return {"hf_dir": str(d), "name": d.name}


def _tokens(seed: int = 0, batch: int = 2) -> torch.Tensor:
    return torch.as_tensor(np.random.default_rng(seed).integers(1, V, size=(batch, N)))


def _close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    a, b = a.detach().float(), b.detach().float()
    if a.shape != b.shape and a.numel() == b.numel():  # OPT's bridge flattens [B·T, ·] around its MLP
        a = a.reshape(b.shape)
    assert a.shape == b.shape, (what, tuple(a.shape), tuple(b.shape))
    fin = torch.isfinite(a) & (a > torch.finfo(a.dtype).min)
    assert torch.equal(fin, torch.isfinite(b) & (b > torch.finfo(b.dtype).min)), f"{what}: masked entries differ"
    scale = float(a[fin].abs().max()) if fin.any() else 1.0
    diff = float((a[fin] - b[fin]).abs().max()) if fin.any() else 0.0
    assert diff <= RTOL * max(scale, 1.0), f"{what}: max |diff| {diff:.3g} (scale {scale:.3g})"


def _hf(d: Path, x: torch.Tensor):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager").eval()
    with torch.no_grad():
        return hf(x, output_attentions=True)


def _runs(which: str, processing: str) -> bool:
    return not (which == "opt_post_ln" and processing == "compatibility")


@pytest.mark.float32
@pytest.mark.parametrize("processing", ["raw", "compatibility"])
@pytest.mark.parametrize("which", ARCHS)
def test_logits_and_patterns_equal_hugging_faces(which, processing, dirs):
    d = dirs[which]
    if not _runs(which, processing):
        with pytest.raises(PosmechError, match="do_layer_norm_before.*processing: raw"):
            load_model(_man(d), "cpu", "float32", processing, "posmech")
        auto = load_model(_man(d), "cpu", "float32", processing)  # auto: the bridge, which runs it
        assert not isinstance(auto, lens_mod.Lens)
        return
    lens = load_model(_man(d), "cpu", "float32", processing)  # auto picks the engine
    assert isinstance(lens, lens_mod.Lens)
    x = _tokens()
    ref = _hf(d, x)
    got: dict[int, torch.Tensor] = {}
    hooks = [(f"blocks.{i}.attn.hook_pattern", lambda t, hook: got.__setitem__(hook.layer(), t.clone()))
             for i in range(lens.cfg.n_layers)]
    with torch.inference_mode():
        fused = lens(x)  # no hook: the fused attention
        hooked = lens.run_with_hooks(x, fwd_hooks=hooks)
    for logits, how in ((fused, "fused"), (hooked, "hooked")):
        if processing == "raw":
            _close(ref.logits, logits, f"{which} {how}: logits")
        _close(ref.logits.log_softmax(-1), logits.log_softmax(-1), f"{which} {how}: log-probabilities")
    for i in range(lens.cfg.n_layers):
        _close(ref.attentions[i], got[i], f"{which}: layer {i} pattern")


BRIDGE_WRONG = {
    # TransformerLens 4.3's bridge records OPT's pattern at hook_attn_scores
    "opt": ("hook_attn_scores",), "opt_post_ln": ("hook_attn_scores",),
}


@pytest.mark.float32
@pytest.mark.parametrize("processing", ["raw", "compatibility"])
@pytest.mark.parametrize("which", ["opt", "opt_post_ln", "neox", "llama", "mistral", "qwen2", "bloom"])
def test_every_hook_and_weight_equals_the_bridge(which, processing, dirs):
    if which == "opt_post_ln":
        pytest.skip("TransformerLens 4.3's bridge fails on a post-LayerNorm OPT (ValueError in OPT's attention); "
                    "the engine is compared with Hugging Face (test_logits_and_patterns_equal_hugging_faces)")
    if which == "opt" and processing == "compatibility":
        pytest.skip("TransformerLens 4.3's bridge does not process OPT's weights in the compatibility mode "
                    "(\"OptArchitectureAdapter does not support fold_ln\"); the engine folds them as "
                    "process_weights does and is compared with Hugging Face")
    if which == "neox" and processing == "compatibility":
        pytest.skip("TransformerLens 4.3's compatibility mode computes a GPT-NeoX MLP wrongly with random "
                    "LayerNorm weights (tests/analyses/test_anatomy_raw_scores.py); the engine is compared "
                    "with Hugging Face (test_logits_and_patterns_equal_hugging_faces)")
    d = dirs[which]
    bridge = load_bridge(_man(d), "cpu", "float32", processing)
    lens = load_model(_man(d), "cpu", "float32", processing, "posmech")
    names = [n for n in lens.hook_dict if not n.endswith("hook_result")]  # bridge: needs use_attn_result
    assert all(n in bridge.hook_dict for n in names), [n for n in names if n not in bridge.hook_dict]
    x = _tokens(1)
    with torch.inference_mode():
        lb, cb = bridge.run_with_cache(x)
        ll, cl = lens.run_with_cache(x, names_filter=names)
    _close(lb, ll, "logits")
    skip = BRIDGE_WRONG.get(which, ())
    compared = 0
    for n in names:
        if n in cb and not n.endswith(skip):
            _close(cb[n], cl[n], f"{which} {processing}: {n}")
            compared += 1
    assert compared >= len(names) - 2 * lens.cfg.n_layers
    # the scores are the model's pre-softmax scores: score_anatomy's raw scores, masked
    fn = scores.score_function(lens.cfg)
    assert fn.scheme == {"bloom": "alibi", "opt": "learned", "opt_post_ln": "learned"}.get(which, "rotary")
    for i in range(lens.cfg.n_layers):
        a = f"blocks.{i}.attn."
        extra = {h: cl[a + h] for h in fn.extra_hooks}
        raw = fn.full(cl[a + "hook_q"], cl[a + "hook_k"], extra)
        sa.check_scores(raw, cl[a + "hook_attn_scores"], f"layer {i}", fn.scale, fn.row_constant)
    if lens.cfg.n_key_value_heads != lens.cfg.n_heads:
        assert cl["blocks.0.attn.hook_k"].shape[2] == lens.cfg.n_key_value_heads  # as the bridge: not repeated
    for w in ("W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V", "W_O", "b_O", "W_in", "b_in", "W_gate", "W_out", "b_out",
              "W_E", "W_pos", "W_U", "b_U"):
        try:
            ref = getattr(bridge, w)
        except AttributeError:  # the bridge has no stacked bias for bias-free projections, no W_pos without it
            continue
        if ref is None:
            continue
        _close(ref, getattr(lens, w), w)
    for key in ("n_layers", "n_heads", "d_model", "d_head", "n_ctx", "d_vocab", "d_mlp"):
        if not (key == "d_mlp" and which.startswith("opt")):  # the bridge's OPT cfg says 4·d_model, not ffn_dim
            assert getattr(lens.cfg, key) == getattr(bridge.cfg, key), key
    assert lens.cfg.d_mlp == lens.W_in.shape[-1] == bridge.W_in.shape[-1]


def _interventions():
    def knock_out(t, hook):  # P5: the previous-token entries of head 1, renormalised
        t = t.clone()
        idx = torch.arange(1, t.shape[-1])
        t[:, 1, idx, idx - 1] = 0.0
        return t / t.sum(-1, keepdim=True)

    def scale_head(t, hook):
        t = t.clone()
        t[:, :, 2] *= 3.0
        return t

    return {
        "embed": [("hook_embed", lambda t, hook: t * 0.0)],
        "pattern": [("blocks.0.attn.hook_pattern", knock_out)],
        "head_scale": [("blocks.1.attn.hook_z", scale_head)],
        "scores": [("blocks.1.attn.hook_attn_scores", lambda t, hook: t * 0.5)],
    }


@pytest.mark.float32
@pytest.mark.parametrize("which", ["opt", "neox", "llama", "qwen2", "bloom"])
def test_interventions_change_both_engines_alike(which, dirs):
    d = dirs[which]
    bridge = load_bridge(_man(d), "cpu", "float32", "raw")
    lens = load_model(_man(d), "cpu", "float32", "raw", "posmech")
    x = _tokens(2)
    with torch.inference_mode():
        plain = lens(x)
        for name, hooks in _interventions().items():
            b = lens.run_with_hooks(x, fwd_hooks=hooks)
            assert float((b - plain).abs().max()) > 1e-3, f"{name}: the edit did nothing"
            # TransformerLens 4.3's bridge discards edits of OPT's pattern (the output does not change)
            # and records the pattern at its hook_attn_scores: compared with the bridge elsewhere only
            if not (which == "opt" and name in ("scores", "pattern")):
                _close(bridge.run_with_hooks(x, fwd_hooks=hooks), b, f"{which}: {name}")
        if which == "opt":  # W_pos overwritten in place and restored (P2's averaging)
            check_wpos_edit(bridge, lens, x, plain, _close)
    assert not any(hp.fwd_hooks for hp in lens.hook_dict.values())


@pytest.mark.float32
@pytest.mark.parametrize("which", ["opt", "neox", "llama", "bloom"])
def test_a_token_tree_and_query_blocks_on_every_position_scheme(which, dirs, monkeypatch):
    """A prompt with two continuations in one pass: each continuation's logits equal a pass
    of prompt + continuation alone (rotary angles and ALiBi biases follow the tree's
    positions); the pattern made by blocks of queries equals the square."""
    lens = load_model(_man(dirs[which]), "cpu", "float32", "raw", "posmech")
    check_token_tree(lens, np.random.default_rng(3).integers(1, V, 9), [[5, 7, 9], [8, 2]], _close, which)
    monkeypatch.setattr(lens_mod, "QUERY_BLOCK", 4)
    xt = _tokens(4)
    seen: dict[bool, torch.Tensor] = {}
    for square in (False, True):
        hooks = [("blocks.1.attn.hook_pattern", lambda t, hook, s=square: seen.__setitem__(s, t.clone()))]
        if square:
            hooks.append(("blocks.1.attn.hook_attn_scores", lambda t, hook: None))
        with torch.inference_mode():
            lens.run_with_hooks(xt, fwd_hooks=hooks, return_type=None)
    _close(seen[True], seen[False], f"{which}: pattern by query blocks")


def test_what_the_engine_refuses_goes_to_the_bridge(tmp_path):
    """A rotary scaling the engine does not implement: ``auto`` runs the bridge, ``posmech``
    is an error naming the reason."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=48,
                      max_position_embeddings=N, rope_scaling={"rope_type": "linear", "factor": 2.0}, **COMMON)
    _save(LlamaForCausalLM(cfg), tmp_path, 7)
    assert not isinstance(load_model(_man(tmp_path), "cpu", "float32", "raw"), lens_mod.Lens)
    with pytest.raises(PosmechError, match="rope_type 'linear'"):
        load_model(_man(tmp_path), "cpu", "float32", "raw", "posmech")


@pytest.mark.float32
@pytest.mark.parametrize("which", ["neox", "llama"])
def test_the_engines_rotary_tables_are_the_models(which, dirs):
    """``rotary_emb`` (what the positional kernels read) gives Hugging Face's own rotary
    ``cos``/``sin`` for any positions (GPT-NeoX: its partial rotary dimensions)."""
    from transformers import AutoModelForCausalLM

    from posmech.analyses.kernels import rotary_tables

    lens = load_model(_man(dirs[which]), "cpu", "float32", "raw", "posmech")
    hf = AutoModelForCausalLM.from_pretrained(dirs[which])
    emb = hf.gpt_neox.rotary_emb if which == "neox" else hf.model.rotary_emb
    pos = torch.arange(50)[None]
    with torch.inference_mode():
        ref = emb(torch.zeros(1, 50, 1), pos)
    cos, sin = rotary_tables(lens, 50)
    assert cos.shape == (50, lens.cfg.rotary_dim)
    assert np.abs(cos - ref[0][0].double().numpy()).max() < 1e-6
    assert np.abs(sin - ref[1][0].double().numpy()).max() < 1e-6
