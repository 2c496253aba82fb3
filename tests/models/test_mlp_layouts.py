"""posmech.models.mlp_layouts against the Hugging Face forward: for a random-init tiny model
(2 layers) of each family, layer 0's block recomputed from the checkpoint's own weights (read
from its saved safetensors files), its input residual and its attention pattern equals what
the Hugging Face modules compute: the neurons' pre-activation (the gate's for a gated MLP),
the up projection, the activation the down projection reads, and the block's output."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from posmech.models import mlp_layouts as ml
from tests.tolerances import FLOAT32_FORWARD_REL

V, D, H, M, T = 96, 32, 4, 64, 12
COMMON = {"vocab_size": V, "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0}


def _configs():
    import transformers as tf

    small = dict(hidden_size=D, num_hidden_layers=2, num_attention_heads=H, intermediate_size=M,
                 max_position_embeddings=32, **COMMON)
    return {
        # name: (config, layer-0 block path, MLP module paths (in / gate, up), down projection, gated, parallel)
        "gpt2": (tf.GPT2Config(n_embd=D, n_layer=2, n_head=H, n_inner=M, n_positions=32, **COMMON),
                 "transformer.h.0", ("mlp.c_fc",), "mlp.c_proj", False, False),
        # GPT-2's names with nn.Linear weights: multi-query (one key and value head) and multi-head
        "gpt_bigcode": (tf.GPTBigCodeConfig(n_embd=D, n_layer=2, n_head=H, n_inner=M, n_positions=32, **COMMON),
                        "transformer.h.0", ("mlp.c_fc",), "mlp.c_proj", False, False),
        "gpt_bigcode_mh": (tf.GPTBigCodeConfig(n_embd=D, n_layer=2, n_head=H, n_inner=M, n_positions=32,
                                               multi_query=False, **COMMON),
                           "transformer.h.0", ("mlp.c_fc",), "mlp.c_proj", False, False),
        "gpt_neo": (tf.GPTNeoConfig(hidden_size=D, num_layers=2, num_heads=H, intermediate_size=M,
                                    max_position_embeddings=32, attention_types=[[["global", "local"], 1]],
                                    window_size=8, **COMMON),
                    "transformer.h.0", ("mlp.c_fc",), "mlp.c_proj", False, False),
        "opt": (tf.OPTConfig(hidden_size=D, num_hidden_layers=2, num_attention_heads=H, ffn_dim=M,
                             max_position_embeddings=32, word_embed_proj_dim=D, **COMMON),
                "model.decoder.layers.0", ("fc1",), "fc2", False, False),
        "gptj": (tf.GPTJConfig(n_embd=D, n_layer=2, n_head=H, n_inner=M, rotary_dim=4, n_positions=32, **COMMON),
                 "transformer.h.0", ("mlp.fc_in",), "mlp.fc_out", False, True),
        "gpt_neox": (tf.GPTNeoXConfig(rotary_pct=0.5, **small), "gpt_neox.layers.0", ("mlp.dense_h_to_4h",),
                     "mlp.dense_4h_to_h", False, True),
        "gpt_neox_sequential": (tf.GPTNeoXConfig(rotary_pct=0.5, use_parallel_residual=False, **small),
                                "gpt_neox.layers.0", ("mlp.dense_h_to_4h",), "mlp.dense_4h_to_h", False, False),
        "llama": (tf.LlamaConfig(num_key_value_heads=2, **small), "model.layers.0",
                  ("mlp.gate_proj", "mlp.up_proj"), "mlp.down_proj", True, False),
        "qwen2": (tf.Qwen2Config(num_key_value_heads=2, **small), "model.layers.0",
                  ("mlp.gate_proj", "mlp.up_proj"), "mlp.down_proj", True, False),
        "mistral": (tf.MistralConfig(num_key_value_heads=1, **small), "model.layers.0",
                    ("mlp.gate_proj", "mlp.up_proj"), "mlp.down_proj", True, False),
        "gemma": (tf.GemmaConfig(num_key_value_heads=1, head_dim=16, **small), "model.layers.0",
                  ("mlp.gate_proj", "mlp.up_proj"), "mlp.down_proj", True, False),
        "gemma2": (tf.Gemma2Config(num_key_value_heads=2, head_dim=8, **small), "model.layers.0",
                   ("mlp.gate_proj", "mlp.up_proj"), "mlp.down_proj", True, False),
        "phi": (tf.PhiConfig(partial_rotary_factor=0.5, **small), "model.layers.0", ("mlp.fc1",), "mlp.fc2",
                False, True),
        "falcon": (tf.FalconConfig(hidden_size=D, num_hidden_layers=2, num_attention_heads=H, **COMMON),
                   "transformer.h.0", ("mlp.dense_h_to_4h",), "mlp.dense_4h_to_h", False, True),
        "falcon_new": (tf.FalconConfig(hidden_size=D, num_hidden_layers=2, num_attention_heads=H, num_kv_heads=2,
                                       new_decoder_architecture=True, bias=True, **COMMON),
                       "transformer.h.0", ("mlp.dense_h_to_4h",), "mlp.dense_4h_to_h", False, True),
        "falcon_sequential": (tf.FalconConfig(hidden_size=D, num_hidden_layers=2, num_attention_heads=H,
                                              parallel_attn=False, alibi=True, multi_query=False, **COMMON),
                              "transformer.h.0", ("mlp.dense_h_to_4h",), "mlp.dense_4h_to_h", False, False),
        "bloom": (tf.BloomConfig(hidden_size=D, n_layer=2, n_head=H, **COMMON), "transformer.h.0",
                  ("mlp.dense_h_to_4h",), "mlp.dense_4h_to_h", False, False),
        "mpt": (tf.MptConfig(d_model=D, n_layers=2, n_heads=H, expansion_ratio=2, max_seq_len=32, **COMMON),
                "transformer.blocks.0", ("ffn.up_proj",), "ffn.down_proj", False, False),
    }


FAMILIES = ["gpt2", "gpt_bigcode", "gpt_bigcode_mh", "gpt_neo", "opt", "gptj", "gpt_neox", "gpt_neox_sequential", "llama", "qwen2", "mistral",
            "gemma", "gemma2", "phi", "falcon", "falcon_new", "falcon_sequential", "bloom", "mpt"]


def _build(name: str, d: Path):
    import torch
    from transformers import AutoModelForCausalLM

    cfg, *rest = _configs()[name]
    cfg._attn_implementation = "eager"
    torch.manual_seed(sum(map(ord, name)))
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():  # non-trivial norms and biases: every weight random
        for _, p in model.named_parameters():
            p.copy_((0.3 if p.ndim >= 2 else 0.2) * torch.randn(p.shape, generator=g))
    model.save_pretrained(d, safe_serialization=True)
    return model, rest


def _hooked_forward(model, block_path, ins, down, ids):
    import torch

    got: dict[str, np.ndarray] = {}
    rows = lambda t: t.reshape(-1, t.shape[-1]).double().numpy()  # noqa: E731  batch of one; OPT's MLP sees [B·T, d]
    block = model.get_submodule(block_path)
    handles = []

    def pre_hook(_m, args, kwargs):
        x = args[0] if args else kwargs["hidden_states"]
        got["resid"] = rows(x)

    def out_hook(_m, _a, out):
        got["resid_post"] = rows(out[0] if isinstance(out, tuple) else out)

    handles.append(block.register_forward_pre_hook(pre_hook, with_kwargs=True))
    handles.append(block.register_forward_hook(out_hook))
    for key, path in zip(("pre", "linear"), ins):
        handles.append(block.get_submodule(path).register_forward_hook(
            lambda _m, _a, out, key=key: got.__setitem__(key, rows(out))))
    handles.append(block.get_submodule(down).register_forward_pre_hook(
        lambda _m, args: got.__setitem__("post", rows(args[0]))))
    try:
        with torch.no_grad():
            out = model(torch.as_tensor(ids)[None], output_attentions=True)
    finally:
        for h in handles:
            h.remove()
    got["patterns"] = out.attentions[0][0].double().numpy()
    return got


@pytest.mark.float32
@pytest.mark.parametrize("family", FAMILIES)
def test_block_from_the_weights_is_the_hugging_face_forward(family, tmp_path):
    from posmech.models.lens import hf_dir_reader

    model, (block_path, ins, down, gated, parallel) = _build(family, tmp_path)
    ids = np.random.default_rng(0).integers(1, V, T)
    hf = _hooked_forward(model, block_path, ins, down, ids)
    get, cfg = hf_dir_reader(tmp_path, framework="numpy")
    assert ml.layout_problem(get.names, cfg) is None
    blk = ml.read_block(get, get.names, cfg)
    assert blk.parallel is parallel and blk.mlp is not None and blk.mlp.gated is gated
    ours = blk.forward(hf["resid"], hf["patterns"])
    keys = ["pre", "post", "resid_post"] + (["linear"] if gated else [])
    for k in keys:  # float32 forward values of order a few: FLOAT32_FORWARD_REL of their largest magnitude
        tol = FLOAT32_FORWARD_REL * max(1.0, float(np.abs(hf[k]).max()))
        np.testing.assert_allclose(ours[k], hf[k], atol=tol, rtol=0, err_msg=f"{family}: {k}")
    # the neurons vary along the text, so the comparison is not between constants
    assert np.ptp(hf["pre"], axis=0).min() > 1e-3


def test_parallel_mlp_reads_the_block_input_not_the_attention_output(tmp_path):
    """GPT-J's layer-0 MLP reads LN(resid_pre): the attention output does not change it."""
    from posmech.models.lens import hf_dir_reader

    _build("gptj", tmp_path)
    get, cfg = hf_dir_reader(tmp_path, framework="numpy")
    blk = ml.read_block(get, get.names, cfg)
    r = np.random.default_rng(1).normal(size=(T, D))
    A1 = np.tril(np.ones((H, T, T))) / np.arange(1, T + 1)[:, None]
    A2 = np.broadcast_to(np.eye(T), (H, T, T))
    a, b = blk.forward(r, A1), blk.forward(r, A2)
    np.testing.assert_array_equal(a["pre"], b["pre"])
    assert not np.allclose(a["resid_post"], b["resid_post"])
    np.testing.assert_allclose(a["mlp_in"], blk.ln1(r), rtol=0, atol=1e-12)


