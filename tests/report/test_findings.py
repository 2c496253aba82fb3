"""Findings: resources/findings.yaml × thresholds × fabricated scorecards → holds / fails /
not measurable, each not-measurable verdict with its reason."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml

from posmech.verdicts import findings as fd
from posmech.core.config import load_schema
from posmech.core.errors import PosmechError
from posmech.report.findings_grid import grid_html
from posmech.store.tables import scorecard_rows, write_table

REPO = Path(__file__).resolve().parents[2]
SCHEMA = load_schema(REPO / "workflow" / "schemas" / "config.schema.yaml")
DEFAULTS = {k: v["default"] for k, v in SCHEMA["properties"]["findings"]["properties"].items()}


def finding(**kw):
    base = dict(claim="P5", finding="knocking out disrupts the sharp head", rule="prev_knockout",
                quantity="prev_token_mass_ratio", predicate="<=", threshold="p5_max_mass_ratio",
                not_measurable="sharp head in layer 0")
    return fd.Finding(**{**base, **kw})


def test_shipped_findings_cover_every_claim_with_a_documented_threshold():
    found = fd.load_findings(REPO / "resources" / "findings.yaml")
    claims = {f.claim for f in found}
    expected = {f"P{i}" for i in range(1, 19)} | {f"L{i}" for i in range(1, 6)} | {f"K{i}" for i in range(1, 11)} \
        | {f"C{i}" for i in range(1, 4)} | {f"S{i}" for i in range(1, 6)}
    assert claims == expected
    fd.check_thresholds(found, DEFAULTS)  # every key has a default number
    readme = (REPO / "config" / "README.md").read_text(encoding="utf-8")
    for f in found:
        assert f"`{f.threshold}`" in readme, f"{f.threshold} is not documented in config/README.md"


def test_judge_holds_and_fails_at_the_threshold():
    f = finding()
    thr = {"p5_max_mass_ratio": 0.5}
    held = fd.judge(f, "m", thr, {"value": 0.5, "detail": ""}, True)
    assert (held.verdict, held.value, held.threshold) == ("holds", 0.5, 0.5)
    failed = fd.judge(f, "m", thr, {"value": 0.51, "detail": ""}, True)
    assert failed.verdict == "fails" and "0.51 is not <= 0.5" in failed.reason
    # the threshold comes from the config: a stricter one turns the same value into a failure
    assert fd.judge(f, "m", {"p5_max_mass_ratio": 0.4}, {"value": 0.45, "detail": ""}, True).verdict == "fails"


@pytest.mark.parametrize("row, ran, words", [
    (None, False, "does not run on m"),
    (None, True, "wrote no row 'prev_token_mass_ratio'"),
    ({"value": None, "detail": "nothing to knock out: the sharp head L0H1 is in layer 0"}, True, "layer 0"),
    ({"value": "no local head", "detail": ""}, True, "no local head"),
])
def test_not_measurable_always_says_why(row, ran, words):
    v = fd.judge(finding(), "m", {"p5_max_mass_ratio": 0.5}, row, ran)
    assert v.verdict == "not measurable" and words in v.reason and v.value is None


@pytest.mark.parametrize("aggregate, value, expected", [
    ("min", {"L1H0": 0.3, "L2H1": 0.05}, 0.05), ("max", [8.0, 9.0, 31.0], 31.0),
    ("count", ["L0H1", "L0H2"], 2.0), ("count", [], 0.0), ("ratio", [0.15, 0.18], 1.2),
])
def test_aggregates(aggregate, value, expected):
    got, why = fd.reduce_value(value, aggregate)
    assert got == pytest.approx(expected) and why == ""


def test_aggregate_of_nothing_is_not_measurable():
    f = finding(claim="P7", quantity="diagonal_ratio", aggregate="min", predicate="<=", threshold="p7")
    v = fd.judge(f, "m", {"p7": 0.1}, {"value": {}, "detail": ""}, True)
    assert v.verdict == "not measurable" and "empty" in v.reason
    # an empty head set counts as zero heads: a finding that asks for at least one fails
    k7 = finding(claim="K7", quantity="contextual_heads", aggregate="count", predicate=">=", threshold="k7")
    assert fd.judge(k7, "m", {"k7": 1}, {"value": [], "detail": ""}, True).verdict == "fails"


def test_missing_threshold_is_an_error_naming_the_key():
    with pytest.raises(PosmechError, match="p5_max_mass_ratio"):
        fd.check_thresholds([finding()], {})


def test_a_finding_that_restates_what_judges_it_is_refused(tmp_path):
    """The rule, quantity, predicate and threshold of a finding are its analysis's declaration
    (workflow/analyses/<rule>.yaml, claims:); resources/findings.yaml states only the words."""
    doc = {"findings": [{"claim": "P5", "finding": "a finding sentence", "rule": "prev_knockout",
                         "quantity": "q", "predicate": "~", "threshold": "t", "not_measurable": "never ever"}]}
    p = tmp_path / "f.yaml"
    p.write_text(yaml.safe_dump(doc))
    with pytest.raises(PosmechError, match="Additional properties are not allowed"):
        fd.load_findings(p)


def test_findings_table_one_row_per_claim_and_model(tmp_path):
    sc = tmp_path / "results" / "a" / "scorecard" / "prev_knockout.csv"
    sc.parent.mkdir(parents=True)
    write_table(scorecard_rows([{"claim": "P5", "model": "a", "quantity": "prev_token_mass_ratio", "value": 0.2}]), sc)
    k = finding(claim="K2", rule="etc_table", quantity="local_translation_tv", threshold="k2_max_translation_tv")
    table = fd.findings_table([k, finding()], DEFAULTS, [str(sc)], ["a", "b"])
    assert list(table["claim"]) == ["P5", "P5", "K2", "K2"]
    got = dict(zip(zip(table["claim"], table["model"]), table["verdict"]))
    assert got == {("P5", "a"): "holds", ("P5", "b"): "not measurable", ("K2", "a"): "not measurable",
                   ("K2", "b"): "not measurable"}
    assert "not applicable" not in set(table["verdict"])
    assert table["reason"].map(bool).all()
    html = str(grid_html(table))
    assert 'class="v-holds"' in html and "0.2" in html and "does not run on b" in html


def _twin_scorecards(tmp_path, values):
    sc = []
    for m, v in values:
        p = tmp_path / "results" / m / "scorecard" / "prev_knockout.csv"
        p.parent.mkdir(parents=True)
        write_table(scorecard_rows([{"claim": "P5", "model": m, "quantity": "prev_token_mass_ratio", "value": v}]), p)
        sc.append(str(p))
    return sc


def test_the_legend_says_what_the_twins_read(tmp_path):
    """findings.meta.json's `twin_reads` (posmech.pipeline.sweep.twin_reads, from the config
    section `twins`) reaches the grid through read_table's attrs: the legend says a figureless
    twin read that fraction of its model's documents and only what its verdicts read; a twin
    with figures every document; nothing without the record or without a twin in the grid."""
    from posmech.pipeline.sweep import twin_reads
    from posmech.store.tables import read_table

    sc = _twin_scorecards(tmp_path, (("a", 0.2), ("a-twin", 0.3)))
    table = fd.findings_table([finding()], DEFAULTS, sc, ["a", "a-twin"], twins={"a-twin": "a"})
    cfg = {"documents_fraction": 0.2, "claims_only": True}
    reads = twin_reads(["a-twin"], {"a-twin"}, cfg)
    assert reads == {"a-twin": {"documents_fraction": 0.2, "claims_only": True}}
    write_table(table, tmp_path / "findings.csv", {"twin_reads": reads})
    html = str(grid_html(read_table(tmp_path / "findings.csv")))
    assert "Each twin read 0.2 of its model's documents" in html and "⌈0.2 × n⌉, at least 2" in html
    assert "computing only what its verdicts read" in html
    with_figures = twin_reads(["a-twin"], set(), cfg)  # not a point of its own: a twin with figures
    assert with_figures == {"a-twin": {"documents_fraction": 1.0, "claims_only": False}}
    write_table(table, tmp_path / "figures.csv", {"twin_reads": with_figures})
    html = str(grid_html(read_table(tmp_path / "figures.csv")))
    assert "Each twin read every document its model read" in html and "of its model's documents" not in html
    assert "Each twin read" not in str(grid_html(table))  # no record
    alone = fd.findings_table([finding()], DEFAULTS, sc[:1], ["a"], twins=None)
    alone.attrs["twin_reads"] = reads  # a record, but no twin in the grid
    assert "Each twin read" not in str(grid_html(alone))


def test_findings_table_reads_each_verdict_against_the_twin(tmp_path):
    """The twin's own verdicts come from its scorecard like any model's; its model's rows say
    what it gave, and a value that passes the threshold but does not beat the twin's by the
    margin is `holds on null`, shown ✓◆ on amber, never plain green; the grid shows the model only."""
    sc = _twin_scorecards(tmp_path, (("a", 0.2), ("a-twin", 0.3)))
    # P5 (<=, threshold 0.5): the margin is 0.25 x 0.5 = 0.125; 0.3 - 0.2 = 0.1 is less
    table = fd.findings_table([finding()], DEFAULTS, sc, ["a", "a-twin"], twins={"a-twin": "a"})
    a = table.set_index("model").loc["a"]
    assert (a["verdict"], a["twin_verdict"], a["twin_value"], a["origin"]) == ("holds on null", "holds", 0.3, "on null")
    assert a["null_margin"] == pytest.approx(0.125) and "not beaten by the margin 0.125" in a["reason"]
    twin = table.set_index("model").loc["a-twin"]
    assert (twin["verdict"], twin["origin"], twin["twin_of"]) == ("holds", "", "a")  # the null keeps its own verdict
    html = str(grid_html(table))
    assert "<th>a-twin</th>" not in html and "Random-init twin a-twin: holds (0.3)" in html
    assert '<td class="v-holds-on-null"' in html and '0.2 <span class="fg-g">✓◆</span>' in html
    assert '<td class="v-holds"' not in html
    assert "✓◆ holds on null</span>" in html  # in the legend
    assert fd.counts(table)["a"] == {"holds": 0, "holds on null": 1, "fails": 0, "not measurable": 0}
    # every origin survives a plain pandas.read_csv (no value pandas reads as NaN, as "null" would be)
    write_table(table, tmp_path / "findings.csv")
    assert pd.read_csv(tmp_path / "findings.csv").set_index("model").loc["a", "origin"] == "on null"
    assert not set(fd.ORIGINS) & {"null", "NULL", "NA", "nan", "None", "n/a"}
    # a smaller margin: 0.1 >= 0.05 x 0.5, learned, plain green
    loose = {**DEFAULTS, "null_margin": 0.05}
    a = fd.findings_table([finding()], loose, sc, ["a", "a-twin"], twins={"a-twin": "a"}).set_index("model").loc["a"]
    assert (a["verdict"], a["origin"]) == ("holds", "learned") and "beats its twin's 0.3 by 0.1" in a["reason"]
    # the twin failing: learned
    sc2 = _twin_scorecards(tmp_path / "2", (("a", 0.2), ("a-twin", 0.9)))
    a = fd.findings_table([finding()], DEFAULTS, sc2, ["a", "a-twin"], twins={"a-twin": "a"}).set_index("model").loc["a"]
    assert (a["verdict"], a["twin_verdict"], a["origin"]) == ("holds", "fails", "learned")


@pytest.mark.parametrize("predicate, value, twin, expected", [
    (">=", 0.6, 0.4, ("holds", "learned")),          # beats the twin by 0.2 >= 0.25 x 0.5
    (">=", 0.6, 0.5, ("holds on null", "on null")),     # by 0.1 only
    (">=", 0.6, 0.9, ("holds on null", "on null")),     # the twin does better: not learned either
    ("<=", 0.4, 0.6, ("holds", "learned")),          # below the twin by 0.2
    ("<=", 0.4, 0.2, ("holds on null", "on null")),     # the twin is lower still
    (">=", 0.6, None, ("holds", "learned")),         # the twin has no value: it lacks the object
])
def test_against_null_margin_in_the_predicates_direction(predicate, value, twin, expected):
    f = finding(predicate=predicate, threshold="t")
    thr = {"t": 0.5, "null_margin": 0.25}
    tv = "fails" if twin is None else "holds"
    assert fd.against_null(f, "holds", value, "not measurable" if twin is None else tv, twin, thr)[:2] == expected
    assert fd.margin(f, thr) == pytest.approx(0.125)


def test_against_null_structural_and_no_null_and_other_verdicts():
    thr = {"t": 0.5, "null_margin": 0.25}
    built = finding(predicate=">=", threshold="t", structural="a softmax is always a distribution")
    # a structural finding keeps its verdict, twin or not, and says why
    assert fd.against_null(built, "holds", 0.6, "holds", 0.6, thr)[:2] == ("holds", "structural")
    assert "a softmax" in fd.against_null(built, "fails", 0.1, None, None, thr)[2]
    plain = finding(predicate=">=", threshold="t")
    # no twin: the verdict stays, origin no null, said in the reason of a holds
    v, o, words = fd.against_null(plain, "holds", 0.9, None, None, thr)
    assert (v, o) == ("holds", "no null") and "no null" in words
    assert fd.against_null(plain, "fails", 0.1, None, None, thr) == ("fails", "no null", "")
    # fails and not measurable are kept beside a twin
    assert fd.against_null(plain, "fails", 0.1, "holds", 0.9, thr) == ("fails", "", "")
    assert fd.against_null(plain, "not measurable", None, "holds", 0.9, thr) == ("not measurable", "", "")


def test_findings_table_structural_and_no_null_columns(tmp_path):
    """A structural finding is shown apart (column `structural`, origin, the grid's ≡ on a
    blue-grey cell, never green); a model without a twin says `no null`."""
    sc = _twin_scorecards(tmp_path, (("a", 0.2),))
    built = finding(structural="the ratio is at most one on any model")
    table = fd.findings_table([built], DEFAULTS, sc, ["a"])
    a = table.set_index("model").loc["a"]
    assert (a["verdict"], a["origin"], a["structural"]) == ("holds", "structural", "the ratio is at most one on any model")
    html = str(grid_html(table))
    assert '<td class="v-structural"' in html and '<span class="fg-g">✓≡</span>' in html and "P5</a> ≡" in html
    plain = fd.findings_table([finding()], DEFAULTS, sc, ["a"], twins={}).set_index("model").loc["a"]
    assert (plain["verdict"], plain["origin"]) == ("holds", "no null") and "no null" in plain["reason"]
    assert "(no null: no random-init twin)" in str(grid_html(fd.findings_table([finding()], DEFAULTS, sc, ["a"],
                                                                              twins={})))
    # twins=None (the dynamics sweep's checkpoints): the plain threshold verdicts
    bare = fd.findings_table([finding()], DEFAULTS, sc, ["a"]).set_index("model").loc["a"]
    assert (bare["verdict"], bare["origin"]) == ("holds", "") and "no null" not in bare["reason"]
    with pytest.raises(PosmechError, match="findings.null_margin"):
        fd.findings_table([finding()], {**DEFAULTS, "null_margin": -1}, sc, ["a"])


def test_grid_cells_carry_a_glyph_per_verdict_and_rows_the_quantity_they_judge(tmp_path):
    """The verdict reads without the colour: ✓ holds, ✗ fails, n/m not measurable in every
    cell, each in the legend; every row names the quantity its finding judges (column
    "judges", and in the claim's and each cell's tooltip), and the legend says the grid and
    the scorecard compare different quantities."""
    import re

    scorecards = []
    for m, v in (("a", 0.2), ("c", 0.9)):  # holds on a, fails on c; b has no scorecard: not measurable
        sc = tmp_path / "results" / m / "scorecard" / "prev_knockout.csv"
        sc.parent.mkdir(parents=True)
        write_table(scorecard_rows([{"claim": "P5", "model": m, "quantity": "prev_token_mass_ratio", "value": v}]), sc)
        scorecards.append(str(sc))
    p8 = finding(claim="P8", rule="extended_positional_embeddings", quantity="cross_token_cosine", predicate=">=",
                 threshold="p8_min_cross_token_cosine")
    table = fd.findings_table([finding(), p8], DEFAULTS, scorecards, ["a", "b", "c"])
    html = str(grid_html(table))
    cells = dict(re.findall(r'<td class="v-([a-z-]+)" title="[^"]*">(.*?)</td>', html))
    assert len(re.findall(r'<td class="v-', html)) == 6
    for verdict, glyph in (("holds", "✓"), ("fails", "✗"), ("not-measurable", "n/m")):
        assert cells[verdict].endswith(f'<span class="fg-g">{glyph}</span>'), (verdict, cells[verdict])
        assert f"{glyph} {verdict.replace('-', ' ')}</span>" in html  # the legend
    assert cells["holds"].startswith("0.2 ") and cells["fails"].startswith("0.9 ")
    # the quantity judged: a column per row, the claim's and the cells' tooltips
    rows = re.findall(r'<tr><th class="fg-claim" title="([^"]*)"><a href="#claim-(P\d+)">P\d+</a></th>'
                      r'<td class="fg-q">([^<]*)</td>', html)
    assert {(c, q) for _, c, q in rows} == {("P5", "prev_token_mass_ratio"), ("P8", "cross_token_cosine")}
    assert all(f"(judges {q})" in tip for tip, _, q in rows)
    assert "Judges cross_token_cosine" in html and '<th class="fg-q"' in html
    # the grid's quantity and the scorecard's published values: two different comparisons, said once
    assert "(P8: <code>cross_token_cosine</code>)" in html
    assert "the scorecard below compares the posts' published values" in html


def test_grid_of_no_findings():
    assert "No findings" in str(grid_html(pd.DataFrame(columns=fd.FINDINGS_COLUMNS)))


def _role_tables():
    """Per-analysis tables of a 2 x 2 model with known roles (the columns the rules write)."""
    names = ["L0H0", "L0H1", "L1H0", "L1H1"]
    taxonomy = pd.DataFrame({"head_name": names, "is_previous_token": [False, True, True, False],
                             "prev_token_mass": [0.1, 0.4, 0.9, 0.2], "prev_token_excess": [0.0, 0.3, 0.8, 0.1],
                             "ratio": [0.9, 0.5, 0.02, 0.8], "rank": [None, 2, 1, None]})
    chosen = pd.DataFrame({"role": ["sharp", "early"], "head_name": ["L1H0", "L0H1"]})
    taxa = pd.DataFrame({"head_name": names, "taxon": ["neither", "dark diagonal", "bright sub-diagonal", "neither"],
                         "dip": [0.0, 0.5, -0.1, 0.0], "bump": [0.0, -0.2, 0.7, 0.1]})
    etc = pd.DataFrame({"head_name": names, "n": 20, "etc_mean": [1.5, 19.0, 8.0, 18.5],
                        "etc_fraction": [0.075, 0.95, 0.4, 0.925],
                        "kernel_type": ["local", "uniform", "slow_decay", "uniform"],
                        "zero_score_kernel_type": "uniform"})
    classes = pd.DataFrame({"head_name": ["L0H0", "L0H1"], "head_class": ["contextual", "detokenization"],
                            "duplicate_excess": [0.01, 0.02], "local_mass": [0.1, 0.8], "etc_fraction": [0.5, 0.1]})
    roles = pd.DataFrame({"role": ["previous", "look_back_two", "induction"], "head_name": ["L1H0", "none", "L1H1"]})
    masses = pd.DataFrame({"head_name": ["L1H0", "L1H0", "L1H1"], "mass": ["previous", "offset_2", "induction_score"],
                           "value": [0.95, 0.01, 0.4]})
    return dict(taxonomy=taxonomy, chosen=chosen, taxa=taxa, etc=etc, n=20, classes=classes, roles=roles,
                masses=masses)


def test_head_table_joins_the_roles_of_every_analysis():
    from posmech.verdicts.heads import HEAD_COLUMNS, head_table

    df = head_table("m", **_role_tables())
    assert list(df.columns) == HEAD_COLUMNS
    assert list(df["head_name"]) == ["L0H0", "L0H1", "L1H0", "L1H1"] and list(df["layer"]) == [0, 0, 1, 1]
    r = df.set_index("head_name")
    # every role with its score and its pass/fail
    assert r.loc["L1H0", "previous_token"] and r.loc["L1H0", "prev_token_mass"] == 0.9
    assert not r.loc["L1H1", "previous_token"] and r.loc["L1H1", "prev_token_mass"] == 0.2
    assert list(r["p7_chosen"]) == ["none", "early", "sharp", "none"]
    assert r.loc["L1H0", "score_taxon"] == "bright sub-diagonal" and r.loc["L1H0", "taxon_bump"] == 0.7
    assert r.loc["L0H0", "kernel_type"] == "local" and r.loc["L0H0", "etc_fraction"] == 0.075
    assert list(r["kernel_role"]) == ["local", "none", "slow_decay", "none"]  # a uniform kernel is no role
    assert r.loc["L0H1", "prev_token_excess"] == 0.3
    assert r.loc["L0H1", "k7_class"] == "detokenization" and r.loc["L0H1", "k7_local_mass"] == 0.8
    assert pd.isna(r.loc["L1H0", "k7_class"])  # K7 is about layer 0 only
    # the look-back-two role is none: no head carries it, not the best of the rest
    assert list(r["l_role"]) == ["none", "none", "previous", "induction"]
    assert r.loc["L1H1", "l_induction_score"] == 0.4


def test_head_table_leaves_an_analysis_the_model_is_not_in_empty_and_names_a_missing_column():
    from posmech.verdicts.heads import head_table

    tables = _role_tables()
    df = head_table("m", etc=tables["etc"], n=20)
    assert df["kernel_type"].notna().all() and df["previous_token"].isna().all() and df["l_role"].isna().all()
    with pytest.raises(PosmechError, match="taxa.csv lacks the column.*'dip'.*score_taxa"):
        head_table("m", taxa=tables["taxa"].drop(columns=["dip"]))
    with pytest.raises(PosmechError, match="no row at n=7"):
        head_table("m", etc=tables["etc"], n=7)
    with pytest.raises(PosmechError, match="etc.csv lacks the column.*'zero_score_kernel_type'.*etc_table"):
        head_table("m", etc=tables["etc"].drop(columns=["zero_score_kernel_type"]), n=20)


def test_a_kernel_its_zero_score_kernel_already_has_and_a_fallback_sharp_head_are_no_roles():
    """A slowly decaying kernel that the head's zero-score kernel (an ALiBi bias) already has is no
    role; neither is the sharp head the taxonomy chose by its fallback (no previous-token head)."""
    from posmech.analyses.taxonomy import SHARP_FALLBACK_RULE
    from posmech.verdicts.heads import head_table

    tables = _role_tables()
    etc = tables["etc"].assign(zero_score_kernel_type=["uniform", "uniform", "slow_decay", "uniform"])
    chosen = pd.DataFrame({"role": ["sharp"], "head_name": ["L1H1"], "rule": [SHARP_FALLBACK_RULE]})
    r = head_table("m", etc=etc, n=20, taxonomy=tables["taxonomy"], chosen=chosen).set_index("head_name")
    assert list(r["kernel_role"]) == ["local", "none", "none", "none"]
    assert list(r["kernel_type"]) == ["local", "uniform", "slow_decay", "uniform"]  # the type stays
    assert list(r["p7_chosen"]) == ["none"] * 4


def test_a_quantity_is_read_from_the_findings_own_claim(tmp_path):
    """L2 and L5 rows of one rule share the name posonly_pattern_offset1 (different heads)."""
    sc = tmp_path / "results" / "a" / "scorecard" / "input_decomposition.csv"
    sc.parent.mkdir(parents=True)
    write_table(scorecard_rows([
        {"claim": "L2", "model": "a", "quantity": "posonly_pattern_offset1", "value": 0.95},
        {"claim": "L5", "model": "a", "quantity": "posonly_pattern_offset1", "value": None, "detail": "no head"},
    ]), sc)
    l2 = finding(claim="L2", rule="input_decomposition", quantity="posonly_pattern_offset1", predicate=">=",
                 threshold="l2_min_position_only_previous")
    table = fd.findings_table([l2], DEFAULTS, [str(sc)], ["a"])
    assert table["verdict"].tolist() == ["holds"] and table["value"].tolist() == [0.95]
