"""Positional geometry (P1, P8–P11) on hand-built models and synthetic matrices with known answers."""

from __future__ import annotations

import h5py
import numpy as np
import pandas as pd
import pytest
import torch

from posmech.analyses import geometry as geo
from posmech.core.errors import PosmechError
from posmech.models import handbuilt as hb
from posmech.models.loading import load_bridge

from tests.tolerances import FLOAT32_FORWARD_ABS, FLOAT64_ABS

N_CTX, D_VOCAB = 12, 20


def silent_spec(seed: int = 0) -> hb.Spec:
    """Random W_E and W_pos (distinct singular values), every layer writes nothing."""
    rng = np.random.default_rng(seed)
    spec = hb.positional_spec(n_ctx=N_CTX, n_layer=3, n_head=2, d_vocab=D_VOCAB)
    spec.W_pos = rng.normal(size=(N_CTX, spec.d_model)) * np.linspace(2.0, 0.2, spec.d_model)
    spec.W_E = rng.normal(size=(D_VOCAB, spec.d_model))
    return spec


@pytest.fixture(scope="module")
def silent_dir(tmp_path_factory):
    return hb.save_model_dir(silent_spec(), tmp_path_factory.mktemp("geo") / "silent")


@pytest.fixture(scope="module")
def writing_dir(tmp_path_factory):
    """A model whose layer-0 heads copy the previous position (non-zero W_V, W_O)."""
    spec = silent_spec(1)
    rng = np.random.default_rng(7)
    for h in range(spec.n_head):
        w = hb.head_for_scores(hb.previous_token_scores(N_CTX), spec.d_model, spec.dh)
        w["W_V"] = rng.normal(size=(spec.d_model, spec.dh))
        w["W_O"] = rng.normal(size=(spec.dh, spec.d_model))
        spec.heads[(0, h)] = w
    return hb.save_model_dir(spec, tmp_path_factory.mktemp("geo") / "writing")


def bridge_of(path, processing="compatibility"):
    return load_bridge({"hf_dir": str(path), "name": path.name}, device="cpu", processing=processing)


@pytest.mark.float32
@pytest.mark.parametrize("bos", [True, False])
def test_silent_layers_give_centred_W_pos_at_every_layer(silent_dir, tmp_path, bos):
    bridge = bridge_of(silent_dir)
    acc, W_pos, tokens, info = geo.compute_extended(bridge, n_tokens=7, seed=3, batch_size=3, prepend_bos=bos)
    assert info["prepend_bos"] is bos and len(tokens) == 7 and acc.count == 7
    first = 1 if bos else 0
    np.testing.assert_array_equal(W_pos, bridge.W_pos.detach().double().numpy())
    M = acc.mean()
    assert M.shape == (4, N_CTX, bridge.cfg.d_model)
    for layer in range(4):
        np.testing.assert_allclose(M[layer, first:], geo.centre(W_pos, first), atol=1e-5)
    agree = acc.agreement()
    np.testing.assert_allclose(agree["mean_cosine_to_average"], 1.0, atol=FLOAT32_FORWARD_ABS)
    np.testing.assert_allclose(agree["mean_pairwise_cosine"], 1.0, atol=FLOAT32_FORWARD_ABS)
    np.testing.assert_allclose(agree["rms_relative_distance"], 0.0, atol=1e-4)
    path = tmp_path / "extended.h5"
    geo.write_extended(path, acc, W_pos, tokens, geo.site_names(3), {"model": "silent"})
    ext = geo.read_extended_artifact(path)
    assert ext.first_token_position == first and ext.n_layers == 3
    np.testing.assert_array_equal(geo.read_extended(path), M)
    angles = geo.angles_table(ext, "silent", first, 3)
    assert len(angles) == 4 * 3
    assert angles["defined"].all() and angles["angle_deg"].max() < 1e-3
    table = geo.agreement_table(ext, "silent")
    assert table["max_abs_diff_to_W_pos"].max() < 1e-5


@pytest.mark.float32
def test_layer0_identity_on_a_writing_model_and_later_layers_differ(writing_dir):
    bridge = bridge_of(writing_dir)
    acc, W_pos, _, _ = geo.compute_extended(bridge, n_tokens=5, seed=0, batch_size=5, prepend_bos=True)
    M = acc.mean()
    np.testing.assert_allclose(M[0, 1:], geo.centre(W_pos, 1), atol=1e-5)
    assert np.abs(M[1, 1:] - geo.centre(W_pos, 1)).max() > 0.1  # layer 0 wrote something
    ang = geo.canonical_angles_deg(geo.centre(W_pos, 1), geo.centre(M[1], 1), 3)
    assert ang.max() > 1.0


