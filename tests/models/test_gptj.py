"""GPT-J's interleaved rotary pairs (issue 44): the posmech engine runs GPT-J, and the raw
scores and the rotary frequency decomposition read its adjacent pairs ``(2f, 2f + 1)``.

Analytic checks first (the interleaved rotation is the halves rotation of reordered
dimensions; one pair's score turns by its frequency times the distance), then the tiny
random GPT-J of tests/tiny_archs.py (``rotary_dim`` 4 of ``d_head`` 8: partial) against the
Hugging Face forward (eager): the engine's logits and patterns, and posmech's raw scores
from the engine's ``hook_q``/``hook_k``/``hook_cos``/``hook_sin`` against the query and key
Hugging Face's ``_attn`` receives (after its rotation), ``query·key / scale_attn`` for every
pair, the future included.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from posmech.models import scores
from posmech.models.loading import load_model
from tests import tiny_archs
from tests.tolerances import FLOAT32_FORWARD_ABS, FLOAT32_FORWARD_REL, FLOAT64_ABS

N = 24


@pytest.fixture(scope="module")
def gptj(tmp_path_factory):
    return tiny_archs.BUILDERS["gptj"](tmp_path_factory.mktemp("gptj") / "gptj")


def _tokens(batch: int = 2) -> torch.Tensor:
    return torch.as_tensor(np.random.default_rng(0).integers(1, tiny_archs.V, size=(batch, N)))


def _terms(r: int, n: int, interleaved: bool) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    theta = 10000.0 ** (-np.arange(0, r, 2) / r)
    ang = np.arange(n)[:, None] * theta[None]
    emb = np.repeat(ang, 2, -1) if interleaved else np.concatenate((ang, ang), -1)
    return torch.as_tensor(np.cos(emb))[None], torch.as_tensor(np.sin(emb))[None], theta


def test_interleaved_rotation_is_the_halves_rotation_of_reordered_dimensions():
    r, d = 6, 10
    x = torch.randn(1, 7, 3, d, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    ci, si, _ = _terms(r, 7, True)
    ch, sh, _ = _terms(r, 7, False)
    inter = scores.rotate(x, ci, si, interleaved=True)
    halves = scores.rotate(scores.halves_order(x, r, True), ch, sh)
    assert torch.allclose(scores.halves_order(inter, r, True), halves, atol=FLOAT64_ABS)
    assert torch.equal(inter[..., r:], x[..., r:])  # the unrotated dimensions pass through
    # the reordered cos/sin are the halves layout's
    assert torch.equal(scores.halves_order(ci, r, True), ch)
    # raw scores: an interleaved score function on the model's order = a halves one on the reordered
    q, k = x, torch.randn(x.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    a = scores.ScoreFunction("rotary", 2.0, interleaved=True).full(q, k, {"hook_cos": ci, "hook_sin": si})
    b = scores.ScoreFunction("rotary", 2.0).full(scores.halves_order(q, r, True), scores.halves_order(k, r, True),
                                                 {"hook_cos": ch, "hook_sin": sh})
    assert torch.allclose(a, b, atol=FLOAT64_ABS)


def test_one_adjacent_pair_turns_by_its_frequency():
    """A query and key of unit length on pair f's first dimension 2f score cos(θ_f·(n − i))
    (and its second, 2f + 1, of the key: sin(θ_f·(n − i))), whatever n and i."""
    r, n = 8, 9
    ci, si, theta = _terms(r, n, True)
    fn = scores.ScoreFunction("rotary", 1.0, interleaved=True)
    for f in range(r // 2):
        q = torch.zeros(1, n, 1, r, dtype=torch.float64)
        q[..., 2 * f] = 1.0
        for j, want in ((2 * f, np.cos), (2 * f + 1, np.sin)):
            k = torch.zeros_like(q)
            k[..., j] = 1.0
            s = fn.full(q, k, {"hook_cos": ci, "hook_sin": si})[0, 0].numpy()
            dist = np.arange(n)[:, None] - np.arange(n)[None]
            assert np.allclose(s, want(theta[f] * dist), atol=FLOAT64_ABS), (f, j)


def _hf_scores(d, x: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor, tuple]:
    """Hugging Face's pre-softmax scores ``query·key / scale_attn`` per layer (the query and
    key its ``_attn`` receives, after the rotation), its logits and ``output_attentions``."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager").eval()
    got: list[torch.Tensor] = []
    for block in hf.transformer.h:
        attn = block.attn

        def wrapped(query, key, *args, _orig=attn._attn, _a=attn, **kwargs):
            got.append(torch.matmul(query.double(), key.double().transpose(-1, -2)) / _a.scale_attn)
            return _orig(query, key, *args, **kwargs)

        attn._attn = wrapped
    with torch.no_grad():
        out = hf(x, output_attentions=True)
    return got, out.logits, out.attentions


