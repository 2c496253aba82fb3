"""The intervention rules (P5, P14, P15, P16) in the CI-sized DAG."""

from __future__ import annotations

import json

import numpy as np
import pytest

from posmech.analyses.taxonomy import read_chosen_heads
from posmech.store.tables import SCORECARD_COLUMNS, read_table

from tests.tolerances import FLOAT64_REL

RULES = ["prev_knockout", "extended_averaging", "repeated_tokens", "induction_intervention"]
CLAIMS = {"prev_knockout": "P5", "extended_averaging": "P15", "repeated_tokens": "P14", "induction_intervention": "P16"}


@pytest.fixture(scope="module")
def out(ci_run):
    d = ci_run / "results/demo"
    return {
        "dir": d,
        "heads": read_chosen_heads(d / "taxonomy/heads.csv"),
        **{r: read_table(d / f"interventions/{r}.csv") for r in RULES},
    }


@pytest.mark.parametrize("rule", RULES)
def test_outputs_tidy_with_claim_figure_and_scorecard(out, rule):
    df = out[rule]
    assert (df["claim"] == CLAIMS[rule]).all() and (df["model"] == "demo").all()
    assert "chosen_heads" in df.attrs and "interventions_config" in df.attrs
    png = out["dir"] / f"interventions/{rule}.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    card = read_table(out["dir"] / f"scorecard/{rule}.csv")
    assert list(card.columns) == SCORECARD_COLUMNS and len(card) > 0
    assert (card["claim"] == CLAIMS[rule]).all()
    # a row without a value (a finding's quantity the model lacks the object of) says why
    assert (card["value"].astype(float).notna() | card["detail"].fillna("").str.len().gt(10)).all()


def test_prev_knockout_layers_and_rows(out):
    df, sharp = out["prev_knockout"], out["heads"]["sharp"][0]
    layer = int(sharp[1 : sharp.index("H")])
    assert (df["head_name"] == sharp).all()
    assert str(df["layers"].iloc[0]) in (";".join(map(str, range(layer))), "nan")
    n_docs = df["document"].nunique()
    assert n_docs == 3 and len(df) == n_docs * 3 * 3
    for _, g in df.groupby(["document", "condition"]):
        n = g.set_index("query_set")["n_queries"]
        assert n["all"] == n["knocked"] + n["other"] == g["n_tokens"].iloc[0] - 1
        assert n["knocked"] == len(range(5, g["n_tokens"].iloc[0], 5))
    if layer == 0:  # nothing before the sharp head: every condition is the intact run
        for cond in ("knockout", "knockout_renormalised"):
            np.testing.assert_array_equal(df[df.condition == cond]["prev_mass"], df[df.condition == "intact"]["prev_mass"])


def test_same_documents_give_the_same_intact_mass_across_rules(out):
    """P5's intact run, P14's split and P15's intact run measure the sharp head on the same
    documents: their per-document masses must agree.  They run the same documents in the same
    batches (``hooked_passes``) on one machine: the same float32 patterns, bitwise, so only the
    float64 means and pooling differ."""
    sharp = out["heads"]["sharp"][0]
    p5 = out["prev_knockout"].query("condition == 'intact' and query_set == 'all'").set_index("document")["prev_mass"]
    p14 = out["repeated_tokens"].fillna({"prev_mass": 0.0})
    pooled = (p14["prev_mass"] * p14["n_queries"]).groupby(p14["document"]).sum() / p14.groupby("document")[
        "n_queries"].sum()
    np.testing.assert_allclose(pooled.sort_index().to_numpy(), p5.sort_index().to_numpy(), rtol=FLOAT64_REL)
    p15 = out["extended_averaging"].query("head == @sharp and condition == 'intact'")
    for _, r in p15.iterrows():
        assert r["prev_mass"] == pytest.approx(p5[r["document"]], rel=FLOAT64_REL)


def test_extended_averaging_measures_every_chosen_head(out):
    df, heads = out["extended_averaging"], out["heads"]
    chosen = set(heads["early"]) | set(heads["sharp"])
    assert set(df["head_name"]) == chosen
    assert (df["layer"] >= df["averaged_layer"]).all()
    own = df[df["layer"] == df["averaged_layer"]]
    assert set(own["head_name"]) == chosen
    card = read_table(out["dir"] / "scorecard/extended_averaging.csv")
    assert set(card["quantity"]) == {f"damage_{h}" for h in chosen} | {"early_minus_sharp_damage"}
    assert (df["group_size"] == 4).all()


def test_repeated_tokens_split_covers_every_query(out):
    df = out["repeated_tokens"]
    n = df.groupby("document")["n_queries"].sum()
    assert (n.to_numpy() == df.groupby("document")["n_tokens"].first().to_numpy() - 1).all()


def test_induction_probabilities(out):
    df = out["induction_intervention"]
    assert set(df["condition"]) == {"baseline", "redirect", "scale", "redirect_scale"}
    assert set(df["target"]) == {"ram", "ass"}
    assert ((df["probability"] >= 0) & (df["probability"] <= 1)).all()
    assert (df.groupby("condition")["probability"].sum() <= 1 + 1e-9).all()
    base = df[df.condition == "baseline"].set_index("target")["probability"]
    scaled = df[df.condition == "scale"].set_index("target")["probability"]
    assert not np.allclose(base, scaled, rtol=0, atol=0)  # scaling the head's output changes the prediction
    assert df.attrs["positions"]["a"] == [4, 5]  # "an OxRamAss; an Ox": BOS, a, n, space, O, x
    card = read_table(out["dir"] / "scorecard/induction_intervention.csv")
    assert {"p_ram_baseline", "p_ass_after"} <= set(card["quantity"])
    assert json.loads(json.dumps(df.attrs["targets_tokens"]))["ram"]
