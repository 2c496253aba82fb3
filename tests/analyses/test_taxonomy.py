"""Diagonal taxonomy (P6, P7) on hand-built models with exactly known attention."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from posmech.analyses.taxonomy import (
    HEADS_COLUMNS,
    DiagonalStats,
    accumulate_diagonals,
    add_pattern,
    choose_heads,
    chosen_heads_frame,
    classify_heads,
    diagonal_sums,
    rank_correlations,
    read_chosen_heads,
    taxonomy_scorecard,
    uniform_baseline,
)
from posmech.core.errors import PosmechError
from posmech.models import handbuilt as hb
from posmech.models.loading import load_bridge
from posmech.store.tables import write_table

from tests.tolerances import FLOAT32_FORWARD_ABS, FLOAT32_FORWARD_REL, FLOAT64_REL

N = 12


@pytest.fixture(scope="module")
def bridge(prev_token_model_dir):
    return load_bridge({"name": "prevtok", "hf_dir": str(prev_token_model_dir)}, device="cpu")


def _docs(n_docs: int, length: int = N, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [np.concatenate([[0], rng.integers(1, 40, size=length - 1)]) for _ in range(n_docs)]


def test_diagonal_sums_match_explicit_diagonals():
    g = torch.Generator().manual_seed(0)
    P = torch.tril(torch.rand(3, 2, 9, 9, generator=g))
    # the reference summed in float64 too: a float32 sum would be off by float32 rounding
    ref = torch.stack([torch.diagonal(P.double(), offset=-d, dim1=-2, dim2=-1).sum(-1) for d in range(9)], -1)
    torch.testing.assert_close(diagonal_sums(P), ref)
    assert diagonal_sums(P).dtype == torch.float64  # accumulated in float64 whatever the input
    # the one-pass trick relies on causality: a non-zero above the diagonal lands on a lower diagonal
    P2 = P.clone()
    P2[0, 0, 0, 3] = 1.0
    assert not torch.allclose(diagonal_sums(P2), ref)


def _uniform_means(n: int, exclude_first_query: bool = True) -> np.ndarray:
    """Mean diagonals ``[1, 1, n]`` of an exactly uniform causal head at context ``n``,
    through the rule's own accumulation (:func:`add_pattern`)."""
    pattern = torch.softmax(torch.triu(torch.full((n, n), -torch.inf), 1), -1)[None, None]
    stats = DiagonalStats(np.zeros((1, 1, n)), np.zeros(n, np.int64), np.zeros((1, 1)))
    add_pattern(stats, 0, pattern, exclude_first_query)
    stats.counts[:] = n - np.arange(n)
    stats.counts[0] -= int(exclude_first_query)
    return stats.means()


def test_uniform_head_is_never_a_previous_token_head_for_any_context_up_to_1024():
    # offsets 0 and 1 have exactly equal means (sum over i >= 1 of 1/(i+1), over n-1 queries);
    # float32 accumulation used to let rounding pick offset 1 for 939 of these 1023 lengths
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # 1023 small reductions: threads only add overhead (~10 s on one core)
    try:
        for n in range(2, 1025):
            df = classify_heads(_uniform_means(n))
            assert df["top_offset"].iloc[0] == 0, n
            assert not df["is_previous_token"].iloc[0], n
            assert df["n_tied"].iloc[0] == 2, n  # offsets 0 and 1, nothing else
            assert df["ratio"].iloc[0] == pytest.approx(1.0, abs=1e-6), n
    finally:
        torch.set_num_threads(threads)


@pytest.mark.float32
def test_uniform_heads_of_a_model_are_not_previous_token_heads_at_every_context(bridge):
    # the whole path (bridge pattern -> hook -> float64 sums -> tie rule) for every length the model takes
    for n in range(2, N + 1):
        df = classify_heads(accumulate_diagonals(bridge, _docs(2, n)).means()).set_index("head_name")
        for h in ("L0H0", "L1H1"):
            assert not df.loc[h, "is_previous_token"] and df.loc[h, "top_offset"] == 0, (n, h)
        assert df.loc["L0H1", "is_previous_token"], n


