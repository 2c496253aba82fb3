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


class _Tokens:
    """The part of posmech.data.tokens.TokenSet that samples_of reads."""

    def __init__(self, lengths, n_ctx):
        self.docs = [np.arange(1, n + 1) for n in lengths]
        self.attrs = {"n_ctx": n_ctx}

    def lengths(self):
        return np.array([len(d) for d in self.docs])

    def doc(self, j):
        return self.docs[j]


def test_samples_take_t_tokens_or_the_models_shorter_context():
    toks = _Tokens([80, 20, 70, 64, 40], n_ctx=1024)
    docs, T = sk.samples_of(toks, 2, 64, 1024)
    assert T == 64 and [len(d) for d in docs] == [64, 64]  # the first two long enough: 80, 70
    docs, T = sk.samples_of(_Tokens([40, 20, 33], n_ctx=32), 5, 64, None)  # BLOOM: the config's n_ctx 32
    assert T == 32 and len(docs) == 2
    docs, T = sk.samples_of(_Tokens([40, 20, 33], n_ctx=None), 5, 64, 16)  # the model's own context 16
    assert T == 16 and len(docs) == 3
    with pytest.raises(PosmechError, match="sinks.n_tokens"):
        sk.samples_of(_Tokens([40, 20], n_ctx=1024), 5, 64, 1024)


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


def test_samples_too_short_for_the_metric_are_not_measurable():
    a = _alpha0({(2, 0): 0.9})
    heads = sk.head_table(a, "m", 0.3, 0.9)
    assert sk.sink_scorecard(a, heads, "m", 0.3, 2, "learned", "", 10)[0]["value"] == pytest.approx(1 / 6)
    card = sk.sink_scorecard(a, heads, "m", 0.3, 2, "learned", "", 9)  # H_9 / 9 = 0.314
    assert [r["claim"] for r in card] == ["S1", "S2", "S3", "S3"]
    assert all(r["value"] is None and "0.314" in r["detail"] for r in card)


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


# --------------------------------------------------------------------------- heads.csv and the peer
def test_sink_heads_join_the_head_roles_table_and_view():
    from posmech.report.head_roles import ROLES, holders
    from posmech.verdicts.heads import HEAD_COLUMNS, head_table

    a = _alpha0({(2, 0): 0.9, (1, 1): 0.35})
    df = head_table("m", sinks=sk.head_table(a, "m", 0.3, 0.9))
    assert list(df.columns) == HEAD_COLUMNS and len(df) == 6
    r = df.set_index("head_name")
    assert r.loc["L2H0", "sink_alpha0"] == pytest.approx(0.9) and r.loc["L2H0", "sink"]
    assert not r.loc["L0H0", "sink"] and df["previous_token"].isna().all()  # taxonomy not given: empty
    role = next(x for x in ROLES if x.claims == "S1")
    assert [h for h, _ in holders(df, role)] == ["L2H0", "L1H1"]  # best first
    with pytest.raises(PosmechError, match="sink_heads.csv lacks.*attention_sinks"):
        head_table("m", sinks=sk.head_table(a, "m", 0.3, 0.9).drop(columns=["is_sink"]))


M = 9  # distinct characters R of the sequence [BOS] R R: n = 2M + 1 = 19 tokens, below the context 24
PEER_CTX = 24


@pytest.fixture(scope="module")
def peer(tmp_path_factory):
    """A GPT-2-architecture model on the TransformerBridge in compatibility mode: an exact
    previous-token head L0H1, the other heads uniform (posmech's own engine is not involved)."""
    spec = hb.positional_spec(n_ctx=PEER_CTX, n_layer=2, n_head=2, d_vocab=96,
                              scores={(0, 1): hb.previous_token_scores(PEER_CTX)})
    path = hb.save_model_dir(spec, tmp_path_factory.mktemp("peer") / "m")
    return load_bridge({"name": "peer", "hf_dir": str(path)}, "cpu", "float32", "compatibility")


