"""Contextual heads in layer 0 (K6–K10) in the CI-sized DAG."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from posmech.analyses import contextual as cx
from posmech.data.tokens import read_tokens
from posmech.models.loading import read_manifest
from posmech.verdicts.scorecard import load_published
from posmech.store.tables import read_table

from .conftest import REPO, snakemake
from tests.tolerances import FLOAT64_ABS

RULES = ("layer0_decomposition", "layer0_positional_patterns", "layer0_head_classes", "softmax_denominators",
         "denominator_variance", "layer1_patterns")


def test_layer0_artifact_matches_a_direct_decomposition(ci_run):
    dec = cx.read_decomposition(ci_run / "results/demo/contextual/layer0.h5")
    cfg = dec.attrs["contextual_config"]  # the section with the schema's defaults filled in
    assert dec.attrs["max_position"] == 30 and dec.attrs["n_ctx"] == 32 and dec.attrs["destination_token"] == " "
    assert list(dec.positions) == list(range(1, 31))
    assert cfg["positions"] == [24, 30] and cfg["n_per_corpus"] == 3
    assert len(dec.texts) == cfg["n_per_corpus"] and set(dec.texts["corpus"]) == {"bible"}
    # the stored texts are the corpus's documents, and the stored denominators are what the
    # library computes from the model's weights for them
    toks = read_tokens(ci_run / "results/demo/tokens/bible.h5")
    w, tok = cx.load_weights(read_manifest(ci_run / "resources/models/demo/manifest.json"), "demo")
    assert dec.attrs["destination_id"] == tok(" ", add_special_tokens=False).input_ids[0]
    for j, doc in enumerate(dec.texts["doc_index"]):
        np.testing.assert_array_equal(dec.token_ids[j], toks.doc(int(doc))[:31])
    lz, lze, tvs = cx.denominators(w, dec.attrs["ln_scale_used"], dec.token_ids[1], dec.positions,
                                   dec.attrs["destination_id"])
    np.testing.assert_allclose(dec.log_z_linear[1], lz, atol=FLOAT64_ABS)  # float64 from the weights, both
    np.testing.assert_allclose(dec.log_z_exact[1], lze, atol=FLOAT64_ABS)
    assert np.all((dec.tv_linear_exact >= 0) & (dec.tv_linear_exact <= 1))
    assert dec.ln_scale["quantiles"][4] == dec.attrs["ln_scale_used"]  # s = the median
    p = dec.pattern(30)
    np.testing.assert_allclose(p.sum(axis=1), 1.0)


def test_tables_and_scorecards(ci_run):
    res = ci_run / "results/demo/contextual"
    classes = read_table(res / "head_classes.csv")
    assert list(classes["head_name"]) == ["L0H0", "L0H1"]
    assert set(classes["head_class"]) <= set(cx.CLASSES)
    k6 = read_table(res / "positional_patterns.csv")
    assert sorted(set(k6["n"])) == [24, 30] and len(k6) == 4 and (k6["claim"] == "K6").all()
    assert k6["tv_fixed_vs_real"].between(0, 1).all() and (k6["etc_fixed"] <= k6["n_keys"] + 1e-9).all()
    k8 = read_table(res / "denominators.csv")
    assert len(k8) == 2 * 3 and (k8["spread_linear"] >= 0).all()
    k9 = read_table(res / "denominator_variance.csv")
    assert len(k9) == 3 * 3 * 2 + 3 * 2 and (k9["predicted"] > 0).all() and -1 <= k9.attrs["loglog_pearson_r"] <= 1
    assert set(k9["method"]) == {"resampled", "within_text"}
    k10 = read_table(res / "layer1_patterns.csv")
    assert list(k10["head_name"]) == ["L1H0", "L1H1"] and k10["n"].eq(30).all()
    published = load_published(REPO / "resources/published.yaml")
    for rule in RULES:
        sc = pd.read_csv(ci_run / f"results/demo/scorecard/{rule}.csv")
        expected = {e.quantity for e in published if e.rule == rule}
        assert expected <= set(sc["quantity"]), rule
    sc = pd.read_csv(ci_run / "results/demo/scorecard/layer0_head_classes.csv")
    heads = sum((json.loads(v) for v in sc["value"]), [])
    assert sorted(heads) == ["L0H0", "L0H1"]  # every head in exactly one class
    for f in ("ln_scale", "positional_patterns", "head_classes", "denominators", "denominator_variance",
              "layer1_patterns"):
        assert (res / f"{f}.png").read_bytes()[:4] == b"\x89PNG"


def test_report_has_the_k_rows(ci_run):
    card = read_table(ci_run / "results/report/scorecard.csv")
    k = card[card["claim"].isin(["K6", "K7", "K8", "K9", "K10"])]
    assert {"ln1_scale_range", "contextual_heads", "most_varying_denominator_heads", "variance_model_fit",
            "layer1_patterns"} <= set(k["quantity"])
    assert set(k[k["published_model"] == "gpt2"]["status"]) == {"other model"}
    assert "positional_patterns.png" in (ci_run / "results/report/index.html").read_text()


def test_positions_beyond_the_context_stop_the_run_before_any_job(tmp_path: Path):
    cfg = yaml.safe_load((REPO / "config/ci.yaml").read_text())
    cfg["contextual"]["positions"] = [24, 399]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = snakemake(tmp_path, "-n", configfile=path, timeout=300)
    assert proc.returncode != 0
    assert "`contextual.positions` (model demo): position(s) [399] are outside 1..31" in proc.stderr + proc.stdout