def test_ties_resolve_to_the_smallest_offset_only_within_the_tolerance():
    means = np.array([[[0.3, 0.3 * (1 + 1e-8), 0.2], [0.3, 0.3 * (1 + 1e-4), 0.2], [0.1, 0.4, 0.4]]])
    df = classify_heads(means)
    assert df["top_offset"].tolist() == [0, 1, 1]  # a 1e-4 difference is real; [0.1, 0.4, 0.4]: 1 before 2
    assert df["n_tied"].tolist() == [2, 1, 2]
    assert df["is_previous_token_post"].tolist() == [False, True, True]
    # over 3-token documents a uniform head gives offset 1 a mean of (1/2 + 1/3) / 2 = 0.417: the
    # 0.3 and 0.4 at offset 1 are below it, so neither head is a previous-token head for the finding
    assert df["prev_token_baseline"].iloc[0] == pytest.approx(5 / 12)
    assert df["is_previous_token"].tolist() == [False, False, False]
    assert df["rank"].isna().all() and df["rank_post"].tolist()[1:] == [1, 2]
    assert classify_heads(means, tie_rtol=1e-3)["top_offset"].tolist() == [0, 0, 1]


@pytest.mark.float32
def test_exact_previous_token_head_found_with_ratio_zero_and_rank_one(bridge):
    stats = accumulate_diagonals(bridge, _docs(3), batch_size=2)
    assert stats.n_documents == 3 and stats.n_tokens == 3 * N
    df = classify_heads(stats.means(), stats.detector_scores()).set_index("head_name")
    assert df.loc["L0H1", "is_previous_token"]
    assert df.loc["L0H1", "rank"] == 1
    assert df.loc["L0H1", "ratio"] < 1e-9  # exp(-30) planted, not a rounding error
    assert df.loc["L0H1", "prev_token_mass"] == pytest.approx(1.0, abs=FLOAT32_FORWARD_ABS)
    # uniform heads (zero scores) and the recency kernel L1H0 peak on the main diagonal
    for h in ("L0H0", "L1H1", "L1H0"):
        assert not df.loc[h, "is_previous_token"]
        assert df.loc[h, "top_offset"] == 0
        assert pd.isna(df.loc[h, "rank"])
    assert int(df["is_previous_token"].sum()) == 1


def test_rank_is_an_integer_column_with_gaps_through_a_written_table(tmp_path):
    """taxonomy.csv's P7 ``rank``: integers (1, 2, ...) for the previous-token heads, empty for
    the others; the sidecar records it as Int64 so that read_table gives integers, not floats."""
    from posmech.store.tables import read_meta, read_table

    means = np.zeros((1, 3, 4))
    means[0, 0] = [0.1, 0.8, 0.1, 0.0]  # previous-token, ratio 1/8
    means[0, 1] = [0.6, 0.3, 0.1, 0.0]  # not previous-token: no rank
    means[0, 2] = [0.2, 0.6, 0.2, 0.0]  # previous-token, ratio 1/3
    df = classify_heads(means)
    assert str(df["rank"].dtype) == "Int64"
    write_table(df, tmp_path / "taxonomy.csv")
    assert read_meta(tmp_path / "taxonomy.csv")["column_types"] == {"rank": "Int64", "rank_post": "Int64"}
    back = read_table(tmp_path / "taxonomy.csv").set_index("head_name")
    assert str(back["rank"].dtype) == "Int64" and back["rank"].tolist()[0] == 1 and pd.isna(back.loc["L0H1", "rank"])
    assert back.loc["L0H2", "rank"] == 2
    assert (tmp_path / "taxonomy.csv").read_text().splitlines()[1].split(",")[-2:] == ["1", "1"]  # not 1.0


