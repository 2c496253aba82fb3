"""posmech.models.training: data mix, the attention-only model and its legacy-checkpoint round
trip, and the head scores on hand-built models whose answer is known."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from posmech.models import handbuilt as hb
from posmech.core.errors import PosmechError
from posmech.models.architecture import read_architecture, train_architecture
from posmech.models.loading import load_bridge, prepare_local_model
from posmech.models.training import (
    AttnOnly,
    _Runner,
    _build_model,
    _save,
    build_char_tokenizer,
    diagonal_scores,
    encode_chars,
    induction_scores,
    llama_mlp_width,
    mixed_batch,
    repeat_batch,
    train_demo_model,
)

from tests.tolerances import FLOAT32_FORWARD_ABS


def test_repeat_batch_repeats_a_bos_free_segment():
    x = repeat_batch(np.random.default_rng(0), 5, 20, 6, 30)
    assert x.shape == (5, 20) and (x[:, 0] == 0).all() and (x[:, 1:] > 0).all() and (x < 30).all()
    np.testing.assert_array_equal(x[:, 1:7], x[:, 7:13])
    np.testing.assert_array_equal(x[:, 1:8], x[:, 13:20])
    with pytest.raises(PosmechError, match="n_ctx"):
        repeat_batch(np.random.default_rng(0), 1, 8, 8, 30)


def test_mixed_batch_fraction_and_text_windows():
    ids = np.arange(1, 200, dtype=np.int64)
    cfg = {"batch_size": 8, "n_ctx": 16, "repeat_fraction": 0.25, "repeat_min_length": 3, "repeat_max_length": 5}
    x = mixed_batch(ids, np.random.default_rng(1), cfg, 40)
    assert x.shape == (8, 16) and (x[:, 0] == 0).all()
    text = [r for r in x if (np.diff(r[1:]) == 1).all()]  # windows of 1, 2, 3, ... are consecutive
    assert len(text) == 6
    for r in x[:2]:  # the repeated rows come first; period 3..5
        assert any((r[1 + p :] == r[1 : 16 - p]).all() for p in (3, 4, 5))
    bad = dict(cfg, repeat_min_length=9, repeat_max_length=5)
    with pytest.raises(PosmechError, match="repeat_min_length"):
        mixed_batch(ids, np.random.default_rng(1), bad, 40)


def _hf_runner(scores):
    spec = hb.positional_spec(n_ctx=16, n_layer=1, n_head=2, scores=scores)
    model = hb.to_hf(spec)
    model.config._attn_implementation = "eager"
    return _Runner(model.eval(), "gpt2")


def test_encode_chars_equals_the_tokenizer_unknown_and_special_tokens_included():
    tok = build_char_tokenizer(["In the beginning ", "é\u2019ß\n"])
    for text in ["In the beginning\né\u2019ß", "unknown: Zq\u00a0\U0001f600!", "a<|endoftext|>b", "", "IIII"]:
        want = np.asarray(tok(text).input_ids, dtype=np.int64)
        got = encode_chars(tok, text)
        assert got.dtype == np.int64 and got.tolist() == want.tolist(), text
    unk = tok.get_vocab()["<|unk|>"]
    assert (encode_chars(tok, "Zq") == unk).all()  # each unknown character is one unknown token


@pytest.mark.float32
def test_diagonal_scores_of_an_exact_previous_token_head_and_a_uniform_head():
    """Head 1 attends to n-1 (planted scores), head 0 has zero scores: uniform over
    0..n, so its mean attention to n-1 over queries 1..15 is mean(1/(n+1))."""
    run = _hf_runner({(0, 1): hb.previous_token_scores(16)})
    x = [torch.zeros(2, 16, dtype=torch.long)]
    prev = diagonal_scores(run, x, 1)
    assert prev[0, 1] > 0.999
    np.testing.assert_allclose(prev[0, 0], np.mean([1 / (n + 1) for n in range(1, 16)]), rtol=1e-6)
    two = diagonal_scores(run, x, 2)
    np.testing.assert_allclose(two[0, 0], np.mean([1 / (n + 1) for n in range(2, 16)]), rtol=1e-6)
    assert two[0, 1] < 1e-3


@pytest.mark.float32
def test_induction_score_of_a_planted_induction_pattern():
    """A head whose planted scores attend from the second copy's queries to key
    n - length + 1 has induction score 1; the uniform head has the analytic mean."""
    n, length = 15, 7
    S = np.zeros((16, 16))
    for q in range(1 + length, 1 + 2 * length):
        S[q, q - length + 1] = 40.0
    run = _hf_runner({(0, 1): S})
    x = torch.from_numpy(repeat_batch(np.random.default_rng(0), 3, n, length, 40))
    ind, p_second, p_first = induction_scores(run, x, length)
    assert ind[0, 1] > 0.999
    q = np.arange(1 + length, 1 + 2 * length)
    np.testing.assert_allclose(ind[0, 0], np.mean(1 / (q + 1)), rtol=1e-6)
    assert 0 <= p_first <= 1 and 0 <= p_second <= 1


@pytest.mark.float32
def test_attn_only_checkpoint_loads_through_the_legacy_path_with_equal_logits(tmp_path):
    """The trained attention-only model is saved as a legacy TransformerLens directory
    (attn-only-2l's format); load_bridge's native boot reproduces its logits and patterns."""
    tok = build_char_tokenizer(["abcdefghij klmno"])
    V = len(tok)
    model = AttnOnly.build(V, 12, 16, 2, 2, 8, seed=3)
    with torch.no_grad():  # move off the init so biases and LN weights matter
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    _save(model, tok, {"architecture": "attn_only"}, tmp_path / "hf")
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert cfg["attn_only"] and "model_type" not in cfg and cfg["positional_embedding_type"] == "standard"
    man = prepare_local_model("demo-attn", {"source": str(tmp_path / "hf")}, tmp_path / "man")
    bridge = load_bridge(man, device="cpu", processing="raw")
    x = torch.tensor([[0, 3, 5, 7, 3, 5, 7, 2, 9]])
    with torch.inference_mode():
        pats: list = []
        mine = model(x, patterns=pats)
        theirs, cache = bridge.run_with_cache(x)
    np.testing.assert_allclose(theirs.numpy(), mine.numpy(), atol=1e-4)
    for layer in range(2):
        np.testing.assert_allclose(cache[f"blocks.{layer}.attn.hook_pattern"].numpy(), pats[layer].numpy(), atol=1e-5)


@pytest.mark.float32
def test_attn_only_head_ablation_zeroes_the_head_output():
    model = AttnOnly.build(10, 8, 8, 1, 2, 4, seed=0)
    x = torch.tensor([[0, 1, 2, 3]])
    with torch.inference_mode():
        base = model(x)
        both = model(x, ablate={(0, 0), (0, 1)})
        P = model.params
        h = P["embed__W_E"][x] + P["pos_embed__W_pos"][:4] + P["blocks__0__attn__b_O"]
        h = h - h.mean(-1, keepdim=True)
        h = h / (h.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt() * P["ln_final__w"] + P["ln_final__b"]
        ref = h @ P["unembed__W_U"] + P["unembed__b_U"]
    np.testing.assert_allclose(both.numpy(), ref.numpy(), atol=FLOAT32_FORWARD_ABS)
    assert not torch.allclose(base, both)


@pytest.mark.parametrize("arch", ["gpt2", "attn_only", "llama"])
def test_tiny_training_run_is_deterministic_and_writes_the_summary(tmp_path, arch):
    rng = np.random.default_rng(0)
    docs = [{"text": "".join(rng.choice(list("abcdefgh "), 80))} for _ in range(10)]
    cfg = {"corpus": "c", "architecture": arch, "n_layer": 2, "n_head": 2, "d_model": 16, "n_ctx": 16,
           "steps": 6, "batch_size": 4, "warmup_steps": 2, "heldout_every": 5, "eval_every": 3,
           "eval_batches": 1, "repeat_fraction": 0.5, "induction_samples": 4, "threads": 1}
    a = train_demo_model(docs, cfg, tmp_path / "a", "m")
    b = train_demo_model(docs, cfg, tmp_path / "b", "m")
    sa, sb = a["summary"], b["summary"]
    assert sa["induction_scores"] == sb["induction_scores"] and sa["heldout_loss"] == sb["heldout_loss"]
    assert len(sa["previous_token_scores"]) == 2 and len(sa["previous_token_scores"][0]) == 2
    assert sa["induction_length"] == 7 and sa["best_induction_head"].startswith("L1")
    assert sa["induction_reads_head"].startswith("L0")
    assert (tmp_path / "a" / "manifest.json").is_file()
    # what the check before any job knows of the model from its train section is what was saved
    # the same facts; where each was read from differs (the config before training, the weights after)
    from dataclasses import replace

    assert replace(train_architecture(cfg), sources={}) == replace(read_architecture(tmp_path / "a" / "hf"), sources={})
    with pytest.raises(PosmechError, match="induction_length"):
        train_demo_model(docs, dict(cfg, induction_length=9), tmp_path / "c", "m")


@pytest.mark.parametrize("arch, out_proj", [("gpt2", "transformer.h.{}.attn.c_proj.weight"),
                                            ("llama", "model.layers.{}.self_attn.o_proj.weight")])
def test_silent_attention_layer_writes_nothing_until_released(arch, out_proj, tmp_path):
    """GPT-2 (demo) and Llama (demo-rope): layer 0's attention output projection is zero and
    frozen, then learns from step silent_attention_steps on."""
    rng = np.random.default_rng(1)
    docs = [{"text": "".join(rng.choice(list("abcdefgh "), 80))} for _ in range(10)]
    cfg = {"corpus": "c", "architecture": arch, "n_layer": 2, "n_head": 2, "d_model": 16, "n_ctx": 16, "steps": 4,
           "batch_size": 4, "warmup_steps": 1, "heldout_every": 5, "eval_every": 4, "eval_batches": 1,
           "repeat_fraction": 0.5, "induction_samples": 4, "threads": 1, "silent_attention_layers": [0]}
    from safetensors.torch import load_file

    train_demo_model(docs, cfg, tmp_path / "a", "m")
    w = load_file(str(tmp_path / "a" / "hf" / "model.safetensors"))
    assert float(w[out_proj.format(0)].abs().max()) == 0.0
    assert float(w[out_proj.format(1)].abs().max()) > 0.0
    train_demo_model(docs, dict(cfg, silent_attention_steps=2), tmp_path / "b", "m")
    w = load_file(str(tmp_path / "b" / "hf" / "model.safetensors"))
    assert float(w[out_proj.format(0)].abs().max()) > 0.0
    with pytest.raises(PosmechError, match="silent_attention_layers"):
        train_demo_model(docs, dict(cfg, architecture="attn_only"), tmp_path / "c", "m")
    with pytest.raises(PosmechError, match="silent_attention_layers"):
        train_demo_model(docs, dict(cfg, silent_attention_layers=[2]), tmp_path / "c", "m")


def _tiny_llama(tok, seed=3):
    cfg = {"architecture": "llama", "n_layer": 2, "n_head": 2, "d_model": 16, "n_ctx": 12, "seed": seed,
           "silent_attention_layers": []}
    model = _build_model(cfg, len(tok))
    with torch.no_grad():  # move off the init so RMSNorm weights matter
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    return model.eval()


@pytest.mark.float32
def test_llama_demo_architecture_is_a_rotary_hf_directory_the_bridge_reproduces(tmp_path):
    """The `llama` architecture is saved as a Hugging Face Llama directory (rotary, RMSNorm,
    SwiGLU, no positional embedding weights): it is read as any user's rotary model, and the
    bridge reproduces its logits and patterns exactly in the raw mode and to float32 rounding
    in the compatibility mode (log-probabilities: the compatibility mode centres the
    unembedding, which shifts each position's logits by a constant)."""
    from safetensors.torch import load_file

    tok = build_char_tokenizer(["abcdefghij klmno"])
    model = _tiny_llama(tok)
    _save(model, tok, {"architecture": "llama"}, tmp_path / "hf")
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["intermediate_size"] == llama_mlp_width(16) == 48
    arch = read_architecture(tmp_path / "hf")
    assert (arch.positions, arch.rotary_fraction, arch.context, arch.n_kv_heads) == ("rotary", 1.0, 12, 2)
    names = set(load_file(str(tmp_path / "hf" / "model.safetensors")))
    # the token embedding (tied to the unembedding), RMSNorm weights, q/k/v/o and SwiGLU's three
    # matrices: no positional embedding, no bias
    per_layer = {"input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
                 "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}
    assert names == {"model.embed_tokens.weight", "model.norm.weight"} | {
        f"model.layers.{i}.{m}.weight" for i in range(2) for m in per_layer}
    man = prepare_local_model("demo-rope", {"source": str(tmp_path / "hf")}, tmp_path / "man")
    x = torch.tensor([[0, 3, 5, 7, 3, 5, 7, 2, 9]])
    with torch.inference_mode():
        mine = model(x, output_attentions=True)
        for processing, atol in (("raw", 0.0), ("compatibility", 1e-5)):
            theirs, cache = load_bridge(man, device="cpu", processing=processing).run_with_cache(x)
            np.testing.assert_allclose(theirs.log_softmax(-1).numpy(), mine.logits.log_softmax(-1).numpy(), atol=atol)
            for layer in range(2):
                np.testing.assert_allclose(cache[f"blocks.{layer}.attn.hook_pattern"].numpy(),
                                           mine.attentions[layer].numpy(), atol=atol)


@pytest.mark.float32
def test_llama_head_ablation_zeroes_the_head_output():
    """Ablating a head of the `llama` architecture zeroes its slice of o_proj's input: ablating
    every head of a layer equals that layer's o_proj set to zero; one head changes the logits."""
    tok = build_char_tokenizer(["abcdefghij klmno"])
    model = _tiny_llama(tok)
    run = _Runner(model, "llama")
    x = torch.tensor([[0, 3, 5, 7, 3, 5, 7, 2, 9]])
    with torch.inference_mode():
        base, pats = run.run(x)
        one, _ = run.run(x, ablate={(1, 0)})
        both, _ = run.run(x, ablate={(1, 0), (1, 1)})
        model.model.layers[1].self_attn.o_proj.weight.zero_()
        ref = model(x).logits
    assert len(pats) == 2 and pats[0].shape == (1, 2, 9, 9)
    np.testing.assert_allclose(both.numpy(), ref.numpy(), atol=FLOAT32_FORWARD_ABS)
    assert not torch.allclose(base, one) and not torch.allclose(one, both)


def test_llama_mlp_width_is_llamas_ratio_rounded_to_eight():
    assert [llama_mlp_width(d) for d in (16, 64, 96, 128)] == [48, 176, 256, 344]


@pytest.mark.parametrize("arch", ["gpt2", "attn_only"])
def test_checkpoints_are_the_weights_after_their_step_and_change_no_weight(tmp_path, arch):
    """`train.checkpoints`: the weights after each listed step are saved (step 0: the
    initialisation); the final weights are bitwise those of a run without checkpoints; a
    checkpoint installed as a model (rule checkpoint_model) has its own manifest. A run
    of k steps is not a checkpoint at step k (the learning rate schedule depends on `steps`),
    so the step-0 checkpoint is checked against a fresh model of the same seed and the others
    against each other."""
    from safetensors.torch import load_file

    from posmech.models.training import install_checkpoint

    rng = np.random.default_rng(2)
    docs = [{"text": "".join(rng.choice(list("abcdefgh "), 80))} for _ in range(10)]
    cfg = {"corpus": "c", "architecture": arch, "n_layer": 2, "n_head": 2, "d_model": 16, "n_ctx": 16,
           "steps": 5, "batch_size": 4, "warmup_steps": 1, "heldout_every": 5, "eval_every": 5,
           "eval_batches": 1, "repeat_fraction": 0.5, "induction_samples": 4, "threads": 1}
    train_demo_model(docs, dict(cfg, checkpoints=[0, 2, 4]), tmp_path / "a", "m")
    train_demo_model(docs, cfg, tmp_path / "b", "m")

    def weights(d):
        return load_file(str(d / "model.safetensors"))

    final_a, final_b = weights(tmp_path / "a" / "hf"), weights(tmp_path / "b" / "hf")
    assert all(torch.equal(final_a[k], final_b[k]) for k in final_b)
    saved = tmp_path / "a" / "checkpoints"
    assert sorted(p.name for p in saved.iterdir()) == ["step0", "step2", "step4"]
    assert not any((tmp_path / "b" / "checkpoints").iterdir())  # none asked, none saved
    step0, step2, step4 = (weights(saved / s / "hf") for s in ("step0", "step2", "step4"))
    from posmech.models.training import TRAIN_DEFAULTS

    torch.manual_seed(0)  # the seed the training starts from: step 0 is a fresh model
    fresh = _build_model({**TRAIN_DEFAULTS, **cfg}, len(build_char_tokenizer([d["text"] for d in docs])))
    init = fresh.state_dict() if arch == "gpt2" else fresh.tl_state_dict()
    common = [k for k in step0 if k in init]
    assert len(common) >= len(step0) - 1 and all(torch.equal(step0[k], init[k]) for k in common)
    changed = [k for k in final_a if not torch.equal(step0[k], final_a[k])]
    assert changed and any(not torch.equal(step2[k], step4[k]) for k in step4)
    man = install_checkpoint("m@step2", {"checkpoint_of": "m", "step": 2, "train": dict(cfg, checkpoints=[0, 2, 4])},
                             saved, tmp_path / "m@step2")
    assert (man["kind"], man["revision"], man["checkpoint_of"], man["step"]) == ("checkpoint", "step2", "m", 2)
    assert man["weights_sha256_16"] != json.loads((tmp_path / "a" / "manifest.json").read_text())["weights_sha256_16"]
    got = weights(tmp_path / "m@step2" / man["hf_dir"])
    assert all(torch.equal(got[k], step2[k]) for k in step2)
    with pytest.raises(PosmechError, match="saved no checkpoint step3"):
        install_checkpoint("m@step3", {"checkpoint_of": "m", "step": 3, "train": cfg}, saved, tmp_path / "x")


def test_train_work_counts_tokens_times_block_parameters_and_orders_the_demo_trainings():
    """posmech.models.training.train_work (rule train_demo_model's priority: the longest
    training first): steps × batch × context × layers × (attention 4d² + the MLP's weights)."""
    import yaml

    from posmech.models.training import llama_mlp_width, train_work

    base = {"steps": 10, "batch_size": 2, "n_ctx": 8, "n_layer": 3, "d_model": 16}
    assert train_work({**base, "architecture": "gpt2"}) == 10 * 2 * 8 * 3 * (4 * 256 + 8 * 256)
    assert train_work({**base, "architecture": "attn_only"}) == 10 * 2 * 8 * 3 * 4 * 256
    assert train_work({**base, "architecture": "llama"}) == 10 * 2 * 8 * 3 * (4 * 256 + 3 * 16 * llama_mlp_width(16))
    demo = yaml.safe_load((Path(__file__).resolve().parents[2] / "config" / "demo.yaml").read_text())["models"]
    work = {m: train_work(demo[m]["train"]) for m in ("demo", "demo-rope", "demo-attn")}
    # the measured training CPU (docs/performance.md): demo and demo-rope alike (3 layers each; 65-70 and
    # ~61 CPU s on one machine), demo-attn about half
    assert min(work["demo"], work["demo-rope"]) > 2 * work["demo-attn"]
    assert abs(work["demo-rope"] / work["demo"] - 1) < 0.05
