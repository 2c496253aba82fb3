"""The taxonomy and W_pos-averaging rules (P2-P4, P6, P7) on the CI-sized DAG."""

from __future__ import annotations

import numpy as np
import yaml

from posmech.analyses.taxonomy import HEADS_COLUMNS, SHARP_FALLBACK_RULE, read_chosen_heads
from posmech.store.hdf5 import open_artifact
from posmech.store.tables import read_table
from tests.workflow.conftest import analyses_run

REPO_PUBLISHED = __import__("pathlib").Path(__file__).resolve().parents[2] / "resources" / "published.yaml"


def _published_quantities(claims):
    entries = yaml.safe_load(REPO_PUBLISHED.read_text())["entries"]
    return {(e["claim"], e["quantity"]) for e in entries if e["claim"] in claims}


def test_diagonal_taxonomy_outputs(ci_run):
    base = ci_run / "results/demo/taxonomy"
    per_head = read_table(base / "taxonomy.csv")
    assert len(per_head) == 2 * 2  # ci model: 2 layers x 2 heads
    meta = per_head.attrs
    assert meta["n_documents"] == 8 and meta["context"] == 32
    assert "spearman_ratio_vs_head_detector" in meta
    assert meta["n_previous_token_heads"] == int(per_head["is_previous_token"].sum())
    # every query row of a pattern sums to 1: mean x count summed over offsets = number of query rows
    diag = read_table(base / "diagonals.csv")
    mass = (diag["mean"] * diag["count"]).groupby(diag["head_name"]).sum()
    np.testing.assert_allclose(mass.to_numpy(), 8 * (32 - 1), rtol=1e-4)
    top = diag.loc[diag.groupby("head_name")["mean"].idxmax()].set_index("head_name")["offset"]
    assert (top.reindex(per_head["head_name"]).to_numpy() == per_head["top_offset"].to_numpy()).all()
    heads = read_chosen_heads(base / "heads.csv")
    table = read_table(base / "heads.csv")
    assert list(table.columns) == HEADS_COLUMNS
    ranked = per_head[per_head["rank"].notna()].sort_values("rank")
    # the sharp head is the first ranked previous-token head (above the uniform baseline), or with
    # none the fallback's (60 training steps may make none)
    if len(ranked):
        assert heads["sharp"] == [ranked["head_name"].iloc[0]]
    else:
        assert table["rule"].tolist() == [SHARP_FALLBACK_RULE]
    assert set(heads["early"]) <= set(ranked["head_name"]) - set(heads["sharp"])
    assert (per_head["is_previous_token"] <= per_head["is_previous_token_post"]).all()  # a margin on the post's
    card = read_table(ci_run / "results/demo/scorecard/diagonal_taxonomy.csv")
    quantities = {"n_prev_token_heads": "P6", "prev_token_head_fraction": "P6", "sharpest_prev_token_head": "P7",
                  "diagonal_ratio": "P7"}
    pairs = set(zip(card["claim"], card["quantity"]))
    # the finding's quantities and the post's (suffixed _post), which the published values compare with
    assert pairs == {(c, q + s) for q, c in quantities.items() for s in ("", "_post")}
    assert _published_quantities({"P6", "P7"}) <= {(c, q) for c, q in pairs if q.endswith("_post")}
    by = card.set_index("quantity")
    assert float(by.loc["prev_token_head_fraction", "value"]) == per_head["is_previous_token"].mean()
    assert float(by.loc["prev_token_head_fraction_post", "value"]) == per_head["is_previous_token_post"].mean()
    assert (ci_run / "results/demo/taxonomy/taxonomy.png").stat().st_size > 10_000


def test_taxonomy_and_score_taxa_share_one_pass_per_document(ci_run):
    """The CI config's taxonomy and anatomy sections read the same 8 documents: the shared
    pass (rule attention_statistics) runs each once, and the two analysis rules run no model."""
    with open_artifact(ci_run / "results/demo/taxonomy/attention_statistics.h5", "attention_statistics") as f:
        assert int(f.attrs["n_shared_documents"]) == 8
        assert int(f["diagonals"].attrs["n_documents"]) == 8 and int(f["profiles"].attrs["n_documents"]) == 8
        assert f["profiles/windows"].shape == (2, 2, 8 * (32 - 2 * 5 - 1), 11)

    ran = analyses_run(ci_run, "demo")  # family jobs record each analysis's passes

    def passes(analysis):
        return sum(ran[analysis]["forwards"].values())

    assert passes("attention_statistics") == 2  # 8 documents in batches of 4, once for both analyses
    assert passes("diagonal_taxonomy") == 0 and passes("score_taxa") == 0


def test_posembed_averaging_outputs(ci_run):
    df = read_table(ci_run / "results/demo/posembed/averaging.csv")
    loss = df[df["quantity"] == "loss"].set_index("k")["value"]
    assert list(loss.index) == [1, 5, 10, 32]
    assert np.isfinite(loss).all() and (loss > 0).all()
    probs = df[df["quantity"] == "probability"]
    assert set(probs["prompt"]) == {"apple_orange", "orange_apple"}
    assert ((probs["value"] >= 0) & (probs["value"] <= 1)).all()
    assert (probs.groupby(["k", "prompt"])["value"].sum() <= 1 + 1e-9).all()  # disjoint variant sets
    assert not probs["prompt_truncated"].any()  # the character-level prompt fits the CI model's 32-token context
    card = read_table(ci_run / "results/demo/scorecard/posembed_averaging.csv")
    got = set(zip(card["claim"], card["quantity"]))
    assert got == {("P2", "max_unchanged_k"), ("P3", "p_apple_intact"), ("P3", "p_apple_k10"),
                   ("P3", "p_orange_intact"), ("P3", "p_orange_k10"), ("P3", "p_repeat_min_k10")}
    assert got - {("P3", "p_repeat_min_k10")} <= _published_quantities({"P2", "P3"})
    # P3's finding: the smallest of the four probabilities (the CI grid has k = 10)
    by = card.set_index("quantity")["value"].astype(float)
    assert by["p_repeat_min_k10"] == min(by[q] for q in ("p_apple_intact", "p_apple_k10", "p_orange_intact",
                                                         "p_orange_k10"))


def test_posembed_attention_outputs(ci_run):
    df = read_table(ci_run / "results/demo/posembed/attention.csv")
    heads = read_chosen_heads(ci_run / "results/demo/taxonomy/heads.csv")
    assert df["head_name"].tolist() == heads["sharp"] + heads["early"]
    assert (df["window_size"] == 32).all() and (df["k"] == 10).all()
    assert ((df["cosine_similarity"] > 0) & (df["cosine_similarity"] <= 1 + 1e-9)).all()
    with open_artifact(ci_run / "results/demo/posembed/attention.h5", "posembed_attention") as f:
        intact = f[f"{heads['sharp'][0]}/intact"][()]
        averaged = f[f"{heads['sharp'][0]}/averaged"][()]
    assert intact.shape == (32, 32)
    np.testing.assert_allclose(intact.sum(1), 1, rtol=1e-5)  # window = whole document: rows are complete
    assert np.allclose(np.triu(averaged, 1), 0)
    card = read_table(ci_run / "results/demo/scorecard/posembed_attention.csv")
    assert set(zip(card["claim"], card["quantity"])) <= _published_quantities({"P4"})
    assert card["value"].iloc[0] == df["cosine_similarity"].iloc[0]