@pytest.mark.float32
def test_uniform_head_means_are_exact(bridge):
    stats = accumulate_diagonals(bridge, _docs(2), exclude_first_query=True)
    means = stats.means()
    # uniform head: row i puts 1/(i+1) on every key; query 0 excluded
    expect = [np.mean([1 / (i + 1) for i in range(max(d, 1), N)]) for d in range(N)]
    np.testing.assert_allclose(means[0, 0], expect, rtol=1e-6)
    assert stats.counts.tolist() == [2 * (N - 1)] + [2 * (N - d) for d in range(1, N)]
    # the uniform causal baseline, from the counts alone, is exactly that head's means
    np.testing.assert_allclose(uniform_baseline(stats.counts, stats.n_documents), expect, rtol=FLOAT64_REL)
    np.testing.assert_allclose(means[0, 0], uniform_baseline(stats.counts, stats.n_documents), rtol=1e-6)
    with_q0_stats = accumulate_diagonals(bridge, _docs(2), exclude_first_query=False)
    with_q0 = with_q0_stats.means()
    assert with_q0[0, 0, 0] == pytest.approx(np.mean([1 / (i + 1) for i in range(N)]), rel=1e-6)
    np.testing.assert_allclose(uniform_baseline(with_q0_stats.counts, 2, exclude_first_query=False), with_q0[0, 0],
                               rtol=1e-6)
    # the exact previous-token head's offset-0 mean is then 1/N (query 0 has no choice)
    assert with_q0[0, 1, 0] == pytest.approx(1 / N, rel=1e-6)


@pytest.mark.float32
def test_head_detector_column_equals_transformerlens_detect_head(bridge):
    from transformer_lens.head_detector import detect_head

    text = "!\"#$%&'("  # characters of the hand-built vocabulary
    ids = bridge.to_tokens(text)[0].numpy()  # the tokens detect_head runs on (BOS first)
    assert 1 < len(ids) < N
    stats = accumulate_diagonals(bridge, [ids])
    tl = detect_head(bridge, text, "previous_token_head").numpy()
    np.testing.assert_allclose(stats.detector_scores(), tl, atol=FLOAT32_FORWARD_ABS)
    assert tl[0, 1] == pytest.approx((len(ids) - 1) / len(ids), abs=FLOAT32_FORWARD_ABS)


@pytest.mark.float32
def test_ragged_documents_are_batched_by_length(bridge):
    docs = _docs(2, 12) + _docs(1, 7, seed=1) + _docs(1, 12, seed=2)
    stats = accumulate_diagonals(bridge, docs, batch_size=8)
    assert stats.n_documents == 4 and stats.n_tokens == 12 * 3 + 7
    lengths = np.array([12, 12, 7, 12])
    expect = [int(np.clip(lengths - d, 0, None).sum()) - (4 if d == 0 else 0) for d in range(N)]
    assert stats.counts.tolist() == expect
    # the uniform head L0H0 on ragged documents: the baseline recovers the lengths from the counts
    np.testing.assert_allclose(stats.means()[0, 0], uniform_baseline(stats.counts, 4), rtol=1e-6)
    single = accumulate_diagonals(bridge, docs, batch_size=1)
    # other batch shapes, float32 rounding: relative, and absolute for the sums of exp(-30)-sized weights
    np.testing.assert_allclose(stats.sums, single.sums, rtol=FLOAT32_FORWARD_REL, atol=FLOAT32_FORWARD_ABS)


def test_rank_correlation_and_metadata():
    means = np.zeros((1, 4, 5))
    # four previous-token heads with ratios 0.1, 0.2, 0.3, 0.4
    for h, r in enumerate([0.1, 0.2, 0.3, 0.4]):
        means[0, h, 1], means[0, h, 0] = 0.5, 0.5 * r
    df = classify_heads(means, detector=np.array([[0.9, 0.8, 0.7, 0.6]]))
    assert df["rank"].tolist() == [1, 2, 3, 4]
    rc = rank_correlations(df)
    assert rc["spearman_ratio_vs_head_detector"] == pytest.approx(1.0)
    df2 = classify_heads(means, detector=np.array([[0.6, 0.7, 0.8, 0.9]]))
    assert rank_correlations(df2)["spearman_ratio_vs_head_detector"] == pytest.approx(-1.0)


