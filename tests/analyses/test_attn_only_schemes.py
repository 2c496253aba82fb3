"""The L rules' position-only and token-only inputs per position scheme (docs/claims.md,
"Position-only and token-only inputs"; posmech.analyses.attn_only.variant_input), on
random-init tiny rotary (Llama, GPT-NeoX) and ALiBi (BLOOM) models run by the posmech engine."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import softmax

from posmech.analyses import attn_only as ao
from posmech.core.errors import PosmechError
from posmech.models import lens
from tests import tiny_archs as ta
from tests.tolerances import FLOAT32_FORWARD_ABS

T = 12


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("schemes")
    from posmech.models.handbuilt import char_tokenizer

    return {name: lens.from_hf_dir(str(fn(root / name)), char_tokenizer(ta.V), "raw", "cpu", "float32")
            for name, fn in (("llama", ta.llama), ("neox", ta.neox), ("bloom", ta.bloom))}


def _tokens(seed: int, n: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, ta.V, size=(n, T))


def test_schemes_are_read_from_the_loaded_model(models):
    assert {k: ao.position_scheme_of(m.cfg) for k, m in models.items()} == \
        {"llama": "rotary", "neox": "rotary", "bloom": "alibi"}


@pytest.mark.float32
@pytest.mark.parametrize("name", ["llama", "neox", "bloom"])
def test_every_variant_scores_are_the_models_own(models, name):
    """The raw scores of each input are those the model's softmax used: its pattern is their
    softmax over keys <= query (rotation and ALiBi's bias as the input moved them)."""
    lower = np.tril(np.ones((T, T), dtype=bool))
    for v in ao.VARIANTS:
        f = ao.run_variant(models[name], _tokens(0), v)
        np.testing.assert_allclose(softmax(np.where(lower, f.scores, -np.inf), -1), f.patterns,
                                   atol=FLOAT32_FORWARD_ABS, err_msg=v)


@pytest.mark.parametrize("name", ["llama", "neox", "bloom"])
def test_position_only_scores_depend_on_the_offset_only_and_not_on_the_sequence(models, name):
    """One token repeated: the residual stream is one vector at every position of every layer,
    so every head's score is a function of key − query only (Toeplitz); the other tokens of
    the sampled sequence do not matter (two sequences ending in the same token agree)."""
    m = models[name]
    x = _tokens(1)
    y = _tokens(2)
    y[:, -1] = x[:, -1]
    f, g = ao.run_variant(m, x, "position_only"), ao.run_variant(m, y, "position_only")
    np.testing.assert_array_equal(f.scores, g.scores)
    S = f.scores
    for off in range(T):
        diag = np.stack([S[:, :, q, q - off] for q in range(off, T)], -1)
        np.testing.assert_allclose(diag, diag[..., :1].repeat(diag.shape[-1], -1), atol=1e-4, err_msg=f"offset {off}")
    # and the position part is there: the offsets do not all score alike
    assert np.abs(S[:, :, T - 1, : T - 1] - S[:, :, T - 1, T - 1:]).max() > 1e-3


@pytest.mark.parametrize("name", ["llama", "neox", "bloom"])
def test_token_only_layer0_scores_depend_on_the_tokens_only(models, name):
    """Every query and key at position 0: layer 0's score of query token a on key token b is
    the same wherever the pair stands (no rotation, no bias); with both inputs it is not."""
    m = models[name]
    x = np.tile(np.array([5, 9, 17]), T // 3)[None]  # pairs (a, b) recur at many offsets
    tok = ao.run_variant(m, x, "token_only", [(0, h) for h in range(m.cfg.n_heads)]).scores[0]
    both = ao.run_variant(m, x, "both", [(0, h) for h in range(m.cfg.n_heads)]).scores[0]
    spread_tok, spread_both = 0.0, 0.0
    for a in (5, 9, 17):
        for b in (5, 9, 17):
            cells = [(q, k) for q in range(T) for k in range(q + 1) if x[0, q] == a and x[0, k] == b]
            vt = np.array([tok[:, q, k] for q, k in cells])
            vb = np.array([both[:, q, k] for q, k in cells])
            spread_tok = max(spread_tok, float(np.ptp(vt, 0).max()))
            spread_both = max(spread_both, float(np.ptp(vb, 0).max()))
    assert spread_tok < 1e-4
    assert spread_both > 1e-3  # the positions move the normal scores


def test_alibi_position_only_is_the_bias_up_to_a_row_constant(models):
    """ALiBi, one token repeated: q(t)·k(t) is one number per head, so every row's scores
    step by the head's slope m_h per key."""
    from posmech.models.scores import alibi_slopes

    m = models["bloom"]
    S = ao.run_variant(m, _tokens(3), "position_only", [(0, h) for h in range(m.cfg.n_heads)]).scores
    steps = np.diff(S[:, :, T - 1, :], axis=-1)  # [b, H, T-1]
    np.testing.assert_allclose(steps, np.broadcast_to(alibi_slopes(m.cfg.n_heads)[None, :, None], steps.shape),
                               atol=1e-4)


def test_no_positional_encoding_has_no_position_only_input():
    x = _tokens(4)
    with pytest.raises(PosmechError, match="no positional encoding"):
        ao.variant_input("none", "position_only", x)
    tokens, hooks, positions = ao.variant_input("none", "token_only", x)
    assert tokens is x and hooks == [] and positions is None  # token-only: the model itself


def test_no_positional_encoding_scorecard_says_why_position_only_is_not_measurable():
    """Scheme ``none``: the L2/L3 quantities read from the position-only input have no value
    and the reason; the token-only and both ones keep theirs."""
    import pandas as pd

    s = ao.AttnOnlySettings.from_section({**_settings().as_dict()})
    fwds = {}
    rng = np.random.default_rng(0)
    for v in ("both", "token_only"):
        S = rng.normal(size=(4, 1, T, T))
        fwds[v] = ao.Forward([(0, 0)], S, softmax(np.where(np.tril(np.ones((T, T), bool)), S, -np.inf), -1))
    rows = ao.decomposition_rows(fwds, {"previous": (0, 0)}, {"previous": "L2"})
    df = pd.DataFrame(rows)
    card = ao.decomposition_scorecard(df, {"previous": "L0H0", "look_back_two": ao.NONE}, s, True, "m",
                                      {"L2": "a", "L3": "b", "L5": "c"}, {"look_back_two": "no head"}, "none")
    by = {(r["claim"], r["quantity"]): r for r in card}
    for cq in (("L2", "posonly_pattern_offset1"), ("L3", "posonly_row1_key0"), ("L2", "posonly_score_max_other")):
        assert by[cq]["value"] is None and "no positional encoding" in by[cq]["detail"]
    assert by[("L2", "tokonly_score_other_mean")]["value"] is not None
    assert by[("L2", "both_pattern_offset1")]["value"] is not None


def _settings():
    from posmech.settings import defaults

    return defaults("attn_only", seed=0, n_sequences=4, n_tokens=T - 1, query=8, first_query=3, bos="model",
                    batch_size=4, pin={}, induction_score={"n_sequences": 4, "half_length": 6},
                    bos_induction={"n_samples": 4, "n_random": 7})


def test_prepare_on_a_rotary_model_needs_the_engine(models, tmp_path):
    """The token-only input of a rotary model moves every token to position 0: a bridge
    cannot, so the rule refuses it naming the config key; the engine is accepted."""
    from posmech.models.loading import load_bridge

    setup = ao.prepare(models["llama"], _settings(), "llama", {"prepend_bos": True})
    assert setup.scheme == "rotary"
    d = ta.llama(tmp_path / "llama")
    bridge = load_bridge({"hf_dir": str(d), "name": "llama"}, "cpu", "float32", "raw")
    with pytest.raises(PosmechError, match=r"model `llama`.*rotary.*engine"):
        ao.prepare(bridge, _settings(), "llama", {"prepend_bos": True})