def test_unreadable_layouts_say_why(tmp_path):
    names = frozenset({"model.layers.0.self_attn.qkv_proj.weight", "model.layers.0.mlp.gate_up_proj.weight"})
    why = ml.layout_problem(names, {"model_type": "phi3"})
    assert why is not None and "no layout posmech reads" in why
    with pytest.raises(ml.LayoutError, match="no layout"):
        ml.read_block(lambda n: None, names, {})
    opt = frozenset({"model.decoder.layers.0.self_attn.v_proj.weight"})
    assert "post-LayerNorm" in ml.layout_problem(opt, {"do_layer_norm_before": False, "activation_function": "relu"})
    llama = frozenset({"model.layers.0.self_attn.v_proj.weight", "model.layers.0.mlp.gate_up_proj.weight"})
    assert "gate_up_proj" in ml.layout_problem(llama, {"hidden_act": "silu"})
    bigcode = {"h.0.attn.c_attn.weight": np.zeros((D, D + 2 * 8)), "h.0.attn.c_attn.bias": np.zeros(D + 2 * 8),
               "h.0.ln_1.weight": np.ones(D), "h.0.ln_2.weight": np.ones(D)}
    with pytest.raises(ml.LayoutError, match="multi-query"):
        ml.read_block(bigcode.get, frozenset(bigcode), {"n_embd": D, "n_head": H, "activation_function": "gelu"})
    assert "activation" in ml.layout_problem(llama - {"model.layers.0.mlp.gate_up_proj.weight"},
                                             {"hidden_act": "mish"})


@pytest.mark.parametrize("family", FAMILIES)
def test_block_kind_from_names_and_config_alone(family, tmp_path):
    """What the block is (parallel or sequential, gated or plain MLP, RMSNorm or LayerNorm) is
    told from the parameter names and config.json without reading a tensor, and agrees with
    the Hugging Face modules the test hooks."""
    from posmech.models.lens import hf_dir_reader

    _, (_, _, _, gated, parallel) = _build(family, tmp_path)
    get, cfg = hf_dir_reader(tmp_path, framework="numpy")
    kind = ml.block_kind(get.names, cfg)
    rms = family in ("llama", "qwen2", "mistral", "gemma", "gemma2")
    assert (kind["block"], kind["mlp"], kind["norm"]) == ("parallel" if parallel else "sequential",
                                                         "gated" if gated else "plain", "rms" if rms else "layer")
    assert kind["attention_output_norm"] is (family == "gemma2")