def test_rank_correlations_equal_scipy_spearmanr_with_ties():
    """pandas' rank correlation gives tied values their average rank, as spearmanr does: on
    data with ties in both columns it equals spearmanr, and differs from ranking ties in
    order of appearance (so the ties decide the value)."""
    from scipy.stats import pearsonr, spearmanr

    ratio = np.array([0.2, 0.5, 0.5, 0.1, 0.9, 0.5, 0.3, 0.3])
    detector = np.array([0.7, 0.4, 0.4, 0.9, 0.1, 0.6, 0.4, 0.8])
    mass = np.array([0.9, 0.2, 0.2, 0.8, 0.2, 0.4, 0.6, 0.6])
    df = pd.DataFrame({"is_previous_token": [True] * 6 + [False] * 2, "ratio": ratio,
                       "head_detector_score": detector, "prev_token_mass": mass})
    rc = rank_correlations(df)
    prev = df["is_previous_token"].to_numpy()
    want_ratio = spearmanr(-ratio[prev], detector[prev]).statistic
    want_mass = spearmanr(mass, detector).statistic
    assert rc["spearman_ratio_vs_head_detector"] == pytest.approx(want_ratio, abs=1e-6)
    assert rc["spearman_prev_mass_vs_head_detector"] == pytest.approx(want_mass, abs=1e-6)
    assert (rc["n_heads_ratio_vs_head_detector"], rc["n_heads_prev_mass_vs_head_detector"]) == (6, 8)
    ordinal = pearsonr(pd.Series(mass).rank(method="first"), pd.Series(detector).rank(method="first")).statistic
    assert abs(ordinal - want_mass) > 0.05  # the ties matter here
    df.loc[0, "ratio"] = np.nan  # NaN: undefined, as spearmanr's NaN
    assert rank_correlations(df)["spearman_ratio_vs_head_detector"] is None


def test_taxonomy_scorecard_rows_from_known_ranking():
    means = np.zeros((2, 2, 3))  # 3-token documents: a uniform head gives offset 1 a mean of 5/12
    means[:, :, 0] = 0.5  # L0H0: main diagonal
    means[0, 1, 1], means[0, 1, 0] = 0.6, 0.12  # L0H1: previous-token, ratio 0.2
    means[1, 0, 1], means[1, 0, 0] = 0.6, 0.06  # L1H0: previous-token, ratio 0.1 (sharper)
    means[1, 1, 1], means[1, 1, 0] = 0.45, 0.44  # L1H1: peaks at offset 1, 0.033 above uniform: the post's only
    df = classify_heads(means, detector=np.array([[0.0, 0.5], [0.9, 0.0]]))
    meta = {"n_heads": 4, "n_documents": 7, "spearman_ratio_vs_head_detector": 1.0, "prev_token_min_excess": 0.1}
    card = {r["quantity"]: r for r in taxonomy_scorecard(df, meta, "m", "bible", 64, "fig.png", "t.csv")}
    assert card["n_prev_token_heads"]["value"] == 2 and card["prev_token_head_fraction"]["value"] == 0.5
    assert card["sharpest_prev_token_head"]["value"] == ["L1H0"]
    assert card["diagonal_ratio"]["value"] == {"L1H0": 0.1, "L0H1": 0.2}
    # the post's loose definition counts L1H1 too (the published comparison reads these)
    assert card["n_prev_token_heads_post"]["value"] == 3 and card["prev_token_head_fraction_post"]["value"] == 0.75
    assert card["diagonal_ratio_post"]["value"] == {"L1H0": 0.1, "L0H1": 0.2, "L1H1": round(0.44 / 0.45, 4)}
    assert card["sharpest_prev_token_head_post"]["value"] == ["L1H0"]
    assert "0.1 more attention there than a uniform causal head" in card["prev_token_head_fraction"]["detail"]
    assert "7 bible documents of 64 tokens" in card["n_prev_token_heads"]["detail"]
    assert {r["claim"] for r in card.values()} == {"P6", "P7"} and {r["model"] for r in card.values()} == {"m"}