@pytest.mark.float32
@pytest.mark.parametrize("processing", ["raw", "compatibility"])
def test_engine_and_raw_scores_equal_hugging_faces(gptj, processing):
    from posmech.models.lens import Lens

    x = _tokens()
    hf_scores, logits, attentions = _hf_scores(gptj, x)
    model = load_model({"hf_dir": str(gptj), "name": "gptj"}, "cpu", "float32", processing)
    assert isinstance(model, Lens) and model.cfg.rotary_adjacent_pairs and model.cfg.rotary_dim == 4
    L = model.cfg.n_layers
    names = ("hook_q", "hook_k", "hook_cos", "hook_sin", "hook_pattern", "hook_attn_scores")
    got: dict[tuple[str, int], torch.Tensor] = {}

    def keep(name, layer):
        def fn(t, hook):
            got[(name, layer)] = t.detach().clone()
        return fn

    hooks = [(f"blocks.{la}.attn.{n}", keep(n, la)) for la in range(L) for n in names]
    with torch.inference_mode(), model.hooks(fwd_hooks=hooks):
        mine = model(x, return_type="logits")
    centred = logits - logits.mean(-1, keepdim=True)  # the compatibility mode centres the unembedding
    ref = centred if processing == "compatibility" else logits
    assert float((mine - ref).abs().max()) <= FLOAT32_FORWARD_REL * max(1.0, float(ref.abs().max()))
    fn = scores.score_function(model.cfg)
    assert fn.interleaved and fn.scheme == "rotary"
    causal = torch.ones(N, N, dtype=torch.bool).tril()
    for la in range(L):
        assert float((got[("hook_pattern", la)] - attentions[la]).abs().max()) <= FLOAT32_FORWARD_ABS
        extra = {"hook_cos": got[("hook_cos", la)], "hook_sin": got[("hook_sin", la)]}
        raw = fn.full(got[("hook_q", la)], got[("hook_k", la)], extra).double()
        want = hf_scores[la]
        tol = FLOAT32_FORWARD_REL * max(1.0, float(want.abs().max()))
        assert float((raw - want).abs().max()) <= tol, la  # every pair, the future included
        assert float((raw - got[("hook_attn_scores", la)].double())[..., causal].abs().max()) <= tol
    # a halves score function (the wrong pairing) does not give Hugging Face's scores
    wrong = scores.ScoreFunction("rotary", fn.scale).full(got[("hook_q", 0)], got[("hook_k", 0)], {
        "hook_cos": got[("hook_cos", 0)], "hook_sin": got[("hook_sin", 0)]}).double()
    assert float((wrong - hf_scores[0]).abs().max()) > 100 * FLOAT32_FORWARD_REL


