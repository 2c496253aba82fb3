"""The demo run's numbers in the docs come from a run (issue 46, item 2).

Every number of README.md and docs/*.md that ``make demo`` produces sits in a block
``<!-- generated: numbers.NAME -->`` written by :mod:`posmech.pipeline.demo_numbers` from
``docs/demo-numbers.json``, which ``make demo-numbers`` writes from the run's ``results/``.
These tests fail when a block differs from the stored run, when ``config/demo.yaml`` trains a
model differently from the stored run, and when a run's number is typed by hand outside the
blocks (not as a range, not in the posts' published values, not in a paragraph marked as history)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from posmech.core.errors import PosmechError
from posmech.core.generated import fill_blocks
from posmech.pipeline import demo_numbers as dn
from posmech.pipeline.reference import Sources, fill

REPO = Path(__file__).resolve().parents[1]


def test_the_docs_blocks_are_written_from_the_stored_run():
    texts = dn.written()
    assert {REPO / "README.md", REPO / "docs" / "demo-model.md", REPO / "docs" / "claims.md"} <= set(texts)
    assert dn.stale() == [], f"{dn.stale()}: a block of the demo run's numbers differs; run {dn.WRITE_COMMAND}"


def test_the_stored_run_trained_what_config_demo_trains():
    """A model trained differently (config/demo.yaml's `train`) makes other numbers: the stored ones
    are stale until `make demo` and `make demo-numbers` have run."""
    stored = dn.read().data["train"]
    config = dn.trained_models(yaml.safe_load(dn.DEMO_CONFIG.read_text(encoding="utf-8")))
    now = {m: dn.train_digest(t) for m, t in config.items()}
    assert stored == now, (f"config/demo.yaml trains {sorted(m for m in now if stored.get(m) != now[m])} "
                           f"differently from the run in docs/demo-numbers.json: run make demo, then {dn.COMMAND}")


def test_no_run_number_is_typed_by_hand_outside_the_blocks():
    found = dn.typed_run_numbers()
    assert found == [], ("numbers of the demo run typed by hand (put them in a `numbers.` block of "
                         "posmech.pipeline.demo_numbers, write a range with its reason, or mark a paragraph of "
                         "earlier recipes `<!-- history: ... -->`):\n" + "\n".join(found))


# --------------------------------------------------------------------------- a run, built
def _table(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(path, index=False)


def _run(root: Path) -> tuple[Path, Path]:
    """A results/ folder with what a demo run writes for one trained model and its twin, and
    the config that trained it."""
    config = root / "demo.yaml"
    config.write_text(yaml.safe_dump({"models": {"tiny": {"train": {"n_layer": 2, "seed": 3}},
                                                 "gpt2": {"device": "cpu"}}}), encoding="utf-8")
    results = root / "results"
    summary = {
        "model": "tiny", "architecture": "gpt2", "best_previous_token_head": "L1H0",
        "best_previous_token_score": 0.9123456, "previous_token_scores": [[0.1, 0.2], [0.9123456, 0.45]],
        "best_look_back_two_head": "L0H1", "best_look_back_two_score": 0.2164,
        "best_induction_head": "L1H1", "best_induction_score": 0.8555, "induction_reads_head": "L0H0",
        "previous_token_heads_below": ["L0H0"], "induction_score_with_previous_token_heads_ablated": 0.1,
        "p_correct_repeated": 0.93, "p_correct_repeated_ablated": 0.15, "heldout_loss": 1.98249,
        "train_cpu_seconds": 12.5,
        "train_config": {"n_layer": 2, "n_head": 2, "d_model": 32, "silent_attention_layers": []},
    }
    (results / "tiny" / "training").mkdir(parents=True)
    (results / "tiny" / "training" / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    _table(results / "tiny" / "heads.csv", [
        {"model": "tiny", "head_name": "L0H0", "prev_token_mass": 0.3, "diagonal_ratio": 0.8, "p7_chosen": "early"},
        {"model": "tiny", "head_name": "L1H0", "prev_token_mass": 0.928, "diagonal_ratio": 0.0326,
         "p7_chosen": "sharp"}])
    _table(results / "tiny" / "scorecard" / "prev_knockout.csv", [
        {"claim": "P5", "model": "tiny", "quantity": "prev_token_mass_intact", "value": 0.931, "detail": "", "artifact": ""},
        {"claim": "P5", "model": "tiny", "quantity": "prev_token_mass_knockout", "value": 0.5, "detail": "", "artifact": ""},
        {"claim": "P5", "model": "tiny", "quantity": "other", "value": 7.0, "detail": "", "artifact": ""}])
    _table(results / "tiny-twin" / "scorecard" / "random_token_patterns.csv", [
        {"claim": "L1", "model": "tiny-twin", "quantity": "previous_candidate_score", "value": 0.136,
         "detail": "", "artifact": ""},
        {"claim": "L1", "model": "tiny-twin", "quantity": "previous_token_head", "value": "[]", "detail": "",
         "artifact": ""}])
    base = {"threshold": 0.9, "reason": "", "rule": "r", "finding": ""}
    _table(results / "report" / "findings.csv", [
        {**base, "claim": "P7", "model": "tiny", "verdict": "holds", "quantity": "min(diagonal_ratio)",
         "value": 0.0326, "twin_of": "", "twin_verdict": "fails", "twin_value": 0.98, "origin": "learned"},
        {**base, "claim": "P8", "model": "tiny", "verdict": "fails", "quantity": "cross_token_cosine",
         "value": 0.797, "twin_of": "", "twin_verdict": "holds", "twin_value": 0.982, "origin": ""},
        {**base, "claim": "K1", "model": "tiny", "verdict": "holds", "quantity": "kernel_defined_fraction",
         "value": 1.0, "twin_of": "", "twin_verdict": "holds", "twin_value": 1.0, "origin": "structural"},
        {**base, "claim": "K1", "model": "tiny-twin", "verdict": "holds", "quantity": "kernel_defined_fraction",
         "value": 1.0, "twin_of": "tiny", "twin_verdict": "", "twin_value": None, "origin": ""},
    ])
    return results, config


def test_a_run_gives_the_blocks_its_numbers(tmp_path):
    results, config = _run(tmp_path)
    data = dn.collect(results, config)
    assert list(data["train"]) == ["tiny"]  # gpt2 is not trained: not a demo model
    assert data["train"]["tiny"] == dn.train_digest({"n_layer": 2, "seed": 3})
    assert data["models"]["tiny-twin"]["twin_of"] == "tiny"
    assert data["models"]["tiny"]["scorecard"]["prev_knockout"] == {"prev_token_mass_intact": 0.931,
                                                                   "prev_token_mass_knockout": 0.5}
    run = dn.Run(data)
    readme = "\n".join(dn.readme_table(run))
    assert "| `tiny` | GPT-2, 2 layers × 2 heads, d_model 32: learned positions, LayerNorm, MLPs | L1H0 0.912 | " \
           "L1H1 0.856 (L0H0) | 1.982 |" in readme
    assert dn.VARIES in readme
    models = "\n".join(dn.models_table(run))
    assert "**L1H0 0.912** | " in models  # L1H1 0.45 is under half of it: not listed
    assert "| L0H1 0.216 |" in models
    twins = "\n".join(dn.twins_table(run))
    assert "| P7 | `min(diagonal_ratio)` | 0.033 ✓ | 0.980 ✗ |" in twins
    assert "| P8 | `cross_token_cosine` | 0.797 ✗ | 0.982 ✓ |" in twins
    assert "Structural on `tiny` (it holds, and so does its twin): K1." in twins
    assert "`tiny-twin`'s best previous-token candidate scores 0.136" in twins
    rules = "\n".join(dn.p_rules(run, "tiny"))
    assert "the sharp head is L1H0, diagonal ratio 0.033; its previous-token mass 0.928" in rules
    assert "L1H0's previous-token mass 0.931 → 0.500" in rules
    counts = "\n".join(dn.findings_counts(run))
    assert "- `tiny` (3 claims): holds 2 (P7, K1), fails 1, not measurable 0" in counts


def test_a_missing_run_says_to_run_make_demo(tmp_path):
    results, config = _run(tmp_path)
    (results / "tiny" / "training" / "summary.json").unlink()
    with pytest.raises(PosmechError, match=r"summary.json is missing.*make demo"):
        dn.collect(results, config)
    with pytest.raises(PosmechError, match=r"findings.csv is missing.*make demo"):
        dn.collect(tmp_path / "nothing", config)


def test_each_generator_leaves_the_others_blocks_alone():
    text = ("a\n<!-- generated: numbers.readme-table -->\nkept as it is\n<!-- end generated -->\n"
            "<!-- generated: families -->\n<!-- end generated -->\n")
    out = fill(text, Sources())[0]
    assert "kept as it is" in out and "| `attn_only` |" in out
    numbers = fill_blocks(out, "x", lambda name: dn.block(dn.read(), name))
    assert "kept as it is" not in numbers and dn.VARIES in numbers
    assert "| `attn_only` |" in numbers  # the declarations' table stays
    with pytest.raises(PosmechError, match="no such block"):
        dn.block(dn.read(), "numbers.nope")


def test_a_typed_run_number_is_found(tmp_path):
    run = dn.Run({"models": {"tiny": {"summary": {"best_previous_token_score": 0.9123}}}})
    doc = tmp_path / "doc.md"
    doc.write_text(
        "The head L1H0 0.926 is sharp.\n"                               # 1: typed head score
        "Seeds gave 0.86–0.92 on L1H0 (a range).\n"                      # 2: a range: fine
        "held-out loss 1.987, and 0.912 of its attention.\n"             # 3: loss; a stored value
        "\n<!-- generated: numbers.readme-table -->\nL1H0 0.912\n<!-- end generated -->\n\n"
        "Seed 1 gave L1H0 0.79.\n<!-- history: another recipe -->\n\n"   # a marked paragraph
        "## P — the post\n\nL4H11 0.01, L5H6 0.18\n\n## Next\n\nP7: 0.030 and 0.074\n",
        encoding="utf-8")
    found = dn.typed_run_numbers([doc], run)
    assert [f.split(": ", 1)[1] for f in found] == [
        "'L1H0 0.926'", "'held-out loss 1.987'", "'0.912' (a number of the stored run)", "'P7: 0.030'"]
    assert found[0].startswith(f"{doc}:1:") and found[-1].startswith(f"{doc}:18:")
