"""One attention scale: :func:`posmech.models.architecture.score_divisor` (the number ``q·k``
is divided by before the softmax, read from the model's config) is what the manifest's
architecture, the forward engine, the raw scores (score anatomy), the positional kernels'
layout and the layer-0 decomposition use, and it is Hugging Face's own: ``1 / scaling`` of
the model's attention module (``inv_norm_factor`` for BLOOM; GPT-Neo does not scale).
Random-init tiny models of each architecture (tests/tiny_archs.py)."""

from __future__ import annotations

import math

import pytest

from posmech.analyses import contextual as cx
from posmech.analyses import kernels as kn
from posmech.models.scores import attn_scale as anatomy_scale
from posmech.models.architecture import architecture, score_divisor
from posmech.models.lens import from_hf, hf_dir_reader, hf_state, tl_legacy_config
from tests import tiny_archs
from tests.tolerances import FLOAT64_REL


def hf_divisor(model) -> float:
    """``1 / scaling`` of layer 0's attention module, as Hugging Face runs it."""
    mt = model.config.model_type
    if mt == "gpt_neo":
        return 1.0  # GPTNeoSelfAttention multiplies q·k by nothing
    body = {"gpt2": lambda: model.transformer.h[0].attn, "opt": lambda: model.model.decoder.layers[0].self_attn,
            "gpt_neox": lambda: model.gpt_neox.layers[0].attention, "llama": lambda: model.model.layers[0].self_attn,
            "bloom": lambda: model.transformer.h[0].self_attention,
            "mpt": lambda: model.transformer.blocks[0].attn}[mt]()
    return 1.0 / float(getattr(body, "scaling", None) or getattr(body, "softmax_scale", None) or body.inv_norm_factor)


#: the tiny models the posmech engine runs (hf_state converts them); the others of
#: tiny_archs.BUILDERS run on the bridge, whose scale is Hugging Face's own
ENGINE = ("gpt2_one_layer", "gpt_neo", "opt", "neox", "llama", "bloom", "mpt")


@pytest.mark.parametrize("name", [n for n in sorted(tiny_archs.BUILDERS) if n in ENGINE])
def test_one_scale_everywhere_and_it_is_hugging_faces(tmp_path, name):
    from transformers import AutoModelForCausalLM

    d = tiny_archs.BUILDERS[name](tmp_path / name)
    model = AutoModelForCausalLM.from_pretrained(d).eval()
    cfg = model.config.to_dict()
    div = score_divisor(cfg)
    assert div == pytest.approx(hf_divisor(model), rel=FLOAT64_REL)  # Python floats
    assert architecture(cfg).attn_scale == 1.0 / div  # the manifest's factor
    get, _ = hf_dir_reader(d)
    assert hf_state(get, cfg)[1].attn_scale == div  # the engine's
    lens = from_hf(model, processing="raw")
    assert lens.cfg.attn_scale == div and anatomy_scale(lens.cfg) == div  # the raw scores'
    assert list(kn.attention_layout(cfg, 2, lens.cfg.d_head)[0]) == [div, div]  # the kernels'
    if cfg["model_type"] in ("gpt2", "gpt_neo", "opt"):
        assert cx.weights_from_hf(model, name).attn_scale == div  # the layer-0 decomposition's


def test_transformer_lens_and_special_configs():
    tl = {"d_model": 64, "n_layers": 2, "n_heads": 4, "d_head": 16, "n_ctx": 32}
    assert score_divisor(tl) == 4.0 == tl_legacy_config({**tl, "d_vocab": 10}).attn_scale
    assert score_divisor({**tl, "use_attn_scale": False}) == 1.0
    assert score_divisor({**tl, "attn_scale": 2.5}) == 2.5
    assert score_divisor({**tl, "attn_scale": -1.0}) == 4.0  # TransformerLens's "not set"
    assert score_divisor({"model_type": "gpt2", "n_embd": 32, "n_head": 4, "scale_attn_weights": False}) == 1.0
    assert score_divisor({"model_type": "gemma", "hidden_size": 32, "num_attention_heads": 4, "head_dim": 8,
                          "query_pre_attn_scalar": 256}) == 16.0
    assert score_divisor({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "head_dim": 32}) == (
        math.sqrt(32))
    # GPT-2's per-layer factor stays the kernels' layout's
    assert list(kn.attention_layout({"model_type": "gpt2", "scale_attn_by_inverse_layer_idx": True}, 3, 16)[0]) == [
        4.0, 8.0, 12.0]
