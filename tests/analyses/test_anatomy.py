"""Score anatomy (P12) and score taxa (P13) on hand-built heads with known score matrices."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from posmech.analyses import anatomy as sa
from posmech.core.errors import PosmechError
from posmech.models import handbuilt as hb
from posmech.models import scores
from posmech.models.loading import load_bridge
from posmech.settings import defaults

from tests.tolerances import FLOAT32_FORWARD_ABS, FLOAT32_FORWARD_REL, FLOAT64_ABS, float32_logit_tol

N = 40
W = 5
ALPHA, GAMMA, BETA = 1.0, 3.0, 4.0


def _offsets(n: int) -> np.ndarray:
    i = np.arange(n)
    return i[None, :] - i[:, None]  # [query n, key i] = i - n


def dark(n: int = N) -> np.ndarray:
    """``α·(i − n) − γ·[i = n]``: later keys score higher, self suppressed."""
    return ALPHA * _offsets(n) - GAMMA * np.eye(n)


def bright(n: int = N) -> np.ndarray:
    """``β·[i = n − 1]``: the previous key scores higher."""
    return BETA * (_offsets(n) == -1)


def first_position(n: int = N) -> np.ndarray:
    S = np.zeros((n, n))
    S[:, 0] = 5.0
    return S


HEADS = {(0, 0): dark(), (0, 1): bright(), (0, 3): first_position()}  # (0, 2): uniform (zero scores)
EXPECTED = {"L0H0": "dark diagonal", "L0H1": "bright sub-diagonal", "L0H2": "neither", "L0H3": "neither"}


@pytest.fixture(scope="module")
def bridge(tmp_path_factory):
    spec = hb.positional_spec(n_ctx=N, n_layer=1, n_head=4, scores=HEADS)
    path = hb.save_model_dir(spec, tmp_path_factory.mktemp("anatomy") / "taxa")
    return load_bridge({"name": "taxa", "hf_dir": str(path)}, device="cpu")


def _docs(k: int, n: int = N) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [np.concatenate([[0], rng.integers(1, 40, n - 1)]) for _ in range(k)]


def _windows(S: np.ndarray, window: int = W) -> np.ndarray:
    rows = sa.query_rows(S.shape[0], window, None)
    return np.stack([S[r, r - window: r + window + 1] for r in rows])


# --------------------------------------------------------------------------- features (pure)
def test_row_features_of_the_hand_built_profiles_are_the_closed_forms():
    o = sa.offsets(W).astype(float)
    win = ALPHA * o - GAMMA * (o == 0)
    f = sa.row_features(win[None])[0]
    spread = win.std()
    # the quadratic through the other offsets is exactly α·o: dip = γ, bump = 0, trend = W·α
    np.testing.assert_allclose(f, [GAMMA / spread, 0.0, W * ALPHA / spread], atol=FLOAT64_ABS)
    win = BETA * (o == -1)
    np.testing.assert_allclose(sa.row_features(win[None])[0], [0.0, BETA / win.std(), 0.0], atol=FLOAT64_ABS)
    # scale and shift invariant; a flat row shows nothing
    np.testing.assert_allclose(sa.row_features(7.0 * win[None] - 3.0), sa.row_features(win[None]), atol=FLOAT64_ABS)
    np.testing.assert_array_equal(sa.row_features(np.full((2, 2 * W + 1), 4.2)), 0.0)


def test_window_must_leave_neighbours_for_the_fit():
    with pytest.raises(PosmechError, match="anatomy.window"):
        sa.row_features(np.zeros((1, 5)))


def test_query_rows_keep_windows_inside_the_document_and_off_position_0():
    rows = sa.query_rows(40, 5, None)
    assert rows[0] == 6 and rows[-1] == 34  # n - W >= 1 and n + W <= 39
    assert len(sa.query_rows(40, 5, 7)) == 7 and sa.query_rows(40, 5, 7)[0] == 6
    assert len(sa.query_rows(10, 5, None)) == 0


@pytest.mark.parametrize("sigma", [0.1, 0.3])
def test_features_are_stable_under_gaussian_noise(sigma):
    """Noise of standard deviation sigma·α on every score (the trend step is α = 1, the
    dip γ = 3, the bump β = 4): median features move by < 0.1 (sigma 0.1) / 0.25 (sigma
    0.3) row spreads, and the taxa do not change."""
    rng = np.random.default_rng(1)
    th = defaults("anatomy").taxa
    n = 400
    clean = np.stack([_windows(dark(n)), _windows(bright(n)), _windows(np.zeros((n, n)))])
    noisy = np.stack([_windows(S + sigma * ALPHA * rng.normal(size=(n, n)))
                      for S in (dark(n), bright(n), np.zeros((n, n)))])
    fc, fn = sa.row_features(clean)[None], sa.row_features(noisy)[None]
    taxa_c, taxa_n = sa.classify_taxa(fc, th), sa.classify_taxa(fn, th)
    assert taxa_c["taxon"].tolist() == taxa_n["taxon"].tolist() == ["dark diagonal", "bright sub-diagonal", "neither"]
    tol = 0.1 if sigma <= 0.1 else 0.25
    diff = (taxa_c.loc[:1, ["dip", "bump", "trend"]] - taxa_n.loc[:1, ["dip", "bump", "trend"]]).abs()
    assert diff.to_numpy().max() < tol
    # pure noise: features centred on 0, about half the rows above 0 -> below fraction_min
    assert abs(taxa_n.loc[2, "dip"]) < 0.1 and taxa_n.loc[2, "frac_dip"] < th.fraction_min


def test_taxon_rules_follow_the_thresholds():
    def feats(dip, bump, trend, frac=1.0, rows=10):
        f = np.zeros((1, 1, rows, 3))
        k = int(round(frac * rows))
        f[0, 0, :k] = [dip, bump, trend]
        f[0, 0, k:] = [-1.0, -1.0, -1.0]
        return f

    th = defaults("anatomy", taxa={"row_min": 0.25, "dip_min": 0.5, "bump_min": 0.5, "fraction_min": 0.7,
                                   "trend_min": 0.0}).taxa
    assert sa.classify_taxa(feats(1.0, 0, 1), th)["taxon"][0] == "dark diagonal"
    assert sa.classify_taxa(feats(1.0, 0, -1), th)["taxon"][0] == "neither"  # later keys must not score lower
    assert sa.classify_taxa(feats(1.0, 0, -1), th.replace(trend_min=None))["taxon"][0] == "dark diagonal"
    assert sa.classify_taxa(feats(1.0, 0, 1, frac=0.6), th)["taxon"][0] == "neither"  # too few rows show it
    assert sa.classify_taxa(feats(0, 2.0, 0), th)["taxon"][0] == "bright sub-diagonal"
    assert sa.classify_taxa(feats(0.6, 2.0, 1), th)["taxon"][0] == "bright sub-diagonal"  # both: 4x > 1.2x
    assert sa.classify_taxa(feats(2.0, 0.6, 1), th)["taxon"][0] == "dark diagonal"
    with pytest.raises(PosmechError, match="at least one row"):
        sa.classify_taxa(np.zeros((1, 1, 0, 3)), th)


# --------------------------------------------------------------------------- on the model
@pytest.mark.float32
def test_hand_built_heads_get_their_taxa(bridge):
    prof = sa.score_profiles(bridge, _docs(3), W, None, batch_size=2)
    assert prof.windows.shape == (1, 4, 3 * (N - 2 * W - 1), 2 * W + 1)
    assert prof.max_check_error < 1e-3
    taxa = sa.classify_taxa(prof.features, defaults("anatomy").taxa).set_index("head_name")
    assert taxa["taxon"].to_dict() == EXPECTED
    o = sa.offsets(W)
    spread = (ALPHA * o - GAMMA * (o == 0)).std()
    assert taxa.loc["L0H0", "dip"] == pytest.approx(GAMMA / spread, rel=1e-4)
    assert taxa.loc["L0H0", "trend"] == pytest.approx(W * ALPHA / spread, rel=1e-4)
    assert taxa.loc["L0H0", "frac_dip"] == 1.0 and taxa.loc["L0H1", "frac_bump"] == 1.0
    assert abs(taxa.loc["L0H0", "bump"]) < 1e-4 and abs(taxa.loc["L0H1", "dip"]) < 1e-4
    # the windows are exactly the hand-built scores at the recorded (query, offset)
    np.testing.assert_allclose(prof.windows[0, 0], _windows(dark()).tolist() * 3, atol=1e-4)


@pytest.mark.float32
def test_rows_per_document_subsamples_and_batches_do_not_change_the_rows(bridge):
    a = sa.score_profiles(bridge, _docs(4), W, 5, batch_size=1)
    b = sa.score_profiles(bridge, _docs(4), W, 5, batch_size=3)
    assert a.windows.shape[2] == 4 * 5 and list(a.documents) == [d for d in range(4) for _ in range(5)]
    # score windows (logits of the attention softmax) from passes of other batch shapes: float32 rounding
    np.testing.assert_allclose(a.windows, b.windows, rtol=0, atol=float32_logit_tol(b.windows))
    with pytest.raises(PosmechError, match="anatomy.window"):
        sa.score_profiles(bridge, [np.arange(8)], W)


@pytest.mark.float32
def test_raw_scores_equal_an_independent_q_k_product_and_masked_equal_hook_attn_scores(bridge):
    doc = _docs(1)[0]
    panels = sa.head_scores(bridge, doc, ["L0H0", "L0H1"])
    # independent: q and k from the model's own weights on the post-LN residual (positional only)
    with torch.inference_mode():
        _, cache = bridge.run_with_cache(torch.as_tensor(doc)[None])
    x = cache["blocks.0.ln1.hook_normalized"][0].double().numpy()
    for p, h in zip(panels, (0, 1)):
        Wq = bridge.blocks[0].attn.W_Q[h].detach().double().numpy()
        Wk = bridge.blocks[0].attn.W_K[h].detach().double().numpy()
        bq = bridge.blocks[0].attn.b_Q[h].detach().double().numpy()
        bk = bridge.blocks[0].attn.b_K[h].detach().double().numpy()
        ref = ((x @ Wq + bq) @ (x @ Wk + bk).T) / np.sqrt(bridge.cfg.d_head)
        np.testing.assert_allclose(p.raw, ref, atol=1e-4)
        np.testing.assert_allclose(p.raw, HEADS[(0, h)], atol=1e-4)  # the hand-built matrix, future included
        unmasked = np.isfinite(p.hook_scores)
        assert (unmasked == np.tril(np.ones((N, N), dtype=bool))).all()
        assert (np.isfinite(p.masked) == unmasked).all()
        # another q·k product than the model's, scores up to |s| = 39: float32 rounding
        np.testing.assert_allclose(p.masked[unmasked], p.hook_scores[unmasked], rtol=0,
                                   atol=float32_logit_tol(p.hook_scores[unmasked]))
        np.testing.assert_allclose(p.pattern, p.hook_pattern, atol=FLOAT32_FORWARD_ABS)
    table = sa.scores_table(panels, {"L0H0": "early", "L0H1": "sharp"}, W).set_index("head_name")
    assert table.loc["L0H0", "dip"] > 0.5 and table.loc["L0H1", "bump"] > 0.5
    assert table["max_abs_diff_masked_vs_hook"].max() < 1e-4 and table["masked_entries_agree"].all()
    assert table.loc["L0H0", "raw_future_max"] == pytest.approx(ALPHA * (N - 1), rel=FLOAT32_FORWARD_REL)


def test_a_wrong_attention_scale_is_caught(bridge, monkeypatch):
    monkeypatch.setattr(scores, "attn_scale", lambda cfg: 1.0)
    with pytest.raises(PosmechError, match="hook_attn_scores"):
        sa.head_scores(bridge, _docs(1)[0], ["L0H0"])
    with pytest.raises(PosmechError, match="hook_attn_scores"):
        sa.score_profiles(bridge, _docs(1), W)


def test_unknown_head_is_an_error(bridge):
    with pytest.raises(PosmechError, match="L3H0 does not exist"):
        sa.head_scores(bridge, _docs(1)[0], ["L3H0"])


def test_row_windows_show_the_dip_and_the_bump_as_columns():
    D = sa.row_windows(dark(12), W)
    assert np.isnan(D[:W]).all() and np.isnan(D[12 - W:]).all()
    inner = D[W: 12 - W]
    # offset 0 lies below both neighbours (dark column); the trend rises from -W to +W
    assert (inner[:, W] < inner[:, W - 1]).all() and (inner[:, W] < inner[:, W + 1]).all()
    assert (inner[:, -1] > inner[:, 0]).all()
    B = sa.row_windows(bright(12), W)
    assert (np.argmax(B[W: 12 - W], axis=1) == W - 1).all()  # offset -1
    np.testing.assert_allclose(sa.row_windows(np.zeros((12, 12)), W)[W: 12 - W], 0.0)


def test_row_centring_ignores_masked_entries():
    C = sa.centre_rows(sa.masked_scores(dark(6)))
    assert np.isnan(C[0, 1:]).all() and np.nanmedian(C, axis=1) == pytest.approx(np.zeros(6))


def test_split_of_previous_token_heads_counts_every_taxon():
    taxa = pd.DataFrame({"head_name": ["L0H0", "L0H1", "L0H2"], "taxon": ["dark diagonal", "neither", "neither"]})
    tax = pd.DataFrame({"head_name": ["L0H0", "L0H1", "L0H2"], "is_previous_token": [True, True, False]})
    assert sa.split_of_previous_token_heads(taxa, tax) == {"dark diagonal": 1, "bright sub-diagonal": 0, "neither": 1}
    with pytest.raises(PosmechError, match=r"rerun rule `taxonomy` \(analysis `diagonal_taxonomy`\)"):
        sa.split_of_previous_token_heads(taxa, tax.assign(head_name=["L9H9", "L0H1", "L0H2"]))
    rows = sa.taxa_scorecard(taxa.assign(layer=0, head=[0, 1, 2]), {"neither": 1}, "m", "d", "t.csv")
    assert [r["value"] for r in rows[:2]] == [["L0H0"], []]
    mixed = pd.DataFrame({"head_name": ["L0H0", "L0H1", "L1H0", "L1H1"], "layer": [0, 0, 1, 1], "head": [0, 1, 0, 1],
                          "taxon": ["neither", "bright sub-diagonal", "dark diagonal", "dark diagonal"]})
    assert sa.taxa_order(mixed)["head_name"].tolist() == ["L1H0", "L1H1", "L0H1", "L0H0"]


def test_score_taxa_scorecard_is_every_p13_row():
    taxa = pd.DataFrame({"head_name": ["L0H0", "L0H1", "L1H0"], "layer": [0, 0, 1], "head": [0, 1, 0],
                         "taxon": ["dark diagonal", "neither", "bright sub-diagonal"]})
    rows = sa.score_taxa_scorecard(taxa, {"dark diagonal": 1}, ["L0H0", "L0H1"], "m", "d", "t.csv")
    assert [r["quantity"] for r in rows] == [
        *(r["quantity"] for r in sa.taxa_scorecard(taxa, {"dark diagonal": 1}, "m", "d", "t.csv")),
        "early_dark_diagonal_fraction"]
    assert rows[0]["value"] == ["L0H0"] and rows[1]["value"] == ["L1H0"]
    assert rows[-1]["value"] == 0.5 and all(r["claim"] == "P13" and r["model"] == "m" for r in rows)
    assert sa.score_taxa_scorecard(taxa, {}, [], "m", "d", "t.csv")[-1]["value"] is None  # no early head


def test_anatomy_settings_resolve_the_corpus_and_the_pass_models():
    config = {"corpora": {"web": {}, "bible": {}}, "models": {"a": {}, "b": {}}, "anatomy": {"models": ["b"]}}
    s = defaults("anatomy", config, models=["b"], heads={"b": ["L0H1"]})
    assert s.corpus == "web" and s.pinned("b") == ("L0H1",) and s.pinned("a") is None
    assert s.for_pass(config, "b") is s and s.for_pass(config, "a") is None
    assert set(s.taxa.as_dict()) == {"row_min", "dip_min", "bump_min", "fraction_min", "trend_min"}