@pytest.mark.float32
def test_transformerlens_detect_head_agrees_through_the_stated_relations(peer):
    """TransformerLens's ``detect_head`` "mul" score of a head on one sequence of n tokens is
    sum over (q, k) of A[q, k] D[q, k] / sum A = (sum over the detection pattern's pairs) / n,
    every row of A summing to 1. Previous-token: D = the sub-diagonal, n - 1 pairs, and ours
    (the taxonomy's mean attention at offset -1, query 0 left out) is their sum / (n - 1):
    TL = ours (n - 1) / n. Induction: D[q, k] = 1 when token k - 1 equals token q (an earlier
    position, k <= q); on [BOS] R R with R distinct those pairs are exactly the M queries of the
    second copy with the key after the token's first occurrence, ours (attn_only.induction_score)
    is their mean: TL = ours M / n."""
    from transformer_lens.head_detector import detect_head

    from posmech.analyses import attn_only as ao
    from posmech.analyses.taxonomy import accumulate_diagonals

    text = "abcdefghi" * 2
    ids = peer.to_tokens(text)[0].numpy()
    n = len(ids)
    assert n == 2 * M + 1 and ids[0] == 0 and len(set(ids[1:M + 1].tolist())) == M
    prev = accumulate_diagonals(peer, [ids], exclude_first_query=True).means()[:, :, 1]  # [L, H]
    fwd = ao.run_variant(peer, ids[None, :], "both")
    ind = ao.induction_score(fwd.patterns, M, bos=True).reshape(2, 2)
    tl_prev = detect_head(peer, text, "previous_token_head").numpy()
    tl_ind = detect_head(peer, text, "induction_head").numpy()
    np.testing.assert_allclose(tl_prev, prev * (n - 1) / n, rtol=0, atol=FLOAT32_FORWARD_ABS)
    np.testing.assert_allclose(tl_ind, ind * M / n, rtol=0, atol=FLOAT32_FORWARD_ABS)
    assert prev[0, 1] == pytest.approx(1.0, abs=FLOAT32_FORWARD_ABS)  # the planted head: ours 1, TL (n-1)/n
    # a uniform head: induction key q - M + 1 of query q gets 1 / (q + 1)
    want = np.mean([1 / (q + 1) for q in range(M + 1, n)])
    assert ind[1, 0] == pytest.approx(want, abs=FLOAT32_FORWARD_ABS)
    # the sink metric on the same pass: the uniform heads' alpha[0] is H_n / n
    alpha0 = sk.key_scores(fwd.patterns[0])[:, 0].reshape(2, 2)
    assert alpha0[1, 0] == pytest.approx(sk.uniform_alpha0(n), abs=FLOAT32_FORWARD_ABS)


