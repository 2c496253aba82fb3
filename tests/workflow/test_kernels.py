"""Positional kernels / ETC rules (K1–K5) in the CI-sized DAG."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pandas as pd

from posmech.analyses import kernels as kn
from posmech.analyses.cache import read_position_means
from posmech.data.tokens import read_tokens
from posmech.models.loading import load_bridge, read_manifest
from posmech.verdicts.scorecard import load_published
from posmech.store.tables import read_table

from tests.tolerances import FLOAT32_FORWARD_ABS, FLOAT32_FORWARD_REL

REPO = Path(__file__).resolve().parents[2]


def test_kernels_artifact_is_normalised_and_recomputable(ci_run):
    ks = kn.read_kernels(ci_run / "results/demo/kernels/kernels.h5")
    assert ks.attrs["means_corpus"] == "bible" and ks.attrs["processing"] == "compatibility"
    assert list(ks.positions) == list(range(2, 32))  # k0 = 2 .. heatmap_max_position = 31
    assert ks.etc.shape == (3, 2, 2, 30)
    k = ks.kernel(1, 0)
    np.testing.assert_allclose(k.sum(axis=1), 1.0, atol=1e-5)
    assert k[:, :2].max() == 0  # keys before k0 are left out
    assert np.all(np.triu(k[:, 2:], 1)[:, : len(ks.positions)] == 0)  # no key after the query
    assert np.all((ks.etc >= 1 - 1e-9) & (ks.etc <= ks.n_keys[None, :, None, :] + 1e-6))

    # the rule wired the cached ln1_out means, the texts it names and the bridge's weights
    man = read_manifest(ci_run / "resources/models/demo/manifest.json")
    bridge = load_bridge(man, device="cpu")
    w = kn.bridge_head_weights(bridge, json.loads((Path(man["hf_dir"]) / "config.json").read_text()))
    means, _ = read_position_means(ci_run / "results/demo/activations/bible.h5", "ln1_out")
    toks = read_tokens(ci_run / "results/demo/tokens/bible.h5")
    with h5py.File(ci_run / "results/demo/kernels/kernels.h5") as f:
        docs = f["chapters/doc_index"][()]
    x = kn.query_embeddings(bridge, [toks.doc(int(j)) for j in docs], ks.positions)
    lk = kn.layer_kernels(means[1], x[:, 1], ks.positions, w, 1, k0=2)
    # the layer inputs from this process's forward pass (its thread count, not the job's): float32 rounding
    np.testing.assert_allclose(lk.etc, ks.etc[:, 1], rtol=FLOAT32_FORWARD_REL)
    np.testing.assert_allclose(lk.mean[0], k, atol=FLOAT32_FORWARD_ABS)


def test_etc_table_and_scorecard(ci_run):
    df = read_table(ci_run / "results/demo/kernels/etc.csv")
    assert len(df) == 2 * 2 * 30
    assert set(df["kernel_type"]) <= set(kn.KERNEL_TYPES)
    assert (df["etc_mean"] <= df["n_keys"] + 1e-6).all() and (df["etc_min"] >= 1 - 1e-9).all()
    assert np.allclose(df["etc_fraction"], df["etc_mean"] / df["n_keys"])
    assert df.attrs["classified_at_n"] == 31 and df.attrs["k0"] == 2
    sc = pd.read_csv(ci_run / "results/demo/scorecard/etc_table.csv")
    assert list(sc.columns) == ["claim", "model", "quantity", "value", "detail", "artifact"]
    published = [e for e in load_published(REPO / "resources/published.yaml") if e.rule == "etc_table"]
    expected = {e.quantity for e in published} - {"layer5_uniform_heads"}  # the CI model has 2 layers
    assert expected <= set(sc["quantity"])
    heads = sum((json.loads(v) for v in sc[sc["quantity"].str.startswith("layer0_")]["value"]), [])
    assert sorted(heads) == ["L0H0", "L0H1"]  # every layer-0 head has exactly one type
    consistency = float(sc.set_index("quantity").loc["kernel_consistency", "value"])
    assert 0.0 < consistency <= 1.0


def test_kernel_figures_exist(ci_run):
    for f in ("kernels/kernels_layer0.png", "kernels/kernels_selected.png", "kernels/kernel_profiles.png"):
        assert (ci_run / "results/demo" / f).read_bytes()[:4] == b"\x89PNG"
    assert (ci_run / "results/kernels/etc_heatmap.png").read_bytes()[:4] == b"\x89PNG"
