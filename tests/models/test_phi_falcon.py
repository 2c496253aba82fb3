"""Phi and Falcon on the posmech engine (issue 44): their logits and every layer's attention
pattern equal the Hugging Face forward's (eager), in both processing modes, and ``engine:
auto`` picks posmech for them (``posmech.models.loading.engine_words``).

Phi (1/1.5/2's layout): partial rotary (``partial_rotary_factor`` 0.5, halves pairing), q/k/v
with biases, one LayerNorm read by attention and MLP in parallel, a biased ``lm_head``; the
tiny Phi of tests/tiny_archs.py and one with grouped key/value heads. Falcon (7B's layout):
full rotary, a fused ``query_key_value``, one LayerNorm in parallel; the tiny multi-query
Falcon of tests/tiny_archs.py and a multi-head one (``multi_query`` false: per-head fused
q, k, v) with biases. The variants the engine does not run are refused with the reason.
"""

from __future__ import annotations

import pytest

from posmech.models import lens
from posmech.models.loading import load_model
from tests import tiny_archs
from tests.models.hf_forward import assert_engine_equals_hf
from tests.tolerances import FLOAT32_FORWARD_REL

#: ``name: (architecture of tiny_archs, config keys changed, key/value heads)``
MODELS = {
    "phi": ("phi", {}, 4),
    "phi_gqa": ("phi", {"num_key_value_heads": 2}, 2),
    "falcon": ("falcon", {}, 1),
    "falcon_mh": ("falcon", {"multi_query": False, "bias": True}, 4),
}


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    import transformers

    root = tmp_path_factory.mktemp("phi_falcon")
    out = {}
    for name, (arch, keys, _) in MODELS.items():
        config, model, seed, _, base = tiny_archs.ARCHS[arch]
        made = getattr(transformers, model)(getattr(transformers, config)(**{**base, **keys, **tiny_archs.COMMON}))
        out[name] = tiny_archs._save(made, root / name, seed)
    return out


@pytest.mark.float32
@pytest.mark.parametrize("processing", ["raw", "compatibility"])
@pytest.mark.parametrize("which", list(MODELS))
def test_engine_logits_and_patterns_equal_hugging_faces(dirs, which, processing):
    model = assert_engine_equals_hf(dirs[which], processing, MODELS[which][2])  # engine: auto picks posmech
    assert model.cfg.parallel_attn_mlp and model.cfg.positional_embedding_type == "rotary"
    assert model.cfg.rotary_dim == (4 if which.startswith("phi") else 8)  # d_head 8: half of it for Phi


def test_variants_the_engine_does_not_run_are_refused_with_their_reason(dirs):
    import json

    phi = json.loads((dirs["phi"] / "config.json").read_text())
    falcon = json.loads((dirs["falcon"] / "config.json").read_text())
    assert lens.unsupported_hf(phi) is None and lens.unsupported_hf(falcon) is None
    assert "qk_layernorm" in lens.unsupported_hf({**phi, "qk_layernorm": True})
    for change in ({"new_decoder_architecture": True}, {"alibi": True}, {"parallel_attn": False}):
        assert "new_decoder_architecture, alibi or parallel_attn false" in lens.unsupported_hf({**falcon, **change})
    scaled = {**phi, "rope_parameters": {**phi["rope_parameters"], "rope_type": "linear", "factor": 2.0}}
    assert "rope_type 'linear'" in lens.unsupported_hf(scaled)


@pytest.mark.float32
@pytest.mark.parametrize("processing", ["raw", "compatibility"])
def test_the_one_layernorm_is_computed_once_and_both_hooks_still_see_it(dirs, processing):
    """Phi's and Falcon's attention and MLP read one LayerNorm (``cfg.shared_ln``), computed once
    unless a hook is on ``ln1``/``ln2``: then both run, ``ln2`` sees what ``ln1`` gives, and a
    hook that replaces ``ln2``'s output changes the MLP's input only (layer 0's pattern stays)."""
    import numpy as np
    import torch

    x = torch.as_tensor(np.random.default_rng(1).integers(1, tiny_archs.V, size=(1, 16)))
    for which in ("phi", "falcon"):
        model = load_model({"hf_dir": str(dirs[which]), "name": which}, "cpu", "float32", processing)
        assert model.cfg.shared_ln
        got = {}
        keep = lambda t, hook: got.__setitem__(hook.name, t.clone())  # noqa: E731
        with torch.inference_mode():
            plain = model(x)
            with model.hooks(fwd_hooks=[("blocks.0.ln1.hook_out", keep), ("blocks.0.ln2.hook_out", keep),
                                        ("blocks.0.attn.hook_pattern", keep)]):
                read = model(x)
            # equal to rounding (the hooked pattern makes layer 0's attention explicit, not fused)
            assert float((read - plain).abs().max()) <= FLOAT32_FORWARD_REL * max(1.0, float(plain.abs().max())), which
            assert torch.equal(got["blocks.0.ln2.hook_out"], got["blocks.0.ln1.hook_out"]), which
            pattern = got.pop("blocks.0.attn.hook_pattern")
            with model.hooks(fwd_hooks=[("blocks.0.ln2.hook_out", lambda t, hook: torch.zeros_like(t)),
                                        ("blocks.0.attn.hook_pattern", keep)]):
                zeroed = model(x)
            assert torch.equal(got["blocks.0.attn.hook_pattern"], pattern), which
            assert float((zeroed - plain).abs().max()) > 1e-3, which
