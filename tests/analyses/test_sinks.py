"""Attention sinks and massive activations (S1-S4): Gu et al.'s metric on hand-built patterns
with values computed by hand, the scorecard's not-measurable cases, and the forward pass on a
hand-built model with a planted sink head (known alpha[0]) beside uniform heads (alpha[0] =
H_T / T)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from posmech.analyses import sinks as sk
from posmech.core.errors import PosmechError
from posmech.models import handbuilt as hb
from posmech.models.loading import load_bridge
from posmech.settings import defaults

from tests.tolerances import FLOAT32_FORWARD_ABS, FLOAT64_ABS


def test_gu_et_al_metric_on_a_pattern_computed_by_hand():
    # T = 3: alpha[0] = (1 + 0.5 + 0.2) / 3, alpha[1] = (0.5 + 0.3) / 2, alpha[2] = 0.5 / 1
    A = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    np.testing.assert_allclose(sk.key_scores(A), [1.7 / 3, 0.4, 0.5], rtol=0, atol=FLOAT64_ABS)
    # the same as Gu et al.'s code: (A / ratios).sum(-2), ratios = arange(T, 0, -1) along the keys
    ratios = np.broadcast_to(np.arange(3, 0, -1)[None, :], A.shape)
    np.testing.assert_allclose(sk.key_scores(A), (A / ratios).sum(-2), rtol=0, atol=FLOAT64_ABS)
    # batched: [sample, layer, head, T, T]; one of the two (sample, head) is a sink at eps 0.3
    uniform = np.tril(np.ones((3, 3))) / np.arange(1, 4)[:, None]
    alpha0 = sk.key_scores(np.stack([A, uniform])[:, None, None])[..., 0]  # [sample, layer, head]
    assert alpha0.shape == (2, 1, 1)
    assert alpha0[1, 0, 0] == pytest.approx((1 + 1 / 2 + 1 / 3) / 3, abs=FLOAT64_ABS)
    assert sk.uniform_alpha0(3) == pytest.approx(alpha0[1, 0, 0], abs=FLOAT64_ABS)
    assert sk.sink_ratio(alpha0, 0.6) == 0.5  # 0.567 is not above 0.6, 0.611 is
    assert sk.sink_ratio(alpha0, 0.3) == 1.0  # T = 3 is too short: a uniform head is a "sink" (sinks.n_tokens >= 10)


def test_a_uniform_head_is_no_sink_from_ten_tokens_on():
    assert sk.uniform_alpha0(9) > 0.3 > sk.uniform_alpha0(10)
    assert sk.uniform_alpha0(64) == pytest.approx(0.0742, abs=1e-4)
    assert sk.uniform_alpha0(32) == pytest.approx(0.1268, abs=1e-4)


def test_the_settings_refuse_a_t_at_which_uniform_heads_are_sinks():
    defaults("sinks").check()
    with pytest.raises(PosmechError, match="sinks.n_tokens"):
        defaults("sinks", n_tokens=10, epsilon=0.2).check()


def test_sink_ratio_over_nothing_is_an_error():
    with pytest.raises(PosmechError, match="no"):
        sk.sink_ratio(np.zeros((0, 2, 2)), 0.3)


def _alpha0(values: dict[tuple[int, int], float], L: int = 3, H: int = 2, N: int = 4) -> np.ndarray:
    a = np.full((N, L, H), 0.1)
    for (l, h), v in values.items():
        a[:, l, h] = v
    return a


def test_scorecard_s1_s2_and_s3_not_measurable_without_alibi():
    a = _alpha0({(2, 0): 0.9})
    heads = sk.head_table(a, "m", 0.3, 0.9)
    card = {r["quantity"]: r for r in sk.sink_scorecard(a, heads, "m", 0.3, 2, "learned", "t.csv")}
    assert card["sink_ratio"]["value"] == pytest.approx(1 / 6)
    assert card["early_sink_ratio"]["value"] == 0.0
    assert card["first_token_head_share"]["value"] is None and "learned" in card["alpha0_slope_spearman"]["detail"]
    assert heads.set_index("head_name").loc["L2H0", "is_sink"] and heads["is_sink"].sum() == 1
    a = _alpha0({(0, 1): 0.5})
    card = {r["quantity"]: r for r in sk.sink_scorecard(a, sk.head_table(a, "m", 0.3, 0.9), "m", 0.3, 2, "rotary", "")}
    assert card["early_sink_ratio"]["value"] == pytest.approx(1 / 4)


def test_s2_is_not_measurable_when_the_early_layers_are_the_whole_model():
    a = _alpha0({}, L=2)
    card = {r["quantity"]: r for r in sk.sink_scorecard(a, sk.head_table(a, "m", 0.3, 0.9), "m", 0.3, 2, "learned", "")}
    assert card["early_sink_ratio"]["value"] is None and "2 layers" in card["early_sink_ratio"]["detail"]
    assert card["sink_ratio"]["value"] == 0.0


def test_s3_on_alibi_slopes():
    slopes = sk.alibi_slopes(4)  # 0.25, 0.0625, 0.0156, 0.0039: head 0 the steepest
    a = np.full((2, 2, 4), 0.0)
    a[:, :, :] = np.array([0.95, 0.6, 0.2, 0.1])  # alpha[0] falls with the slope: rho = 1
    heads = sk.head_table(a, "m", 0.3, 0.9, slopes)
    card = {r["quantity"]: r["value"] for r in sk.sink_scorecard(a, heads, "m", 0.3, 1, "alibi", "")}
    assert card["first_token_head_share"] == pytest.approx(2 / 8)
    assert card["alpha0_slope_spearman"] == pytest.approx(1.0)
    a[:] = 0.5  # every head the same: no ranking
    heads = sk.head_table(a, "m", 0.3, 0.9, slopes)
    card = {r["quantity"]: r for r in sk.sink_scorecard(a, heads, "m", 0.3, 1, "alibi", "")}
    assert card["alpha0_slope_spearman"]["value"] is None


def test_massive_activation_of_a_planted_hidden_state():
    h = np.ones((5, 4)) * np.array([1.0, -2.0, 1.0, 1.0])
    h[0, 2] = -3000.0  # token 0, dimension 2
    top = sk.top_activation(h)
    assert (top["top_position"], top["top_dim"], top["top_value"]) == (0, 2, -3000.0)
    assert top["second_dim"] == 1 and top["median_abs"] == 1.0 and top["ratio"] == 3000.0
    rows = [{"sample": s, "layer": l, **sk.top_activation(h if l == 1 else np.ones((5, 4)))}
            for s in range(3) for l in range(2)]
    summary = sk.massive_summary(sk.activation_table(rows, "m"))
    assert summary["ratio_median"].tolist() == [1.0, 3000.0]
    card = {r["quantity"]: r["value"] for r in sk.massive_scorecard(summary, "m", "")}
    assert card == {"top_over_median": 3000.0, "massive_dims": [2], "massive_first_token_share": 1.0}


def test_a_hidden_state_of_zeros_has_no_ratio():
    rows = [{"sample": 0, "layer": 0, **sk.top_activation(np.zeros((3, 4)))}]
    card = sk.massive_scorecard(sk.massive_summary(sk.activation_table(rows, "m")), "m", "")
    assert all(r["value"] is None and "median" in r["detail"] for r in card)


# --------------------------------------------------------------------------- a hand-built model
N = 16
SINK = 30.0  # score of every query on key 0: alpha[0] = mean_i e^30 / (e^30 + i) ~ 1 - 4e-13


def sink_scores(n: int, strength: float = SINK) -> np.ndarray:
    S = np.zeros((n, n))
    S[:, 0] = strength
    return S


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    spec = hb.positional_spec(n_ctx=N, n_layer=3, n_head=2, scores={(2, 0): sink_scores(N)})
    path = hb.save_model_dir(spec, tmp_path_factory.mktemp("sinks") / "m")
    return load_bridge({"name": "sinks", "hf_dir": str(path)}, device="cpu")


@pytest.mark.float32
def test_the_planted_sink_head_and_the_uniform_heads_have_their_alpha0(planted):
    rng = np.random.default_rng(0)
    samples = [rng.integers(1, 40, N) for _ in range(5)]
    col = sk.run_sinks(planted, samples, batch_size=2, progress=False)
    a0 = col.alpha0
    assert a0.shape == (5, 3, 2) and len(col.rows) == 5 * 3
    expected = np.full((3, 2), sk.uniform_alpha0(N))
    expected[2, 0] = 1.0
    np.testing.assert_allclose(a0, np.broadcast_to(expected, a0.shape), rtol=0, atol=FLOAT32_FORWARD_ABS)
    assert sk.sink_ratio(a0, 0.3) == pytest.approx(1 / 6)
    scheme, slopes = sk.positions_and_slopes(planted.cfg)
    assert scheme == "learned" and slopes is None
    table = sk.activation_table(col.rows, "m")
    assert len(table) == 15 and set(table["layer"]) == {0, 1, 2}