@pytest.mark.float32
@pytest.mark.parametrize("name", ["helix", "sink-late", "sink-early", "massive-activation", "alibi-sinks"])
def test_the_self_check_cases_give_their_expected_sink_verdicts(name, tmp_path):
    """The S verdicts the self-check expects of these cases (posmech.verdicts.selfcheck.CASES),
    from this family's library on the case's model (raw processing, as config/selfcheck.yaml)
    and the findings' default thresholds. alibi-sinks' samples start with BOS (id 0), as its
    config entry's prepend_bos makes the pipeline's."""
    from posmech.core.config import load_schema
    from posmech.core.io import REPO
    from posmech.verdicts import findings as fd
    from posmech.verdicts import selfcheck as sc

    case = sc.cases()[name]
    bridge = load_bridge({"name": name, "hf_dir": str(case.write(tmp_path / name))}, "cpu", "float32", "raw")
    rng = np.random.default_rng(1)
    samples = [rng.integers(1, sc.D_VOCAB, sc.N_CTX) for _ in range(4)]
    if case.kind == "bloom":
        samples = [np.r_[0, x[1:]] for x in samples]
    col = sk.run_sinks(bridge, samples, batch_size=4, progress=False)
    s = defaults("sinks")
    positions, slopes = sk.positions_and_slopes(bridge.cfg)
    heads = sk.head_table(col.alpha0, name, s.epsilon, s.first_token_alpha, slopes)
    card = sk.sink_scorecard(col.alpha0, heads, name, s.epsilon, s.early_layers, positions, "")
    card += sk.massive_scorecard(sk.massive_summary(sk.activation_table(col.rows, name)), name, "")
    rows = {r["quantity"]: r for r in card}
    schema = load_schema(REPO / "workflow" / "schemas" / "config.schema.yaml")
    thresholds = {k: v["default"] for k, v in schema["properties"]["findings"]["properties"].items()}
    findings = {f.claim: f for f in fd.load_findings(REPO / "resources" / "findings.yaml")}
    for claim, (want, _) in case.expected.items():
        if claim.startswith("S") and findings[claim].rule in ("attention_sinks", "massive_activations"):
            f = findings[claim]
            v = fd.judge(f, name, thresholds, rows[f.quantity], True)
            assert v.verdict == want, (name, claim, v)
    if name == "alibi-sinks":  # the planted sinks, the ALiBi-only heads, and S3's rank correlation
        a0 = heads["alpha0_mean"].to_numpy().reshape(2, 16)
        assert a0[:, :sc.ALIBI_SINK_HEADS].min() > 1 - FLOAT32_FORWARD_ABS
        assert np.all(np.diff(a0[:, sc.ALIBI_SINK_HEADS:], axis=1) > 0)  # shallower slope, more on key 0
        assert a0[:, sc.ALIBI_SINK_HEADS:].max() < s.epsilon
        assert rows["sink_ratio"]["value"] == pytest.approx(0.5)
        assert rows["alpha0_slope_spearman"]["value"] == pytest.approx(0.67, abs=0.01)


@pytest.mark.float32
@pytest.mark.parametrize("arch,scheme", [("gpt_neo", "learned"), ("opt", "learned"), ("neox", "rotary"),
                                         ("llama", "rotary"), ("bloom", "alibi")])
def test_every_position_scheme_gives_hugging_faces_alpha(arch, scheme, tmp_path):
    """Learned, rotary and ALiBi models (random-init tiny ones, tests/tiny_archs.py) through
    posmech's model loading: alpha of every (sample, layer, head) equals Gu et al.'s formula on
    Hugging Face's own eager attention weights (what their eval_sink_open_source.py reads), and
    an ALiBi model gets BLOOM's slopes (S3)."""
    import torch

    from posmech.models.loading import load_hf, load_model
    from tests import tiny_archs

    d = getattr(tiny_archs, arch)(tmp_path / arch)
    man = {"name": arch, "hf_dir": str(d)}
    model = load_model(man, "cpu", "float32", "raw")
    rng = np.random.default_rng(2)
    samples = [rng.integers(1, tiny_archs.V, 16) for _ in range(3)]
    col = sk.run_sinks(model, samples, batch_size=3, progress=False)
    hf, _ = load_hf(man, "cpu", "float32")
    hf.config._attn_implementation = "eager"
    with torch.no_grad():
        att = hf(torch.as_tensor(np.stack(samples)), output_attentions=True).attentions  # L x [B, H, T, T]
    want = sk.key_scores(np.stack([a.numpy() for a in att], axis=1))  # [B, L, H, T]
    np.testing.assert_allclose(col.alpha_all, want, rtol=0, atol=FLOAT32_FORWARD_ABS)
    # every row of A sums to 1: sum_k alpha[k] (T - k) = T
    np.testing.assert_allclose((col.alpha_all * (16 - np.arange(16))).sum(-1), 16.0, rtol=0, atol=1e-4)
    got, slopes = sk.positions_and_slopes(model.cfg)
    assert got == scheme
    if scheme == "alibi":
        np.testing.assert_allclose(slopes, [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8], rtol=0, atol=FLOAT64_ABS)
    else:
        assert slopes is None
