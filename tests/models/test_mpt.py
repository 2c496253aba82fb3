"""MPT (ALiBi, fused ``Wqkv``, bias-free LayerNorms, exact-GELU MLP) on the posmech engine: its
logits and attention patterns equal the Hugging Face forward's (eager) in both processing
modes on the tiny random MPT of tests/tiny_archs.py, so the rules only the engine runs (the
L rules' token-only input, layer 0's K6-K10 and C1-C3) are scheduled for it; an MPT whose
ALiBi slopes are not BLOOM's (a head count that is not a power of two), or whose attention
clips q/k/v, is refused from its config, before any job, with the reason."""

from __future__ import annotations

import json

import pytest

from posmech.models.architecture import architecture
from posmech.models.lens import unsupported_hf, with_engine_refusal
from posmech.pipeline.applicability import not_applicable
from tests import tiny_archs
from tests.models.hf_forward import assert_engine_equals_hf


@pytest.fixture(scope="module")
def mpt(tmp_path_factory):
    return tiny_archs.BUILDERS["mpt"](tmp_path_factory.mktemp("mpt") / "mpt")


@pytest.mark.float32
@pytest.mark.parametrize("processing", ["raw", "compatibility"])
def test_engine_logits_and_patterns_equal_hugging_faces(mpt, processing):
    assert_engine_equals_hf(mpt, processing, 4)


def test_what_the_engine_does_not_compute_is_refused_before_any_job(mpt):
    cfg = json.loads((mpt / "config.json").read_text())
    assert unsupported_hf(cfg) is None
    runs = not_applicable(with_engine_refusal(architecture(cfg), cfg))
    assert not {"random_token_patterns", "layer0_decomposition", "contextual_neurons"} & set(runs), runs
    for over, said in (({"n_heads": 6, "d_model": 36}, "not a power of two"),
                       ({"attn_config": {**cfg["attn_config"], "clip_qkv": 6.0}}, "clip_qkv"),
                       ({"attn_config": {**cfg["attn_config"], "alibi": False}}, "without ALiBi")):
        odd = {**cfg, **over}
        assert said in unsupported_hf(odd), over
        if odd["attn_config"]["alibi"]:
            why = not_applicable(with_engine_refusal(architecture(odd), odd))
            assert said in why["random_token_patterns"] and said in why["bag_of_tokens_fit"], over