@pytest.mark.float32
def test_rotary_frequencies_split_gptjs_adjacent_pairs(gptj):
    """P17/P18's decomposition on GPT-J: the pairs' frequencies are θ_f = 10000^(-2f/r), and
    the components (two rotated pairs and the unrotated rest) sum to the raw scores, whose
    softmax is the model's pattern (frequency_usage checks it to PATTERN_ATOL)."""
    from posmech.analyses import rotary

    model = load_model({"hf_dir": str(gptj), "name": "gptj"}, "cpu", "float32", "raw")
    docs = _tokens(3).numpy()
    fu = rotary.frequency_usage(model, docs, 2)
    r = model.cfg.rotary_dim
    assert np.allclose(fu.frequency, 10000.0 ** (-np.arange(0, r, 2) / r), atol=FLOAT32_FORWARD_ABS)
    assert fu.selectivity.shape == (model.cfg.n_layers, model.cfg.n_heads, r // 2 + 1)
    assert fu.max_pattern_diff <= rotary.PATTERN_ATOL
    # the components of adjacent pairs, by hand: pair f is dimensions (2f, 2f+1) of the rotated q, k
    got = {}
    with torch.inference_mode(), model.hooks(fwd_hooks=[(f"blocks.0.attn.{n}", lambda t, hook, n=n: got.__setitem__(
            n, t.double())) for n in ("hook_q", "hook_k", "hook_cos", "hook_sin")]):
        model(torch.as_tensor(docs[:1]), return_type=None)
    fn = scores.score_function(model.cfg)
    extra = {"hook_cos": got["hook_cos"], "hook_sin": got["hook_sin"]}
    qr, kr = fn.prepare(got["hook_q"], got["hook_k"], extra)
    comp = rotary.components(fn.halves(qr, r), fn.halves(kr, r), r, fn.scale)  # [1, H, C, n, n]
    for f in range(r // 2):
        pair = slice(2 * f, 2 * f + 2)
        by_hand = torch.einsum("bqhd,bkhd->bhqk", qr[..., pair], kr[..., pair]) / fn.scale
        assert torch.allclose(comp[:, :, f], by_hand, atol=FLOAT64_ABS * 10)
    assert torch.allclose(comp.sum(2), fn.full(got["hook_q"], got["hook_k"], extra), atol=FLOAT64_ABS * 10)  # both sums in float64
    assert math.isfinite(float(fu.prev.max()))


@pytest.mark.float32
@pytest.mark.parametrize("processing", ["raw", "compatibility"])
def test_kernels_with_the_texts_own_means_are_gptjs_attention(gptj, processing):
    """The positional kernels' path (``bridge_head_weights``: GPT-J's query/key weights and
    rotary tables reordered into the halves layout): with means the text's own layer inputs,
    the kernel is the attention the model pays, in every layer (a wrong pairing would not be)."""
    from posmech.analyses import kernels as kn
    from tests.analyses.test_kernels import pattern, same_text_kernels

    model = load_model({"hf_dir": str(gptj), "name": "gptj"}, "cpu", "float32", processing)
    tokens = np.random.default_rng(5).integers(1, tiny_archs.V, 16)
    layers, pos = same_text_kernels(model, gptj, tokens, 0)
    assert kn.bridge_head_weights(model, None).rotary[0].shape[-1] == model.cfg.rotary_dim
    for layer, lk in enumerate(layers):
        np.testing.assert_allclose(lk.mean, pattern(model, tokens, layer)[:, pos], atol=2e-5)


@pytest.mark.float32
def test_layer0_decomposition_gives_gptjs_layer0_pattern(gptj):
    """K6-K10's layer-0 reader (``relative_from_model``: GPT-J's q, k and tables reordered
    alike): its exact pattern is the model's layer-0 pattern."""
    from posmech.analyses import attn_only as ao
    from posmech.analyses import contextual as cx
    from posmech.analyses.contextual.relative import relative_from_model
    from posmech.models import lens
    from posmech.models.handbuilt import char_tokenizer

    m = lens.from_hf_dir(str(gptj), char_tokenizer(tiny_archs.V), "raw", "cpu", "float32")
    ids = np.random.default_rng(0).integers(1, tiny_archs.V, size=20)
    dec = cx.decompose(relative_from_model(m, "gptj"), 1.0, ids, np.arange(1, 20))
    P = ao.run_variant(m, ids[None], "both", [(0, h) for h in range(4)]).patterns[0][:, 1:, :]
    np.testing.assert_allclose(dec.attention, P, atol=FLOAT32_FORWARD_ABS)
