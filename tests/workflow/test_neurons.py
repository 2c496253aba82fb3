"""Contextual neurons (C1–C3) in the CI-sized DAG."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from posmech.analyses import contextual as cx
from posmech.analyses import neurons as nr
from posmech.models.loading import read_manifest
from posmech.verdicts.scorecard import load_published
from posmech.store.tables import read_table

from .conftest import REPO, snakemake

RULES = ("extended_token_embeddings", "contextual_neurons", "bag_of_tokens_fit")


def test_artifact_is_what_the_library_computes_from_layer0(ci_run):
    res = ci_run / "results/demo"
    dec = cx.read_decomposition(res / "contextual/layer0.h5")
    w, ov, _ = nr.load_weights(read_manifest(ci_run / "resources/models/demo/manifest.json"), "demo")
    path = res / "neurons/extended_tokens.h5"
    attrs = nr.read_extended_attrs(path)
    classes = read_table(res / "contextual/head_classes.csv")
    use = yaml.safe_load((REPO / "config/ci.yaml").read_text())["neurons"]["head_classes"]
    assert attrs["heads"] == [n for n, c in zip(classes["head_name"], classes["head_class"]) if c in use]
    assert attrs["reference_position"] == dec.attrs["max_position"] == 30
    cal = attrs["calibration_index"]
    np.testing.assert_allclose(attrs["z_bar"], np.median(np.exp(dec.log_z_linear[cal][:, dec.positions >= 8]), 1))
    st = nr.setup_from_artifact(path, dec, w, ov)
    tc = nr.token_contributions(nr.extended_embeddings(st, dec.content_key, np.arange(w.d_vocab)), st.win())
    got = nr.read_contributions(path, [0, 5, ov.d_mlp - 1])
    np.testing.assert_allclose(got, tc[:, [0, 5, ov.d_mlp - 1]], rtol=1e-3, atol=1e-3 * np.abs(tc).max())


def test_tables_figures_and_scorecards(ci_run):
    res = ci_run / "results/demo/neurons"
    ranking = read_table(res / "neuron_ranking.csv")
    assert sorted(ranking["neuron"]) == list(range(len(ranking))) and list(ranking["rank"]) == list(
        range(1, len(ranking) + 1))
    assert (ranking["explained"].dropna().diff().dropna() <= 0).all()
    top = read_table(res / "top_tokens.csv")
    neurons = list(ranking["neuron"][:3])  # ci: neurons empty -> the n_auto = 3 best ranked
    assert list(dict.fromkeys(top["neuron"])) == neurons
    assert (top.groupby(["neuron", "side"]).size() == 10).all()
    for j in neurons:
        d = top[top["neuron"] == j]
        assert d[d.side == "top"]["contribution"].min() >= d[d.side == "bottom"]["contribution"].max()
    assert (top["corpus_count"] >= 1).all()
    fit = read_table(res / "bag_of_tokens_fit.csv")
    dec = cx.read_decomposition(ci_run / "results/demo/contextual/layer0.h5")
    assert len(fit) == 3 * len(dec.texts) and set(fit["neuron"]) == set(neurons)
    assert fit["pearson_r"].between(-1, 1).all() and fit["sign_agreement"].between(0, 1).all()
    assert (fit["fvu"] >= 0).all() and (fit["rmse"] >= 0).all() and (fit["n_positions"] == 31 - 8).all()
    published = load_published(REPO / "resources/published.yaml")
    for rule in RULES:
        sc = pd.read_csv(ci_run / f"results/demo/scorecard/{rule}.csv")
        expected = {e.quantity for e in published if e.rule == rule and e.quantity != "post_neurons_rank_percent"}
        assert expected <= set(sc["quantity"]), rule
    for f in ("top_tokens", "bag_of_tokens_fit"):
        assert (res / f"{f}.png").read_bytes()[:4] == b"\x89PNG"
    card = pd.read_csv(ci_run / "results/report/scorecard.csv")
    assert {"C1", "C2", "C3"} <= set(card["claim"])


def test_a_neuron_beyond_d_mlp_is_an_error_naming_the_key(ci_run, tmp_path: Path):
    work = tmp_path / "run"
    shutil.copytree(ci_run, work, symlinks=True)
    cfg = yaml.safe_load((REPO / "config/ci.yaml").read_text())
    cfg["neurons"]["neurons"] = [3, 100000]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(cfg))
    proc = snakemake(work, "results/demo/neurons/extended_tokens.h5", "--forcerun", "neurons",
                     configfile=bad, timeout=600)
    assert proc.returncode != 0
    log = (work / "logs/neurons/demo.log").read_text()  # the neurons family's job
    assert "config key `neurons.neurons` (model demo): neuron(s) [100000] beyond the layer-0 MLP" in log