def test_a_uniform_head_is_not_a_previous_token_head_a_planted_one_is():
    """The finding's definition reads the offset-1 mean against a uniform causal head's: a
    nearly uniform head whose largest mean is at offset 1 by a hair (the post's definition
    counts it) is not a previous-token head; one with 0.3 of every query's attention planted
    on the previous key (the rest uniform) is, and so is the exact one.  The margin is the
    argument ``min_excess`` (``taxonomy.prev_token_min_excess``)."""
    n = 32
    q = np.arange(n)[:, None]
    k = np.arange(n)[None, :]
    causal = (k <= q).astype(float)
    uniform = causal / causal.sum(1, keepdims=True)
    tilted = uniform.copy()  # offset 1 gets 1 % more than the rest, renormalised
    tilted[q[1:, 0], q[1:, 0] - 1] *= 1.01
    tilted /= tilted.sum(1, keepdims=True)
    planted = 0.7 * uniform
    planted[q[1:, 0], q[1:, 0] - 1] += 0.3
    planted[0, 0] = 1.0
    exact = np.eye(n, k=-1)
    exact[0, 0] = 1.0
    patterns = torch.tensor(np.stack([uniform, tilted, planted, exact]))[None]  # [1, 4 heads, n, n]
    stats = DiagonalStats(np.zeros((1, 4, n)), np.zeros(n, np.int64), np.zeros((1, 4)))
    add_pattern(stats, 0, patterns)
    stats.counts[:] = n - np.arange(n)
    stats.counts[0] -= 1
    stats.n_documents = 1
    base = uniform_baseline(stats.counts, 1)
    assert base[1] == pytest.approx((sum(1 / j for j in range(1, n + 1)) - 1) / (n - 1))  # (H_32 - 1) / 31
    df = classify_heads(stats.means(), baseline=base).set_index("head_name")
    assert df["prev_token_excess"].tolist() == pytest.approx([0.0, df.loc["L0H1", "prev_token_excess"],
                                                              0.3 * (1 - base[1]), 1 - base[1]])
    assert 0 < df.loc["L0H1", "prev_token_excess"] < 0.005
    assert df["is_previous_token_post"].tolist() == [False, True, True, True]
    assert df["is_previous_token"].tolist() == [False, False, True, True]
    assert df["rank"].tolist()[2:] == [2, 1] and pd.isna(df.loc["L0H1", "rank"])
    # the margin decides: 0.3 planted is 0.27 above uniform, not 0.3 above it
    strict = classify_heads(stats.means(), baseline=base, min_excess=0.28)
    assert strict["is_previous_token"].tolist() == [False, False, False, True]
    with pytest.raises(PosmechError, match="baseline has shape"):
        classify_heads(stats.means(), baseline=base[:-1])


def test_the_baseline_of_a_sliding_window_layer_is_its_own_uniform_head():
    """A uniform head of a layer whose queries see their last ``w`` keys gives query i the share
    1/min(i+1, w) (0 from offset w on): the baseline of each layer follows its window, so on
    GPT-Neo's local layers (window 8 at context 32: 0.152 on offset 1, against 0.099 without)
    a uniform head is not a previous-token head either."""
    from posmech.models.architecture import attention_windows

    n, w = 32, 8
    q, k = np.arange(n)[:, None], np.arange(n)[None, :]
    seen = ((k <= q) & (k > q - w)).astype(float)
    pattern = torch.tensor(seen / seen.sum(1, keepdims=True))[None, None]
    stats = DiagonalStats(np.zeros((2, 1, n)), np.zeros(n, np.int64), np.zeros((2, 1)))
    add_pattern(stats, 1, pattern)
    add_pattern(stats, 0, torch.tensor(np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None])[None, None])
    stats.counts[:] = n - np.arange(n)
    stats.counts[0] -= 1
    stats.n_documents = 1
    base = np.stack([uniform_baseline(stats.counts, 1), uniform_baseline(stats.counts, 1, window=w)])
    np.testing.assert_allclose(stats.means(), base[:, None, :], rtol=1e-12, atol=1e-15)
    assert base[1, 1] == pytest.approx((sum(1 / j for j in range(2, w + 1)) + (n - w) / w) / (n - 1))
    assert (base[1, w:] == 0).all()
    df = classify_heads(stats.means(), baseline=base)
    assert df["prev_token_excess"].abs().max() < 1e-12 and not df["is_previous_token"].any()
    cfg = {"model_type": "gpt_neo", "attention_types": [[["global", "local"], 2]], "window_size": w}
    assert attention_windows(cfg, 4) == [0, w, 0, w]
    assert attention_windows({"model_type": "mistral", "sliding_window": 16}, 2) == [16, 16]
    assert attention_windows({"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 16,
                              "max_window_layers": 1}, 3) == [0, 16, 16]
    assert attention_windows({"model_type": "llama", "sliding_window": 16,
                              "layer_types": ["full_attention", "sliding_attention"]}, 2) == [0, 16]
    assert attention_windows({"model_type": "gpt2"}, 3) == [0, 0, 0]


