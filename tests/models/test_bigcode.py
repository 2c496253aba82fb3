"""GPT-BigCode (StarCoder's layout: learned positions, multi-query attention) on the posmech
engine: its logits and attention patterns equal the Hugging Face forward's (eager), in both
processing modes, on the tiny random GPT-BigCode of tests/tiny_archs.py and on a multi-head
one (``multi_query`` false: the head-interleaved fused ``c_attn``); its one key head is
recorded as one (``hook_k``), as the bridge records it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from posmech.models.lens import Lens
from posmech.models.loading import load_model
from tests import tiny_archs
from tests.tolerances import FLOAT32_FORWARD_ABS, FLOAT32_FORWARD_REL


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
    from transformers import AutoModelForCausalLM

    x = torch.as_tensor(np.random.default_rng(0).integers(1, tiny_archs.V, size=(2, 24)))
    hf = AutoModelForCausalLM.from_pretrained(dirs[which], attn_implementation="eager").eval()
    with torch.no_grad():
        ref = hf(x, output_attentions=True)
    model = load_model({"hf_dir": str(dirs[which]), "name": which}, "cpu", "float32", processing)
    assert isinstance(model, Lens) and model.cfg.n_key_value_heads == (1 if which == "mq" else 4)
    got = {}
    hooks = [(f"blocks.{la}.attn.{n}", lambda t, hook: got.__setitem__(hook.name, t.detach().clone()))
             for la in range(model.cfg.n_layers) for n in ("hook_pattern", "hook_k")]
    with torch.inference_mode(), model.hooks(fwd_hooks=hooks):
        logits = model(x, return_type="logits")
    want = ref.logits - ref.logits.mean(-1, keepdim=True) if processing == "compatibility" else ref.logits
    assert float((logits - want).abs().max()) <= FLOAT32_FORWARD_REL * max(1.0, float(want.abs().max()))
    for la in range(model.cfg.n_layers):
        assert float((got[f"blocks.{la}.attn.hook_pattern"] - ref.attentions[la]).abs().max()) <= FLOAT32_FORWARD_ABS
        assert got[f"blocks.{la}.attn.hook_k"].shape[2] == (1 if which == "mq" else 4)
