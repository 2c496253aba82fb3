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
