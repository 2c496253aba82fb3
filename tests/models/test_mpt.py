"""MPT (ALiBi, fused ``Wqkv``, bias-free LayerNorms, exact-GELU MLP) on the posmech engine: its
logits and attention patterns equal the Hugging Face forward's (eager) in both processing
modes on the tiny random MPT of tests/tiny_archs.py, so the rules only the engine runs (the
L rules' token-only input, layer 0's K6-K10 and C1-C3) are scheduled for it; its ALiBi slopes
are its config's (MPT's ``alibi_bias_max`` layout, which differs from BLOOM's for a head count
that is not a power of two or a bias other than 8), on the engine and on the bridge alike; an
MPT whose attention clips q/k/v is refused from its config, before any job, with the reason."""

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
    for over, said in (({"attn_config": {**cfg["attn_config"], "clip_qkv": 6.0}}, "clip_qkv"),
                       ({"attn_config": {**cfg["attn_config"], "alibi": False}}, "without ALiBi")):
        odd = {**cfg, **over}
        assert said in unsupported_hf(odd), over
        if odd["attn_config"]["alibi"]:
            why = not_applicable(with_engine_refusal(architecture(odd), odd))
            assert said in why["random_token_patterns"] and said in why["bag_of_tokens_fit"], over



@pytest.fixture(scope="module")
def odd_mpt(tmp_path_factory):
    """A tiny random MPT with 6 heads (not a power of two) and ``alibi_bias_max`` 4."""
    import transformers

    cfg = transformers.MptConfig(d_model=36, n_layers=2, n_heads=6, expansion_ratio=2, max_seq_len=tiny_archs.N_CTX,
                                 attn_config={"alibi": True, "alibi_bias_max": 4}, **tiny_archs.COMMON)
    return tiny_archs._save(transformers.MptForCausalLM(cfg), tmp_path_factory.mktemp("mpt6") / "mpt6", 5)


@pytest.mark.float32
def test_an_mpt_of_any_head_count_runs_on_the_engine_with_bloom_s_slopes(odd_mpt):
    """MPT's slopes (transformers' build_mpt_alibi_tensor: the next power of two, odd-indexed
    slopes first) are BLOOM's for every head count (posmech.models.scores.alibi_slopes, which
    every analysis reads), and transformers builds them at alibi_bias_max 8 whatever the
    config says; so the engine runs an MPT of 6 heads with a bias max of 4 as Hugging Face's
    forward does (logits and patterns equal), where it used to refuse it."""
    import numpy as np
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    from posmech.models.scores import alibi_slopes

    for H in (3, 4, 6, 12, 20, 32):
        bias = build_mpt_alibi_tensor(H, 3)[:, 0, :].double().numpy()  # [H, T]: m_h (j - (T - 1))
        np.testing.assert_allclose(alibi_slopes(H), bias[:, 2] - bias[:, 1], rtol=1e-6)
    assert_engine_equals_hf(odd_mpt, "raw", 6)