@pytest.mark.float32
def test_extended_matches_brute_force_hidden_states(writing_dir):
    """Raw weights: the streamed average and agreement equal a per-token computation from
    Hugging Face hidden states (an independent forward implementation)."""
    bridge = bridge_of(writing_dir, processing="raw")
    tokens = np.array([3, 8, 11, 17])
    acc, _ = geo.extended_embeddings(bridge, tokens, N_CTX, bos_id=0, batch_size=3)
    hf = bridge.original_model if hasattr(bridge, "original_model") else None
    if hf is None:
        from posmech.models.loading import load_hf

        hf, _ = load_hf({"hf_dir": str(writing_dir)})
    x = torch.from_numpy(geo.repeated_prompts(tokens, N_CTX, 0))
    with torch.inference_mode():
        hs = hf(x, output_hidden_states=True).hidden_states  # n_layers + 1, last after ln_f
    E = np.stack([h.double().numpy() for h in hs[:-1]])  # [layer, token, pos, d]
    E = E - E[:, :, 1:].mean(axis=2, keepdims=True)
    np.testing.assert_allclose(acc.mean()[:3], E.mean(axis=1), atol=1e-5)
    Ep = E[:, :, 1:].reshape(3, len(tokens), -1)
    avg = Ep.mean(axis=1)
    cos = (Ep @ avg[:, :, None])[..., 0] / np.linalg.norm(Ep, axis=2) / np.linalg.norm(avg, axis=1)[:, None]
    np.testing.assert_allclose(acc.agreement()["mean_cosine_to_average"][:3], cos.mean(axis=1),
                               atol=FLOAT32_FORWARD_ABS)
    rel = np.sqrt(((Ep - avg[:, None]) ** 2).sum(axis=2).mean(axis=1)) / np.linalg.norm(avg, axis=1)
    np.testing.assert_allclose(acc.agreement()["rms_relative_distance"][:3], rel, atol=FLOAT32_FORWARD_ABS)


def test_accumulator_pairwise_cosine_matches_brute_force():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(6, 1, 9, 4)) + rng.normal(size=(1, 1, 9, 4)) * 2  # tokens share a component
    acc = geo.ExtendedAccumulator(1, 9, 4, first=1)
    for t in range(0, 6, 4):
        acc.add(0, X[t : t + 4, 0])
        acc.count += len(X[t : t + 4])
    E = X[:, 0] - X[:, 0, 1:].mean(axis=1, keepdims=True)
    F = E[:, 1:].reshape(6, -1)
    F = F / np.linalg.norm(F, axis=1, keepdims=True)
    G = F @ F.T
    np.testing.assert_allclose(acc.agreement()["mean_pairwise_cosine"][0], G[~np.eye(6, dtype=bool)].mean())
    np.testing.assert_allclose(acc.mean()[0], E.mean(axis=0))


@pytest.mark.parametrize("thetas", [(0.0, 0.0, 0.0), (8.0, 9.0, 10.0), (5.0, 30.0, 89.0)])
def test_canonical_angles_recover_known_rotations(thetas):
    rng = np.random.default_rng(1)
    d = 20
    Q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    base, other = Q[:, :3], Q[:, 3:6]
    rad = np.radians(thetas)
    rotated = base * np.cos(rad) + other * np.sin(rad)  # each basis vector tilted by its angle
    coef_a = rng.normal(size=(50, 3)) * [5.0, 3.0, 1.5]
    coef_b = rng.normal(size=(40, 3)) * [4.0, 2.0, 1.0]
    noise = rng.normal(size=(50, d)) @ Q[:, 6:] @ Q[:, 6:].T * 1e-7  # tiny, outside both subspaces
    A = coef_a @ base.T + noise
    B = coef_b @ rotated.T
    np.testing.assert_allclose(geo.canonical_angles_deg(A, B, 3), sorted(thetas), atol=1e-4)