def test_the_baseline_of_an_alibi_head_is_its_bias_alone():
    """ALiBi heads with zero query-key scores attend by their bias alone, softmax(-m·d): that is
    their baseline (not the uniform one), so a random-init BLOOM head, close to it, is no
    previous-token head while its slope-0.25 bias puts 0.198 on offset 1 at context 32."""
    from posmech.models.scores import alibi_slopes

    n = 32
    slopes = alibi_slopes(4)
    q, k = np.arange(n)[:, None], np.arange(n)[None, :]
    scores = np.where(k <= q, -slopes[:, None, None] * (q - k), -np.inf)
    pattern = torch.softmax(torch.tensor(scores), -1)[None]  # [1, 4, n, n]
    stats = DiagonalStats(np.zeros((1, 4, n)), np.zeros(n, np.int64), np.zeros((1, 4)))
    add_pattern(stats, 0, pattern)
    stats.counts[:] = n - np.arange(n)
    stats.counts[0] -= 1
    stats.n_documents = 1
    base = np.stack([uniform_baseline(stats.counts, 1, slope=m) for m in slopes])[None]
    np.testing.assert_allclose(stats.means(), base, rtol=1e-10)
    assert base[0, 0, 1] == pytest.approx(0.198, abs=1e-3)
    df = classify_heads(stats.means(), baseline=base)
    assert df["prev_token_excess"].abs().max() < 1e-12 and not df["is_previous_token"].any()
    # against the uniform baseline the slope-0.25 head would be 0.098 above it
    assert classify_heads(stats.means())["prev_token_excess"].iloc[0] == pytest.approx(0.099, abs=1e-3)


def _published_like_table() -> pd.DataFrame:
    """gpt2-shaped table whose ranking is the published P7 top 11."""
    published = {"L4H11": 0.01, "L5H6": 0.18, "L3H3": 0.33, "L2H2": 0.331, "L6H8": 0.43, "L7H0": 0.45,
                 "L2H4": 0.46, "L1H0": 0.47, "L3H7": 0.50, "L8H7": 0.51, "L3H2": 0.52, "L9H1": 0.9}
    means = np.zeros((12, 12, 6))
    means[:, :, 0] = 0.3  # not previous-token by default
    for head, r in published.items():
        layer, h = (int(x) for x in head[1:].split("H"))
        means[layer, h, :] = 0
        means[layer, h, 1], means[layer, h, 2] = 0.6, 0.6 * r
    return classify_heads(means, detector=np.zeros((12, 12)))


