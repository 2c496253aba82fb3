"""The score-anatomy rules (P12, P13) on the CI-sized DAG."""

from __future__ import annotations

import json

import numpy as np
import yaml

from posmech.analyses.anatomy import TAXA, masked_scores, row_features, softmax_rows
from posmech.analyses.taxonomy import read_chosen_heads
from posmech.store.hdf5 import open_artifact
from posmech.store.tables import read_table

from tests.tolerances import FLOAT32_STORAGE_REL

REPO = __import__("pathlib").Path(__file__).resolve().parents[2]


def _published_quantities(claims):
    entries = yaml.safe_load((REPO / "resources" / "published.yaml").read_text())["entries"]
    return {(e["claim"], e["quantity"]) for e in entries if e["claim"] in claims}


def test_score_anatomy_outputs(ci_run):
    base = ci_run / "results/demo/anatomy"
    chosen = read_chosen_heads(ci_run / "results/demo/taxonomy/heads.csv")
    table = read_table(base / "scores.csv")
    assert table["head_name"].tolist() == chosen["sharp"] + chosen["early"]
    assert table["role"].tolist() == ["sharp"] + ["early"] * len(chosen["early"])
    # 50 does not fit the 32-token document: the zoom is half of it, so it differs from the full figure
    assert table.attrs["zoom_start"] == 0 and table.attrs["zoom_size"] == 16
    assert table.attrs["scale"] == 4.0  # sqrt(d_head = 16)
    assert (table["max_abs_diff_masked_vs_hook"] < 1e-4).all() and table["masked_entries_agree"].all()
    assert (table["n_rows"] == 32 - 2 * 5 - 1).all()
    with open_artifact(base / "scores.h5", "score_anatomy") as f:
        assert f["tokens"].shape == (32,)
        for head in table["head_name"]:
            raw, masked, pattern = (f[f"{head}/{k}"][()] for k in ("raw", "masked", "pattern"))
            assert raw.shape == masked.shape == pattern.shape == (32, 32)
            assert np.isfinite(raw).all() and np.abs(np.triu(raw, 1)).max() > 0  # the future triangle is there
            np.testing.assert_array_equal(masked, masked_scores(raw))
            np.testing.assert_allclose(pattern, softmax_rows(masked), atol=FLOAT32_STORAGE_REL)  # float32 rounding
            np.testing.assert_allclose(pattern.sum(1), 1.0, rtol=1e-5)
    card = read_table(ci_run / "results/demo/scorecard/score_anatomy.csv")
    assert {("P12", "score_figures")} <= _published_quantities({"P12"})
    # and the finding's quantity (resources/findings.yaml): the sharp head's raw argmax fraction
    assert set(zip(card["claim"], card["quantity"])) == {("P12", "score_figures"), ("P12", "sharp_raw_argmax_prev_fraction")}
    by = card.set_index("quantity")
    assert json.loads(by.loc["score_figures", "value"]) == table["head_name"].tolist()
    assert float(by.loc["sharp_raw_argmax_prev_fraction", "value"]) == table["raw_argmax_prev_fraction"].iloc[0]
    for fig in ("scores_full.png", "scores_zoom.png"):
        assert (base / fig).stat().st_size > 20_000
    assert (base / "scores_full.png").read_bytes() != (base / "scores_zoom.png").read_bytes()


def test_score_taxa_outputs(ci_run):
    base = ci_run / "results/demo/anatomy"
    taxa = read_table(base / "taxa.csv")
    n_rows = 8 * (32 - 2 * 5 - 1)  # 8 documents, every query with a whole window off position 0
    assert len(taxa) == 2 * 2 and set(taxa["taxon"]) <= set(TAXA)
    assert (taxa["n_rows"] == n_rows).all() and taxa.attrs["n_rows_per_head"] == n_rows
    assert taxa.attrs["max_abs_diff_vs_hook_attn_scores"] < 1e-4
    for c in ("frac_dip", "frac_bump", "frac_trend"):
        assert taxa[c].between(0, 1).all()
    th = taxa.attrs["thresholds"]
    dark = (taxa["dip"] >= th["dip_min"]) & (taxa["frac_dip"] >= th["fraction_min"]) & (taxa["trend"] >= th["trend_min"])
    bright = (taxa["bump"] >= th["bump_min"]) & (taxa["frac_bump"] >= th["fraction_min"])
    assert ((taxa["taxon"] == "neither") == ~(dark | bright)).all()
    with open_artifact(base / "profiles.h5", "score_profiles") as f:
        windows, features = f["windows"][()], f["features"][()]
        assert windows.shape == (2, 2, n_rows, 11) and list(f["offsets"][()]) == list(range(-5, 6))
        assert f["query"][()].min() == 6 and f["query"][()].max() == 26
    np.testing.assert_allclose(features, row_features(windows), atol=1e-5)
    med = np.median(features, axis=2)[taxa["layer"], taxa["head"]]
    np.testing.assert_allclose(taxa[["dip", "bump", "trend"]].to_numpy(), med, atol=1e-5)
    order = taxa["taxon"].map(TAXA.index)
    assert order.is_monotonic_increasing  # dark, bright, neither; the report shows the first rows
    prof = read_table(base / "profiles.csv")
    assert len(prof) == 4 * 11 and prof.groupby("head_name")["median"].count().eq(11).all()
    per_head = read_table(ci_run / "results/demo/taxonomy/taxonomy.csv")
    split = taxa.attrs["prev_token_heads_by_taxon"]
    assert set(split) == set(TAXA) and sum(split.values()) == int(per_head["is_previous_token"].sum())
    card = read_table(ci_run / "results/demo/scorecard/score_taxa.csv").set_index("quantity")
    assert {("P13", q) for q in ("dark_diagonal_heads", "bright_subdiagonal_heads")} <= _published_quantities({"P13"})
    assert json.loads(card.loc["dark_diagonal_heads", "value"]) == taxa.loc[taxa["taxon"] == TAXA[0], "head_name"].tolist()
    assert json.loads(card.loc["prev_token_heads_by_taxon", "value"]) == split
    assert (base / "taxa.png").stat().st_size > 20_000
    report = read_table(ci_run / "results/report/scorecard.csv")
    p13 = report[(report["claim"] == "P13") & (report["model"] == "demo")]
    assert set(p13["quantity"]) == {"dark_diagonal_heads", "bright_subdiagonal_heads", "prev_token_heads_by_taxon",
                                    "early_dark_diagonal_fraction"}  # the last one: the finding's
    published = p13["quantity"].isin(["dark_diagonal_heads", "bright_subdiagonal_heads"])
    assert (p13.loc[published, "status"] == "other model").all()
