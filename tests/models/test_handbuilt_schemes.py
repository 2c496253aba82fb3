"""The self-check's rotary and ALiBi hand-built models (posmech.verdicts.selfcheck:
rope-planted, alibi-planted) give exactly their planted scores under the L rules' inputs
per scheme (docs/claims.md, "Position-only and token-only inputs"), run by the posmech engine."""

from __future__ import annotations

import numpy as np
import pytest

from posmech.analyses import attn_only as ao
from posmech.models import handbuilt as hb
from posmech.models import lens
from posmech.models.scores import alibi_slopes
from posmech.verdicts.selfcheck import ALIBI_ANTI_SELF, ROPE_GAP, alibi_planted_spec, rope_planted_spec

T = 14
# float32 forward of scores of size ~30: a few float32 ulps
SCORE_ABS = 1e-4


@pytest.fixture(scope="module")
def rope(tmp_path_factory):
    spec = rope_planted_spec()
    d = hb.save_rotary_dir(spec, tmp_path_factory.mktemp("rope") / "m")
    return spec, lens.from_hf_dir(str(d), hb.char_tokenizer(spec.d_vocab), "raw", "cpu", "float32")


@pytest.fixture(scope="module")
def alibi(tmp_path_factory):
    spec = alibi_planted_spec()
    d = hb.save_alibi_dir(spec, tmp_path_factory.mktemp("alibi") / "m")
    return spec, lens.from_hf_dir(str(d), hb.char_tokenizer(spec.d_vocab), "raw", "cpu", "float32")


def _tokens(seed: int, n: int = 4) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, 96, size=(n, T))


def _lower() -> np.ndarray:
    return np.tril(np.ones((T, T), dtype=bool))


def test_rotary_weights_peak_at_their_offset_by_the_gap():
    th = rope_planted_spec().thetas()
    w, g = hb.rotary_offset_weights(th, np.arange(-34, 3))
    f = np.array([(w * np.cos(k * th)).sum() for k in range(-34, 3)])
    assert g > 0 and np.isclose(f.max(), f[34]) and np.sort(f)[-2] <= f[34] - g + 1e-9


def test_rope_position_only_scores_are_the_planted_rotation_whatever_the_token(rope):
    """L0H0 and L0H1 read only the dimension every token shares: with one token repeated
    their scores do not depend on the token, peak at offsets -1 and -2, ROPE_GAP above every
    other key."""
    _, m = rope
    a = ao.run_variant(m, _tokens(0), "position_only", [(0, 0), (0, 1)]).scores
    b = ao.run_variant(m, _tokens(1), "position_only", [(0, 0), (0, 1)]).scores
    np.testing.assert_allclose(a, b, atol=SCORE_ABS)
    for i, shift in ((0, 1), (1, 2)):
        S = a[0, i]
        for q in range(shift, T):
            row = S[q, : q + 1]
            assert int(np.argmax(row)) == q - shift
            assert np.delete(row, q - shift).max() <= row[q - shift] - ROPE_GAP + SCORE_ABS


def test_rope_token_only_scores_do_not_depend_on_the_positions(rope):
    """Every query and key at position 0: no rotation, so the planted heads score one number
    for every pair (their query and key are the same for every token)."""
    _, m = rope
    S = ao.run_variant(m, _tokens(2), "token_only", [(0, 0), (0, 1)]).scores
    low = S[:, :, _lower()]
    np.testing.assert_allclose(low, low[:, :, :1].repeat(low.shape[-1], -1), atol=SCORE_ABS)


def test_alibi_inputs_give_the_planted_scores(alibi):
    """L0H0: position-only (one token repeated: every key shares the query's code) scores
    -30 + m_0 (i - n); token-only (bias off) scores -30 on keys of the query's code, 0 elsewhere."""
    spec, m = alibi
    x = _tokens(3)
    m0 = alibi_slopes(spec.n_heads)[0]
    n, i = np.indices((T, T))
    P = ao.run_variant(m, x, "position_only", [(0, 0)]).scores[:, 0]
    np.testing.assert_allclose(P[:, _lower()], np.broadcast_to((-ALIBI_ANTI_SELF + m0 * (i - n))[_lower()],
                                                               P[:, _lower()].shape), atol=SCORE_ABS)
    S = ao.run_variant(m, x, "token_only", [(0, 0)]).scores[:, 0]
    codes = x % spec.n_codes
    expect = -ALIBI_ANTI_SELF * (codes[:, :, None] == codes[:, None, :])
    np.testing.assert_allclose(S[:, _lower()], expect[:, _lower()], atol=SCORE_ABS)
