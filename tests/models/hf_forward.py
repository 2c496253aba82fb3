"""The posmech engine against the Hugging Face forward (eager) of a saved model: its logits and
every layer's attention pattern, for the per-family engine tests (test_bigcode.py,
test_phi_falcon.py, test_gemma.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from posmech.models.lens import Lens
from posmech.models.loading import engine_words, load_model
from tests import tiny_archs
from tests.tolerances import FLOAT32_FORWARD_ABS, FLOAT32_FORWARD_REL


def assert_engine_equals_hf(d: Path, processing: str, n_kv_heads: int) -> Any:
    """Load ``d`` with ``engine: auto`` (it must be the posmech engine, as ``engine_words`` says, with ``n_kv_heads`` key
    heads recorded as such by ``hook_k``) and compare a ``[2, 24]`` batch's logits (centred over
    the vocabulary in the compatibility mode, as its unembedding is, unless soft-capped) and patterns with Hugging
    Face's. Returns the engine's model."""
    from transformers import AutoModelForCausalLM

    assert engine_words({"hf_dir": str(d)}, processing).startswith("posmech (")  # engine: auto picks it
    x = torch.as_tensor(np.random.default_rng(0).integers(1, tiny_archs.V, size=(2, 24)))
    hf = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager").eval()
    with torch.no_grad():
        ref = hf(x, output_attentions=True)
    model = load_model({"hf_dir": str(d), "name": Path(d).name}, "cpu", "float32", processing)
    assert isinstance(model, Lens) and model.cfg.n_key_value_heads == n_kv_heads
    got = {}
    hooks = [(f"blocks.{la}.attn.{n}", lambda t, hook: got.__setitem__(hook.name, t.detach().clone()))
             for la in range(model.cfg.n_layers) for n in ("hook_pattern", "hook_k")]
    with torch.inference_mode(), model.hooks(fwd_hooks=hooks):
        logits = model(x, return_type="logits")
    # soft-capped logits (Gemma 2) are not centred: a constant added before the cap changes them
    centred = processing == "compatibility" and model.cfg.output_logits_soft_cap <= 0
    want = ref.logits - ref.logits.mean(-1, keepdim=True) if centred else ref.logits
    assert float((logits - want).abs().max()) <= FLOAT32_FORWARD_REL * max(1.0, float(want.abs().max()))
    for la in range(model.cfg.n_layers):
        assert float((got[f"blocks.{la}.attn.hook_pattern"] - ref.attentions[la]).abs().max()) <= FLOAT32_FORWARD_ABS
        assert got[f"blocks.{la}.attn.hook_k"].shape[2] == n_kv_heads
    return model
