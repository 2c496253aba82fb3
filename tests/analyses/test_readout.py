"""Logits only at the positions read (posmech.analyses.readout) equal the full forward pass's,
on the bridge and on the posmech engine, in both processing modes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from posmech.analyses.interventions import redirect_hook
from posmech.analyses.readout import final_residual, logits_at, next_token_logprobs, target_probabilities
from posmech.models import handbuilt as hb
from posmech.models.loading import load_model

from tests.tolerances import FLOAT32_FORWARD_REL

V, T = 50, 20
# float32 rounding: the read-out multiplies fewer rows by W_U than the full pass does
ATOL = 1e-5


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A random 2-layer GPT-2 with random LayerNorm scales and biases (so the final
    LayerNorm's affine part matters) and an untied unembedding."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_head=2, n_embd=16, n_positions=32, vocab_size=V, tie_word_embeddings=False,
                     bos_token_id=0, eos_token_id=0)
    m = GPT2LMHeadModel(cfg)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "ln" in name:
                p.copy_(torch.randn_like(p))
    d = tmp_path_factory.mktemp("models") / "random_ln"
    m.save_pretrained(d, safe_serialization=True)
    hb.char_tokenizer(V).save_pretrained(d)
    return d


@pytest.fixture(scope="module", params=[(p, e) for p in ("compatibility", "raw") for e in ("bridge", "posmech")],
                ids=lambda pe: "-".join(pe))
def model(request, model_dir):
    processing, engine = request.param
    return load_model({"name": "r", "hf_dir": str(model_dir)}, device="cpu", processing=processing, engine=engine)


def _x(seed=0, batch=3):
    return torch.as_tensor(np.random.default_rng(seed).integers(0, V, size=(batch, T)))


def _hooked(model):
    return [n for n, hp in model.hook_dict.items() if getattr(hp, "fwd_hooks", None)]


@pytest.mark.float32
def test_logits_at_equal_the_full_pass(model):
    x = _x()
    with torch.inference_mode():
        full = model(x)
    rows, pos = [0, 1, 2, 2, 0], [T - 1, 3, 0, 7, T - 1]
    got = logits_at(model, x, rows, pos)
    assert got.shape == (5, V)
    torch.testing.assert_close(got, full[rows, pos], atol=ATOL, rtol=0)
    assert _hooked(model) == []  # the read-out hook is gone, also though it stopped the pass


@pytest.mark.float32
def test_hooks_act_in_the_read_out_pass(model):
    x = _x(1)
    hook = redirect_hook(1, 0, {T - 1: 2})
    with torch.inference_mode(), model.hooks(fwd_hooks=[hook]):
        full = model(x)
    torch.testing.assert_close(logits_at(model, x, [1], [T - 1], [hook]), full[1:2, T - 1], atol=ATOL, rtol=0)
    with torch.inference_mode():
        plain = model(x)
    assert not torch.allclose(full[1, T - 1], plain[1, T - 1])  # the hook mattered
    assert _hooked(model) == []


@pytest.mark.float32
def test_next_token_logprobs_chunked_equal_full_log_softmax(model):
    doc = _x(2, 1)[0].numpy()
    with torch.inference_mode():
        full = torch.log_softmax(model(torch.as_tensor(doc)[None])[0, :-1], -1)
    ref = full.gather(-1, torch.as_tensor(doc[1:])[:, None])[:, 0]
    for chunk in (1, 7, 256):
        torch.testing.assert_close(next_token_logprobs(model, doc, chunk=chunk), ref, atol=ATOL, rtol=0)


def test_final_residual_shape(model):
    r = final_residual(model, _x()[0].numpy(), [0, 0], [1, 5])
    assert r.shape == (2, model.cfg.d_model)


def _target_probabilities_full_logits(model, prompt_ids, targets):
    """The previous implementation (one row per distinct prefix, full [rows, T, d_vocab]
    logits): the oracle the read-out version must equal."""
    n = len(prompt_ids)
    prefixes = sorted({tuple(v[:-1]) for vs in targets.values() for v in vs} | {()}, key=lambda t: (len(t), t))
    row = {pre: i for i, pre in enumerate(prefixes)}
    x = np.zeros((len(prefixes), n + max(len(p) for p in prefixes)), dtype=np.int64)
    for pre, i in row.items():
        x[i, : n + len(pre)] = np.concatenate([prompt_ids, np.asarray(pre, dtype=np.int64)])
    with torch.inference_mode():
        logp = torch.log_softmax(model(torch.as_tensor(x))[:, n - 1 :].double(), -1)
    out = {name: sum(float(logp[row[tuple(v[:-1])], torch.arange(len(v)), torch.as_tensor(v)].sum().exp())
                     for v in vs) for name, vs in targets.items()}
    first = logp[row[()], 0].exp()
    return out, int(first.argmax()), float(first.max())


@pytest.mark.float32
@pytest.mark.parametrize("max_batch_tokens", [1, 30, 4096])
def test_target_probabilities_equal_the_full_logit_pass(model, max_batch_tokens):
    prompt = np.array([0, 5, 9, 3, 7, 7, 2])
    # nested prefixes (7,) < (7, 8) < (7, 8, 3), a single-token variant, two unrelated multi-token ones
    targets = {"a": [[5], [7, 9]], "b": [[7, 8, 3, 1]], "c": [[6], [7, 8, 2]], "d": [[11, 12]]}
    got, top, top_p = target_probabilities(model, prompt, targets, max_batch_tokens=max_batch_tokens)
    ref, ref_top, ref_p = _target_probabilities_full_logits(model, prompt, targets)
    assert got.keys() == ref.keys()
    for k in ref:
        assert got[k] == pytest.approx(ref[k], rel=FLOAT32_FORWARD_REL), k  # float32 rounding of the logits
    assert top == ref_top and top_p == pytest.approx(ref_p, rel=FLOAT32_FORWARD_REL)