def test_pca_sparsity_and_tables_on_a_known_matrix(tmp_path):
    n, d = 40, 6
    t = np.linspace(0, 4 * np.pi, n)
    W = np.zeros((n, d))
    W[:, 0], W[:, 1], W[:, 2] = 3 * np.cos(t), 3 * np.sin(t), np.linspace(-1, 1, n)  # a helix
    V, ratio, _ = geo.pca(geo.centre(W), 3)
    assert ratio.sum() == pytest.approx(1.0)
    assert np.abs(V[:, 3:]).max() < 1e-12
    sparse = np.zeros_like(W)
    sparse[:, 0] = W[:, 0]  # one column kept: a third of W's far entries
    acc = geo.ExtendedAccumulator(2, n, d, first=0)
    acc.add(0, W[None])
    acc.add(1, sparse[None])
    acc.count = 1
    path = tmp_path / "e.h5"
    geo.write_extended(path, acc, W, np.array([1]), ["blocks.0.hook_resid_pre", "blocks.0.hook_resid_post"], {})
    ext = geo.read_extended_artifact(path)
    sp = geo.sparsity_table(ext, "m", 0, 1.0)
    ext_row = sp[(sp["matrix"] == "extended") & (sp["layer"] == 1)].iloc[0]
    w_row = sp[sp["matrix"] == "W_pos"].iloc[0]
    assert ext_row["frac_far"] < w_row["frac_far"]
    assert ext_row["wpos_over_extended"] == pytest.approx(w_row["frac_far"] / ext_row["frac_far"])
    assert geo.sparsity_scorecard(sp, "m", "x")[0]["value"] == pytest.approx(ext_row["wpos_over_extended"])
    pt = geo.pca_table(ext, "m", 0, 3)
    assert set(pt["claim"]) == {"P1", "P10"}
    w3 = pt[pt["matrix"] == "W_pos"]["explained_variance_ratio"].sum()
    assert w3 == pytest.approx(1.0)
    panels = geo.comparison_panels(ext, 0, 1)
    assert [p[0] for p in panels] == ["W_pos", "extended layer 1", "joint"]
    np.testing.assert_allclose(np.abs(panels[0][2]), np.abs(geo.helices(ext, 0)["W_pos"]), atol=FLOAT64_ABS)


def test_a_twins_tables_hold_the_claims_layer_with_the_same_values(tmp_path):
    """A twin's null (config twins.claims_only) decomposes only W_pos and the layer P10/P11's
    claims read: those rows equal the full tables' exactly, and so do the claims' values."""
    from posmech.core.null import claims_only

    rng = np.random.default_rng(0)
    n_layers, d = 3, 8
    W_pos = rng.normal(size=(N_CTX, d))
    M = rng.normal(size=(n_layers + 1, N_CTX, d)) * np.linspace(3.0, 0.1, d)  # clear spectral gaps
    acc = geo.ExtendedAccumulator(n_layers + 1, N_CTX, d, first=0)
    for layer in range(n_layers + 1):
        acc.add(layer, M[layer][None])
    acc.count = 1
    path = tmp_path / "extended.h5"
    tokens = np.array([3, 5, 9])
    geo.write_extended(path, acc, W_pos, tokens, geo.site_names(n_layers), {})
    ext = geo.read_extended_artifact(path)
    assert geo.claimed_layers(ext, 1) is None
    with claims_only():
        layers = geo.claimed_layers(ext, 1)
        assert layers == [1] and geo.claimed_layers(ext, 99) == [ext.n_layers]  # clipped as helix_layer
    full, null = geo.pca_table(ext, "m", 0, 3), geo.pca_table(ext, "m", 0, 3, geo.all_pcas(ext, 0, 3, layers))
    assert sorted(null["layer"].unique()) == [-1, 1]
    pd.testing.assert_frame_equal(full[full["layer"].isin([-1, 1])].reset_index(drop=True), null)
    assert geo.pca_scorecard(full, "m", 1, "w", "c") == geo.pca_scorecard(null, "m", 1, "w", "c")  # P1, P10
    full, null = geo.angles_table(ext, "m", 0, 3), geo.angles_table(ext, "m", 0, 3, layers=layers)
    assert set(null["layer"]) == {1}
    pd.testing.assert_frame_equal(full[full["layer"] == 1].reset_index(drop=True), null)
    assert geo.angles_scorecard(full, "m", 1, "a") == geo.angles_scorecard(null, "m", 1, "a")  # P11


def test_tokens_exclude_specials_and_are_seeded():
    cand = geo.candidate_tokens(10, [0, 9])
    assert list(cand) == list(range(1, 9))
    a, b = geo.draw_tokens(cand, 5, 4), geo.draw_tokens(cand, 5, 4)
    np.testing.assert_array_equal(a, b)
    assert len(set(a)) == 5 and not {0, 9} & set(a)
    assert len(geo.draw_tokens(cand, 50, 0)) == 8  # capped at the vocabulary
    x = geo.repeated_prompts(np.array([4, 5]), 6, bos_id=0)
    assert x.tolist() == [[0, 4, 4, 4, 4, 4], [0, 5, 5, 5, 5, 5]]


def test_reader_refuses_other_kinds(tmp_path):
    from posmech.store.hdf5 import artifact_writer

    p = tmp_path / "x.h5"
    with artifact_writer(p, "tokens", "tokenize") as f:
        f.create_dataset("extended", data=np.zeros((1, 2, 2)))
    with pytest.raises(PosmechError, match="kind"):
        geo.read_extended(p)
    with h5py.File(p, "a") as f:
        f.attrs["complete"] = False
    with pytest.raises(PosmechError, match="completion"):
        geo.read_extended(p)


