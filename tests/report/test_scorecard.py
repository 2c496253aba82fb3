"""Scorecard: published values × fabricated result tables → pass / fail / n.a. / missing."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from posmech.core.errors import PosmechError
from posmech.verdicts import scorecard as sc
from posmech.store.tables import scorecard_rows, write_table

REPO = Path(__file__).resolve().parents[2]

PUBLISHED = {
    "entries": [
        {"claim": "P6", "quantity": "n_prev_token_heads", "model": "gpt2", "source": "000",
         "what": "count", "published": 69, "tolerance": {"abs": 5}},
        {"claim": "P7", "quantity": "diagonal_ratio", "model": "gpt2", "source": "000", "what": "ratios",
         "published": {"L4H11": 0.01, "L5H6": 0.18}, "tolerance": {"abs": 0.05}},
        {"claim": "P8", "quantity": "layer0_max_abs_diff", "model": "gpt2", "any_model": True,
         "source": "000", "what": "identity", "published": 0, "tolerance": {"at_most": 1e-4}},
        {"claim": "P8", "quantity": "cross_token_cosine", "model": "gpt2", "source": "000",
         "what": "agreement", "published": "almost the same", "tolerance": {"at_least": 0.9}},
        {"claim": "P1", "quantity": "wpos_helix", "model": "gpt2", "source": "000", "what": "helix",
         "published": "figure", "tolerance": None},
        {"claim": "K4", "quantity": "layer0_local_heads", "model": "gpt2", "source": "003",
         "what": "local heads", "published": ["L0H3", "L0H4", "L0H7"], "tolerance": {"min_jaccard": 0.6}},
        {"claim": "K7", "quantity": "other_heads", "model": "gpt2", "source": "004", "what": "other",
         "published": ["L0H11"], "tolerance": {"set": "exact"}},
        {"claim": "P16", "quantity": "p_pirate_after", "model": "gpt2", "source": "000", "what": "p",
         "published": 0.65, "tolerance": {"abs": 0.1}, "rule": "induction_intervention"},
        {"claim": "C2", "quantity": "named_neurons", "model": "gpt2", "source": "004", "what": "n",
         "published": "300, 1621, 1710", "tolerance": None},
    ]
}


@pytest.fixture
def published(tmp_path: Path) -> list[sc.Published]:
    p = tmp_path / "published.yaml"
    p.write_text(yaml.safe_dump(PUBLISHED))
    return sc.load_published(p)


def _write(tmp: Path, model: str, rule: str, rows: list[dict]) -> Path:
    path = tmp / "results" / model / "scorecard" / f"{rule}.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_table(scorecard_rows([{**r, "model": model} for r in rows]), path, {"rule": rule})
    return path


def _status(card, claim, quantity, model):
    row = card[(card.claim == claim) & (card.quantity == quantity) & (card.model == model)]
    assert len(row) == 1, (claim, quantity, model, card[["claim", "quantity", "model"]])
    return row.iloc[0]


def test_fabricated_tables_give_pass_fail_na_missing(tmp_path, published):
    files = [
        # gpt2: P6 passes (71 within 5 of 69), P7 fails on L5H6, P8 cosine given but the
        # identity row is absent -> missing; K4 Jaccard 2/4 < 0.6 fails; K7 passes.
        _write(tmp_path, "gpt2", "taxonomy", [
            {"claim": "P6", "quantity": "n_prev_token_heads", "value": 71, "artifact": "results/gpt2/t.png"},
            {"claim": "P7", "quantity": "diagonal_ratio", "value": {"L4H11": 0.02, "L5H6": 0.40}},
        ]),
        _write(tmp_path, "gpt2", "geometry", [
            {"claim": "P8", "quantity": "cross_token_cosine", "value": 0.97},
            {"claim": "P1", "quantity": "wpos_helix", "value": 0.91, "detail": "explained variance top-3"},
        ]),
        _write(tmp_path, "gpt2", "kernels", [
            {"claim": "K4", "quantity": "layer0_local_heads", "value": ["L0H3", "L0H5", "L0H4", "L0H9"]},
            {"claim": "K7", "quantity": "other_heads", "value": ["L0H11"]},
            {"claim": "K4", "quantity": "etc_mean", "value": 12.5},
        ]),
        # demo: gpt2 numbers are other model, but the any_model identity is judged (and fails)
        _write(tmp_path, "demo", "taxonomy", [
            {"claim": "P6", "quantity": "n_prev_token_heads", "value": 69},
        ]),
        _write(tmp_path, "demo", "geometry", [
            {"claim": "P8", "quantity": "layer0_max_abs_diff", "value": 0.5},
            {"claim": "P8", "quantity": "cross_token_cosine", "value": ""},
        ]),
        # a registered scorecard of the rule named by P16's entry, without its row
        _write(tmp_path, "gpt2", "induction_intervention", []),
    ]
    rows = sc.read_scorecards(files)
    card = sc.build_scorecard(published, rows, sc.registered_rules(files))

    assert _status(card, "P6", "n_prev_token_heads", "gpt2").status == "pass"
    p7 = _status(card, "P7", "diagonal_ratio", "gpt2")
    assert p7.status == "fail" and "L5H6" in p7.reason and "L4H11" not in p7.reason
    assert _status(card, "P8", "cross_token_cosine", "gpt2").status == "pass"
    missing = _status(card, "P8", "layer0_max_abs_diff", "gpt2")
    assert missing.status == "missing" and missing.reproduced == "—"
    assert missing.reason.endswith("no row has quantity 'layer0_max_abs_diff' (expected from rule geometry)")
    assert missing.rule == "geometry"  # the rule of the claim's other rows on the model
    assert _status(card, "P1", "wpos_helix", "gpt2").status == "qualitative"
    k4 = _status(card, "K4", "layer0_local_heads", "gpt2")
    assert k4.status == "fail" and "0.40" in k4.reason
    assert _status(card, "K7", "other_heads", "gpt2").status == "pass"
    assert _status(card, "K4", "etc_mean", "gpt2").status == "no published value"
    assert _status(card, "P16", "p_pirate_after", "gpt2").status == "missing"

    na = _status(card, "P6", "n_prev_token_heads", "demo")
    assert na.status == "other model" and "gpt2" in na.reason and na.reproduced == "69"
    assert _status(card, "P8", "layer0_max_abs_diff", "demo").status == "fail"
    empty = _status(card, "P8", "cross_token_cosine", "demo")  # a row without a value or a detail
    assert empty.status == "other model" and "rule geometry wrote no 'cross_token_cosine' for demo" in empty.reason
    # claims the run does not cover are not rows; C2 is never claimed by any table
    assert "C2" not in set(card.claim)
    assert sc.uncovered_claims(published, card) == ["C2"]
    assert not (card.status == "pass").any() or set(card[card.reproduced == "—"].status) <= {
        "missing", "other model"}
    # order: families P, L, K, C then claim number
    assert list(dict.fromkeys(card.claim)) == ["P1", "P6", "P7", "P8", "P16", "K4", "K7"]


@pytest.mark.parametrize(
    ("published", "tolerance", "value", "status"),
    [
        (0.65, {"abs": 0.1}, 0.56, "pass"),
        (0.65, {"abs": 0.1}, 0.5, "fail"),
        (3, {"rel": 0.5}, 4.4, "pass"),
        (3, {"rel": 0.5}, 4.6, "fail"),
        ([8, 9, 10], {"abs": 3}, [9.5, 7, 12.9], "pass"),
        ([8, 9, 10], {"abs": 3}, [9.5, 7], "fail"),
        (">= 0.99", {"at_least": 0.98}, 0.985, "pass"),
        (">= 0.99", {"at_least": 0.98}, 0.97, "fail"),
        ("20", {"range": [10, 50]}, 50, "pass"),
        ("20", {"range": [10, 50]}, 100, "fail"),
        (["L0H6", "L0H8"], {"set": "exact"}, ["L0H8", "L0H6"], "pass"),
        (["L0H6", "L0H8"], {"set": "exact"}, ["L0H8"], "fail"),
        (["L4H11"], {"subset": True}, ["L4H11", "L5H6"], "pass"),
        (["L4H11"], {"subset": True}, ["L5H6"], "fail"),
        ([0, -2], {"set": "exact"}, [-2, 0], "pass"),
        (0.65, {"abs": 0.1}, "not a number", "fail"),
        (0.65, {"abs": 0.1}, None, "missing"),
        ("figure", None, 1.0, "qualitative"),
    ],
)
def test_judge(published, tolerance, value, status):
    assert sc.judge(published, tolerance, value)[0] == status


def test_parse_value_round_trips_scorecard_cells():
    assert sc.parse_value('["L0H3", "L0H4"]') == ["L0H3", "L0H4"]
    assert sc.parse_value("0.25") == 0.25
    assert sc.parse_value(float("nan")) is None
    assert sc.parse_value("") is None
    assert sc.parse_value("helix") == "helix"


def test_repository_published_values_are_valid_and_cover_every_claim():
    entries = sc.load_published(REPO / "resources" / "published.yaml")
    claims = {e.claim for e in entries}
    expected = {f"P{i}" for i in range(1, 19)} | {f"L{i}" for i in range(1, 6)} | {
        f"K{i}" for i in range(1, 11)} | {f"C{i}" for i in range(1, 4)} | {f"S{i}" for i in range(1, 6)}
    assert claims == expected
    by = {(e.claim, e.quantity): e for e in entries}
    assert by[("P6", "n_prev_token_heads_post")].published == 69  # the post's own loose definition
    assert by[("P7", "diagonal_ratio_post")].published["L3H2"] == 0.52
    assert by[("P11", "canonical_angles_deg")].published == [8, 9, 10]
    assert by[("L5", "posonly_pattern_offset2")].model == "attn-only-2l"
    assert by[("L5", "posonly_pattern_offset2")].published == 0.585
    assert by[("K7", "duplicate_token_heads")].published == ["L0H1", "L0H5"]
    # the posts' numbers (005: a paper); the S claims (beyond the posts) name their paper
    assert all(e.source in {"000", "001", "003", "004", "005"} for e in entries if not e.claim.startswith("S"))
    assert all(not e.source.isdigit() and sc.post(e.source) == e.source for e in entries if e.claim.startswith("S"))
    assert by[("S3", "first_token_head_share")].tolerance == {"range": [0.31, 0.44]}


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"claim": "X1"}, "not an ID"),
        ({"tolerance": {"abs": "big"}}, "needs a number"),
        ({"tolerance": {"within": 1}}, "one-key mapping"),
        ({"source": None, "published": None, "what": None, "quantity": None, "claim": None}, "claim"),
    ],
)
def test_invalid_published_file_names_the_entry(tmp_path, entry, message):
    good = dict(PUBLISHED["entries"][0])
    bad = {**good, **entry}
    if entry.get("claim", "") is None:
        bad = {"model": "gpt2"}
        message = "missing key"
    p = tmp_path / "published.yaml"
    p.write_text(yaml.safe_dump({"entries": [good, bad]}))
    with pytest.raises(PosmechError, match=message):
        sc.load_published(p)


def test_scorecard_path_must_follow_the_contract():
    assert sc.rule_of("results/demo/scorecard/taxonomy.csv") == ("demo", "taxonomy")
    with pytest.raises(PosmechError, match="scorecard path"):
        sc.rule_of("results/demo/taxonomy.csv")


def test_unreadable_scorecard_names_the_file_and_rule(tmp_path):
    bad = tmp_path / "results" / "gpt2" / "scorecard" / "etc_table.csv"
    bad.parent.mkdir(parents=True)
    bad.write_text("")
    with pytest.raises(PosmechError, match="etc_table"):
        sc.read_scorecards([bad])
    bad.write_text("claim,model\nP6,gpt2\n")
    with pytest.raises(PosmechError, match="lacks column"):
        sc.read_scorecards([bad])


def test_nothing_to_measure_and_compact_rows(tmp_path, published):
    """A row without a value but with a reason is "nothing to measure" (never a pass, the
    reason shown); rows of a model the posts give no value for are grouped per claim."""
    paths = [
        _write(tmp_path, "gpt2", "induction_intervention", [
            {"claim": "P16", "quantity": "p_pirate_after", "value": None,
             "detail": "no head in a layer >= 1 to redirect: the sharp head is in layer 0"},
        ]),
        _write(tmp_path, "demo", "diagonal_taxonomy", [
            {"claim": "P6", "quantity": "n_prev_token_heads", "value": 3, "detail": "on 10 documents"},
            {"claim": "P7", "quantity": "diagonal_ratio", "value": {"L1H0": 0.2}},
            {"claim": "P7", "quantity": "extra_quantity", "value": None, "detail": "no previous-token head"},
        ]),
    ]
    card = sc.build_scorecard(published, sc.read_scorecards(paths), sc.registered_rules(paths))
    row = _status(card, "P16", "p_pirate_after", "gpt2")
    assert row.status == "nothing to measure" and "sharp head is in layer 0" in row.reason
    assert _status(card, "P7", "extra_quantity", "demo").status == "nothing to measure"
    assert "nothing to measure" in sc.STATUSES and set(sc.JUDGED) < set(sc.STATUSES)
    compact = sc.compact_rows(card)
    assert [(e["claim"], e["model"]) for e in compact] == [("P6", "demo"), ("P7", "demo")]
    p6, p7 = compact
    assert p6["measured"] == [{"quantity": "n_prev_token_heads", "value": "3", "detail": "on 10 documents"}]
    assert p6["published"] == [{"quantity": "n_prev_token_heads", "value": "69", "model": "gpt2"}]
    assert {m["quantity"] for m in p7["measured"]} == {"diagonal_ratio"}
    # judged rows never appear in the compact list
    assert not any(e["model"] == "gpt2" for e in compact)


def test_a_value_not_computed_names_its_rule_and_why(tmp_path):
    """Another model's row without a value names the rule that writes the quantity (never
    ``rule ?``) and, when the rule wrote the row empty with a detail, why: the row's rule,
    else the entry's ``rule:``, else the one rule of the claim's other rows, else the analysis
    that scores the claim (posmech.core.families.claims: P3 -> posembed_averaging)."""
    entries = [{"claim": "P3", "quantity": q, "model": "gpt2", "source": "000", "what": q, "published": ">= 0.99",
                "tolerance": {"at_least": 0.98}} for q in ("p_apple_k10", "p_orange_k10", "p_pear_k10")]
    p = tmp_path / "published.yaml"
    p.write_text(yaml.safe_dump({"entries": entries}))
    published = sc.load_published(p)
    why = "prompt apple_orange: the post's group size k = 10 is not in this run's grid k = 1, 8 (posembed_averaging.ks)"
    paths = [
        _write(tmp_path, "demo", "posembed_averaging", [
            {"claim": "P3", "quantity": "p_apple_k10", "value": None, "detail": why},
            {"claim": "P3", "quantity": "p_repeat_min_k10", "value": 0.4},
        ]),
        # P3 rows of two rules on model b: its missing quantities fall back on the claim's analysis
        _write(tmp_path / "b", "b", "posembed_averaging", [{"claim": "P3", "quantity": "p_x_intact", "value": 0.5}]),
        _write(tmp_path / "b", "b", "other_rule", [{"claim": "P3", "quantity": "p_y_intact", "value": 0.5}]),
    ]
    card = sc.build_scorecard(published, sc.read_scorecards(paths), sc.registered_rules(paths))
    assert not card["reason"].str.contains("rule ?", regex=False).any()
    apple = _status(card, "P3", "p_apple_k10", "demo")
    assert apple.status == "other model" and apple.rule == "posembed_averaging"
    assert "rule posembed_averaging gives no 'p_apple_k10' for demo: " + why in apple.reason
    orange = _status(card, "P3", "p_orange_k10", "demo")  # no row: the rule of the claim's other rows
    assert "not computed for it: rule posembed_averaging wrote no 'p_orange_k10' for demo" in orange.reason
    assert orange.rule == "posembed_averaging"
    pear = _status(card, "P3", "p_pear_k10", "b")
    assert "rule posembed_averaging wrote no 'p_pear_k10' for b" in pear.reason


def _setup_words(what: str, quantity: str) -> list[str]:
    """What in a published quantity's description names one model's setup (a head, a layer
    other than 0, a position n, a model) outside a "(the post: ...)" aside and the quantity's
    own name (``damage_L2H2`` is about L2H2 on any model)."""
    import re

    w = re.sub(r"\(?the post: [^)]*\)?|the post's|the paper", "", what, flags=re.I)
    found = [h for h in re.findall(r"L\d+H\d+", w) if h not in quantity]
    layers = [n for m in re.findall(r"layers?[ -]?(\d+)(?:\s*[-–]\s*(\d+))?", w) for n in m if n]
    found += [f"layer {n}" for n in layers if n != "0" and f"layer{n}" not in quantity]
    found += re.findall(r"\bn = \d+", w) + re.findall(r"gpt2|GPT-2|TinyStories|attn-only|pythia", w, re.I)
    return found


def test_setup_words_are_found_outside_the_post_aside():
    assert _setup_words("L4H11 previous-token mass (every 5th query, layers 0-3)", "ratio") == ["L4H11", "layer 3"]
    assert _setup_words("patterns at n = 1022 for TinyStories-Instruct-33M", "x") == ["n = 1022", "TinyStories"]
    assert _setup_words("the sharp head's mass (the post: L4H11, layers 0-3, n = 1022)", "ratio") == []
    assert _setup_words("relative loss of L2H2's attention", "damage_L2H2") == []


def test_published_descriptions_name_no_model_setup():
    """The scorecard shows each entry's ``what`` on the rows of every model of a run (issue 27:
    the rows' text is written from what the run used): it describes the quantity by role
    (the sharp previous-token head, a later layer), the post's own head, layers or n only in a
    "(the post: ...)" aside; the rule's ``detail`` names what this run used."""
    entries = sc.load_published(REPO / "resources" / "published.yaml")
    named = {f"{e.claim} {e.quantity}": _setup_words(e.what, e.quantity) for e in entries}
    assert {k: v for k, v in named.items() if v} == {}