def test_choose_heads_rule_reproduces_the_posts_sharp_and_early_heads(tmp_path):
    df = _published_like_table()
    chosen = choose_heads(df, "gpt2", early_top_n=11)
    assert list(chosen.columns) == HEADS_COLUMNS
    write_table(chosen, tmp_path / "heads.csv", {"claim": "P6,P7"})
    heads = read_chosen_heads(tmp_path / "heads.csv")
    assert heads["sharp"] == ["L4H11"]
    assert set(heads["early"]) == {"L3H3", "L2H2", "L2H4", "L1H0", "L3H7", "L3H2"}
    assert heads["early"][0] == "L3H3"  # best first
    # pinned heads override the rule
    pinned = choose_heads(df, "gpt2", pin={"sharp": "L5H6", "early": ["L2H2"]})
    assert pinned["head_name"].tolist() == ["L5H6", "L2H2"]
    assert (pinned["rule"] == "pinned in config taxonomy.pin").all()
    with pytest.raises(PosmechError, match="taxonomy.pin.gpt2.sharp"):
        choose_heads(df, "gpt2", pin={"sharp": "L12H0"})


def test_choose_heads_fallback_when_sharp_head_is_in_layer_zero():
    means = np.zeros((2, 3, 4))
    means[0, 0, 1], means[0, 0, 0] = 0.9, 0.05  # sharp, layer 0
    means[1, 2, 1], means[1, 2, 0] = 0.5, 0.3
    means[0, 1, 0] = 0.9  # not previous-token
    means[1, 0, 0], means[1, 1, 0] = 0.5, 0.5
    chosen = choose_heads(classify_heads(means, np.zeros((2, 3))), "demo")
    assert chosen["head_name"].tolist() == ["L0H0", "L1H2"]
    assert chosen["rule"].iloc[1].startswith("fallback")
    no_prev = np.zeros((1, 2, 3))
    no_prev[:, :, 0] = 1
    no_prev[0, 1, 1] = 0.4
    fallback = choose_heads(classify_heads(no_prev, np.zeros((1, 2))), "demo")
    assert fallback["head_name"].tolist() == ["L0H1"] and fallback["rule"].iloc[0].startswith("fallback (no previous-token")
    assert read_chosen_heads_roundtrip(fallback)["early"] == []


def read_chosen_heads_roundtrip(df: pd.DataFrame) -> dict:
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        write_table(df, Path(tmp) / "heads.csv")
        return read_chosen_heads(Path(tmp) / "heads.csv")


def test_read_chosen_heads_rejects_bad_tables(tmp_path):
    p = tmp_path / "heads.csv"
    write_table(chosen_heads_frame("m", [{"role": "early", "head_name": "L0H1", "score": 0.1, "rule": "x"}]), p)
    with pytest.raises(PosmechError, match="exactly one `sharp`"):
        read_chosen_heads(p)
    with pytest.raises(PosmechError, match=r"rerun rule `taxonomy` \(analysis `diagonal_taxonomy`\)"):
        read_chosen_heads(tmp_path / "absent.csv")
    with pytest.raises(PosmechError, match="L<layer>H<head>"):
        chosen_heads_frame("m", [{"role": "sharp", "head_name": "4.11", "score": 0, "rule": "x"}])


def test_full_context_documents_selects_long_documents_and_names_the_key():
    from posmech.analyses.taxonomy import full_context_documents
    from posmech.data.tokens import TokenSet

    lengths = [12, 5, 12, 9, 12]
    flat = np.concatenate([np.arange(n) for n in lengths])
    ts = TokenSet(flat, np.concatenate([[0], np.cumsum(lengths)]), {"n_ctx": 12}, [""] * 5)
    docs, ctx = full_context_documents(ts, 2, None)
    assert ctx == 12 and len(docs) == 2 and all(len(d) == 12 for d in docs)
    docs, ctx = full_context_documents(ts, 10, 9)
    assert ctx == 9 and [len(d) for d in docs] == [9, 9, 9, 9]
    with pytest.raises(PosmechError, match="taxonomy.context"):
        full_context_documents(ts, 2, 20)


def test_taxonomy_settings_resolve_the_corpus_and_the_pins():
    from posmech.settings import defaults

    s = defaults("taxonomy", {"corpora": {"web": {}, "bible": {}}}, pin={"gpt2": {"sharp": "L4H11"}})
    assert s.corpus == "web" and s.pinned("gpt2") == {"sharp": "L4H11"} and s.pinned("other") is None
    assert defaults("taxonomy", corpus="bible").corpus == "bible"