@pytest.mark.float32
def test_layer0_identity_on_a_legacy_attention_only_checkpoint(tmp_path):
    """attn-only-2l style (native TransformerBridge, no MLPs): same contract."""
    from posmech.models.loading import prepare_local_model
    from tests.models.test_loading import _legacy_dir

    d, sd = _legacy_dir(tmp_path / "legacy")
    bridge = load_bridge(prepare_local_model("leg", {"source": str(d)}, tmp_path / "m"), device="cpu")
    acc, W_pos, tokens, info = geo.compute_extended(bridge, 5, 0, 2, prepend_bos=True)
    M = acc.mean()
    assert M.shape == (3, 10, 8) and info["n_layers"] == 2
    np.testing.assert_allclose(M[0, 1:], geo.centre(W_pos, 1), atol=1e-5)
    raw = sd["pos_embed.W_pos"].double().numpy()  # compatibility mode centres W_pos over d_model
    np.testing.assert_allclose(W_pos, raw - raw.mean(axis=1, keepdims=True), atol=1e-5)


def _with_singular_values(s: np.ndarray, n: int, seed: int) -> np.ndarray:
    """An ``[n, len(s)]`` matrix with singular values ``s`` and random singular vectors,
    centred over rows (so that centring leaves it unchanged)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, len(s)))
    U, _ = np.linalg.qr(X - X.mean(0))
    V, _ = np.linalg.qr(rng.normal(size=(len(s), len(s))))
    return (U * s) @ V.T


def test_repeated_singular_value_at_k_makes_the_angles_undefined():
    s_tied = np.array([9.0, 7.0, 5.0, 5.0, 1.0, 0.5])  # s3 == s4: no top-3 subspace
    A = _with_singular_values(s_tied, 40, 0)
    B = _with_singular_values(np.array([9.0, 7.0, 5.0, 2.0, 1.0, 0.5]), 40, 1)
    assert np.isnan(geo.canonical_angles_deg(A, B, 3)).all()
    assert np.isnan(geo.canonical_angles_deg(B, A, 3)).all()
    assert not np.isnan(geo.canonical_angles_deg(B, B, 3)).any()  # B alone is fine
    reason = geo.undefined_reason({"A": geo.right_singular(A)[0], "B": geo.right_singular(B)[0]}, 3)
    assert reason.startswith("top-3 subspace of A is not defined") and "B" not in reason.split(";")[0][20:]
    assert "s3 = 5" in reason and "s4 = 5" in reason
    # nearly equal (relative gap 1e-5) is just as undefined; a 1 % gap is defined
    assert np.isnan(geo.canonical_angles_deg(_with_singular_values(s_tied * [1, 1, 1 + 1e-5, 1, 1, 1], 40, 0), B, 3)).all()
    assert not np.isnan(geo.canonical_angles_deg(_with_singular_values(s_tied * [1, 1, 1.01, 1, 1, 1], 40, 0), B, 3)).any()
    # rank below k: s3 = s4 = 0
    assert geo.gap_of(np.array([2.0, 1.0, 0.0, 0.0]), 3) == 0.0


def test_tiny_perturbation_of_a_matrix_with_a_clear_gap_gives_angles_near_zero():
    A = _with_singular_values(np.array([9.0, 7.0, 5.0, 2.0, 1.0, 0.5]), 40, 2)  # relative gap 0.6 at k=3
    E = np.random.default_rng(3).normal(size=A.shape) * 1e-6
    ang = geo.canonical_angles_deg(A, A + E, 3)
    assert np.isfinite(ang).all() and ang.max() < 1e-3


def test_angles_table_and_scorecard_report_undefined_with_the_reason(tmp_path):
    class Ext:  # the Extended fields angles_table reads
        n_layers = 1
        sites = ["blocks.0.hook_resid_pre", "ln_final.hook_in"]

    ext = Ext()
    ext.W_pos = _with_singular_values(np.array([9.0, 7.0, 5.0, 2.0, 1.0, 0.5]), 30, 4)
    ext.extended = np.stack([ext.W_pos, _with_singular_values(np.array([9.0, 7.0, 5.0, 5.0, 1.0, 0.5]), 30, 5)])
    table = geo.angles_table(ext, "m", 0, 3)
    ok, bad = table[table["layer"] == 0], table[table["layer"] == 1]
    assert ok["defined"].all() and (ok["undefined_reason"] == "").all() and ok["angle_deg"].max() < 1e-4
    assert not bad["defined"].any() and bad["angle_deg"].isna().all()
    assert bad["undefined_reason"].str.contains("extended embeddings at ln_final.hook_in").all()
    row = geo.angles_scorecard(table, "m", 1, "t.csv")[0]
    assert row["value"] is None and row["detail"].startswith("undefined: top-3 subspace")
    assert geo.angles_scorecard(table, "m", 0, "t.csv")[0]["value"] == [0.0, 0.0, 0.0]
