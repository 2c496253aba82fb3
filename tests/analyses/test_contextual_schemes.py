"""The layer-0 decomposition (K6–K10) on rotary and ALiBi models
(posmech.analyses.contextual.relative): random-init tiny Llama, GPT-NeoX and BLOOM models run
by the posmech engine. Its parts are the L rules' inputs (docs/claims.md, "Position-only and
token-only inputs"): the positional score is the position-only input's layer-0 score, the
content score the token-only input's, and the exact pattern is the model's own."""

from __future__ import annotations

import numpy as np
import pytest

from posmech.analyses import attn_only as ao
from posmech.analyses import contextual as cx
from posmech.analyses.contextual.relative import relative_from_model
from posmech.models import lens
from posmech.models.handbuilt import char_tokenizer
from tests import tiny_archs as ta
from tests.tolerances import FLOAT32_FORWARD_ABS

T, DEST = 20, 7
LAYER0 = [(0, h) for h in range(4)]
# float32 forward, float64 decomposition: scores of size ~10 agree to a few float32 ulps
SCORE_ABS = 1e-5


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("k_schemes")
    out = {}
    for name, fn in (("llama", ta.llama), ("neox", ta.neox), ("bloom", ta.bloom), ("mpt", ta.mpt)):
        m = lens.from_hf_dir(str(fn(root / name)), char_tokenizer(ta.V), "raw", "cpu", "float32")
        out[name] = (m, relative_from_model(m, name))
    return out


IDS = np.random.default_rng(0).integers(1, ta.V, size=T)
POS = np.arange(1, T)


@pytest.mark.float32
@pytest.mark.parametrize("name", ["llama", "neox", "bloom", "mpt"])
def test_exact_pattern_is_the_models_layer0_pattern(models, name):
    m, w = models[name]
    dec = cx.decompose(w, 1.0, IDS, POS)
    P = ao.run_variant(m, IDS[None], "both", LAYER0).patterns[0][:, 1:, :]
    np.testing.assert_allclose(dec.attention, P, atol=FLOAT32_FORWARD_ABS)


@pytest.mark.parametrize("name", ["llama", "neox", "bloom", "mpt"])
def test_positional_score_is_the_position_only_inputs_and_content_score_the_token_only_inputs(models, name):
    m, w = models[name]
    dec = cx.decompose(w, 1.0, IDS, POS, destination=DEST)
    S = ao.run_variant(m, np.full((1, T), DEST), "position_only", LAYER0).scores[0][:, 1:, :]
    fin = np.isfinite(dec.pi)
    np.testing.assert_allclose(dec.pi[fin], S[fin], atol=SCORE_ABS)
    x = np.concatenate([IDS[: T - 1], [DEST]])[None]
    St = ao.run_variant(m, x, "token_only", LAYER0).scores[0][:, T - 1, :]
    np.testing.assert_allclose(dec.kappa[:, -1, :], St, atol=SCORE_ABS)


def test_alibi_split_is_exact_and_its_positional_pattern_is_the_slope(models):
    """ALiBi: position + content is the exact score up to a row constant (TV 0), and the
    positional pattern is softmax(m_h (i - n))."""
    from posmech.models.scores import alibi_slopes

    _, w = models["bloom"]
    dec = cx.decompose(w, 1.0, IDS, POS, destination=DEST)
    assert dec.tv().max() < 1e-9
    n = T - 1
    m = alibi_slopes(4)[:, None]
    expect = np.exp(m * (np.arange(n + 1) - n))
    np.testing.assert_allclose(dec.p[:, -1], expect / expect.sum(-1, keepdims=True), atol=1e-9)


def test_rotary_split_is_not_an_identity(models):
    """Rotary: position and token do not add up; the linear attention softmax(π + κ) differs
    from the exact one (a random model: by a lot), which the stored TV reports."""
    _, w = models["llama"]
    assert cx.decompose(w, 1.0, IDS, POS, destination=DEST).tv().max() > 0.05


@pytest.mark.parametrize("name", ["llama", "bloom"])
def test_stored_factors_give_every_part_as_one_dot_product(models, name, tmp_path):
    """build_decomposition's factors: query · positional key = π and query · content key = κ,
    as the readers (K8, K9, C1-C3) take them."""
    from posmech.data.tokens import TokenSet

    _, w = models[name]
    docs = [np.random.default_rng(s).integers(1, ta.V, size=T + 4) for s in range(3)]
    toks = TokenSet(np.concatenate(docs).astype(np.int32), np.arange(4) * (T + 4), {}, [f"d{i}" for i in range(3)])
    texts = [{"corpus": "c", "doc_index": i, "title": f"d{i}", "ids": d} for i, d in enumerate(docs)]
    path = tmp_path / "layer0.h5"
    cx.build_decomposition(w, DEST, "x", toks, texts, T - 2, None, path, {"model": name})
    f = cx.read_decomposition(path)
    n = T - 2
    dec = cx.decompose(w, 1.0, docs[0], [n], destination=DEST)
    pi = np.einsum("he,hke->hk", f.query[:, n], f.positional_key[:, : n + 1]) / float(f.attrs["attn_scale"])
    np.testing.assert_allclose(pi, dec.pi[:, 0], atol=1e-9)
    kc = f.content_key(docs[0][: n + 1])
    kappa = np.einsum("he,hke->hk", f.query[:, n], kc) / float(f.attrs["attn_scale"])
    np.testing.assert_allclose(kappa[:, :n], dec.kappa[:, 0, :n], atol=1e-5)
    assert f.attrs["position_scheme"] == w.scheme
