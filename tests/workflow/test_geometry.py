"""Positional geometry rules (P1, P8–P11) in the CI-sized DAG."""

import json

import numpy as np
import yaml

from posmech.analyses import geometry as geo
from posmech.models.loading import load_bridge, read_manifest
from posmech.store.tables import read_table

from .conftest import REPO


def test_extended_embeddings_layer0_equal_the_models_centred_W_pos(ci_run):
    path = ci_run / "results/demo/geometry/extended.h5"
    E = geo.read_extended(path)
    ext = geo.read_extended_artifact(path)
    bridge = load_bridge(read_manifest(ci_run / "resources/models/demo/manifest.json"), device="cpu")
    W = bridge.W_pos.detach().double().numpy()
    assert E.shape == (bridge.cfg.n_layers + 1, bridge.cfg.n_ctx, bridge.cfg.d_model)
    assert ext.first_token_position == 1 and ext.attrs["prepend_bos"]  # ci.yaml: prepend_bos, bos: model
    np.testing.assert_allclose(E[0, 1:], geo.centre(W, 1), atol=1e-5)
    assert np.abs(E[1:, 1:] - geo.centre(W, 1)).max() > 1e-3  # the trained layers write position
    assert ext.sites[-1] == f"blocks.{bridge.cfg.n_layers - 1}.hook_resid_post"
    n_tokens = yaml.safe_load((REPO / "config/ci.yaml").read_text())["geometry"]["n_tokens"]
    assert len(ext.tokens) == n_tokens and 0 not in ext.tokens  # BOS excluded from the draw
    assert len(set(ext.tokens.tolist())) == n_tokens


def test_geometry_tables_and_scorecards(ci_run):
    g = ci_run / "results/demo/geometry"
    angles = read_table(g / "canonical_angles.csv")
    assert "centring" in angles.attrs and angles.attrs["k"] == 3
    assert angles.loc[angles["layer"] == 0, "angle_deg"].max() < 1e-3
    assert angles["angle_deg"].between(0, 90).all()
    pca = read_table(g / "pca.csv")
    assert {"claim", "model"} <= set(pca.columns) and set(pca["claim"]) == {"P1", "P10"}
    for _, grp in pca.groupby(["matrix", "layer"]):
        assert np.all(np.diff(grp["explained_variance_ratio"]) <= 1e-12)
    sp = read_table(g / "sparsity.csv")
    w = sp[sp["matrix"] == "W_pos"].iloc[0]
    l0 = sp[(sp["matrix"] == "extended") & (sp["layer"] == 0)].iloc[0]
    assert l0["frac_far"] == w["frac_far"] and l0["wpos_over_extended"] == 1.0
    agree = read_table(g / "extended_agreement.csv")
    assert agree.loc[0, "max_abs_diff_to_W_pos"] < 1e-5
    assert np.isclose(agree.loc[0, "mean_pairwise_cosine"], 1.0)

    published = yaml.safe_load((REPO / "resources/published.yaml").read_text())["entries"]
    keys = {(e["claim"], e["quantity"]) for e in published}
    seen = set()
    for rule in ("extended_positional_embeddings", "positional_pca", "canonical_angles", "positional_sparsity"):
        sc = read_table(ci_run / f"results/demo/scorecard/{rule}.csv")
        assert list(sc.columns) == ["claim", "model", "quantity", "value", "detail", "artifact"]
        for _, row in sc.iterrows():
            assert (row["claim"], row["quantity"]) in keys
            assert (ci_run / row["artifact"]).is_file()
            seen.add(row["claim"])
    assert seen == {"P1", "P8", "P9", "P10", "P11"}
    p11 = read_table(ci_run / "results/demo/scorecard/canonical_angles.csv")
    assert len(json.loads(p11["value"].iloc[0])) == 3
    for f in ("pca_wpos_helix", "pca_helices", "pca_comparison", "pca_explained", "canonical_angles", "sparsity"):
        assert (g / f"{f}.png").read_bytes()[:4] == b"\x89PNG"
