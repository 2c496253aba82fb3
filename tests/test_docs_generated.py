"""The docs' tables of analyses are written from the declarations (issue 48, item 1):
``workflow/analyses/<rule>.yaml`` is the one place an analysis is described, and
:mod:`posmech.pipeline.reference` (``make docs``) writes the marked blocks of README.md and
docs/*.md from it. A stale block fails here, naming the command; a new analysis shows in
every table without a hand edit."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from posmech.core.errors import PosmechError
from posmech.core.families import DECLARATIONS, read_declarations
from posmech.pipeline.reference import (COMMAND, DOCS, Sources, claim_ranges, fill, stale, written)

REPO = Path(__file__).resolve().parents[1]
WORKFLOW = REPO / "docs" / "workflow.md"
ARTIFACTS = REPO / "docs" / "artifacts.md"
CLAIMS = REPO / "docs" / "claims.md"


def test_the_docs_tables_are_written_from_the_declarations():
    """Every generated block of README.md and docs/*.md is what the declarations give."""
    texts = written()
    assert {WORKFLOW, ARTIFACTS, CLAIMS} <= set(texts)
    assert stale() == [], (
        f"{[str(p.relative_to(REPO)) for p in stale()]}: a table of analyses differs from "
        f"workflow/analyses/*.yaml; run {COMMAND}"
    )


def test_a_hand_edit_of_a_generated_row_is_overwritten():
    text = WORKFLOW.read_text(encoding="utf-8")
    row = "| `anatomy` | `score_anatomy`, `score_taxa` | P12, P13 |"
    assert row in text
    drifted = text.replace(row, "| `anatomy` | `score_anatomy` | P12 |")
    assert fill(drifted, Sources())[0] == text


def test_the_tables_say_what_the_declarations_say():
    sources = Sources()
    workflow = fill(WORKFLOW.read_text(encoding="utf-8"), sources)[0]
    # the attention-only family judges L1-L3 and L5 (L4 is bos_induction's, a rule of its own)
    assert "| `attn_only` | `random_token_patterns`, `input_decomposition` | L1–L3, L5 |" in workflow
    assert "| `bos_induction` | its own |" in workflow
    # what a model needs, with what it reads: the neurons need the layer-0 decomposition's too,
    # and no learned W_pos (they read the rotary and ALiBi layer 0 too)
    assert ("| `contextual_neurons` | — | `extended_token_embeddings`, `layer0_decomposition` | `mlp`, "
            "`layer0_weights`, `pre_ln` |") in workflow
    # the L rules need only their inputs per scheme (docs/claims.md), not a learned W_pos
    assert "| `random_token_patterns` | `position_variants` | — | `position_variants` |" in workflow
    assert '| `learned_wpos` | position scheme `learned` (learned absolute positions) | "no learned W_pos: ' in workflow
    claims = fill(CLAIMS.read_text(encoding="utf-8"), sources)[0]
    assert ("| P7 | `diagonal_taxonomy` (rule `taxonomy`) | `min(diagonal_ratio)` ≤ "
            "`findings.p7_max_sharpest_ratio` (default 0.1) |") in claims
    assert "| L5 | `random_token_patterns` (rule `attn_only`) |" in claims  # and input_decomposition's values
    assert claim_ranges(["P1", "P10", "P9", "P8", "P11", "K1", "K2", "C3"]) == "P1, P8–P11, K1, K2, C3"


def _declarations(tmp_path: Path) -> Path:
    """A copy of the shipped declarations, to change."""
    folder = tmp_path / "analyses"
    shutil.copytree(DECLARATIONS, folder)
    return folder


NEW = {
    "kernel_widths": {
        "does": "The width of every head's kernel at each query position (K11).",
        "needs": ["learned_wpos"],
        "reads": {"h5": "positional_kernels.h5"},
        "category": "K",
        "outputs": {
            "table": {"path": "results/{model}/kernels/widths.csv", "caption": "kernel_widths",
                      "section": "Positional kernels and ETC (K1-K5)"},
            "scorecard": "results/{model}/scorecard/kernel_widths.csv",
        },
        "thresholds": {"k11_min_width": {"type": "number", "default": 2, "minimum": 0,
                                         "description": "a width of two keys: more than the previous token"}},
        "claims": {"K11": {"quantity": "median_width", "predicate": ">=", "threshold": "k11_min_width"}},
    }
}


def test_a_new_analysis_in_a_family_shows_in_every_table(tmp_path):
    """An analysis joining the kernels family, declared and nothing else: its family's row,
    its own rows, what it needs, its files and its claim are in the docs' tables."""
    folder = _declarations(tmp_path)
    with (folder / "kernels.yaml").open("a", encoding="utf-8") as f:
        f.write(yaml.safe_dump(NEW, sort_keys=False, allow_unicode=True))
    analyses = read_declarations(folder)
    assert "kernel_widths" in analyses
    texts = written(Sources(analyses=analyses))
    workflow, artifacts, claims = texts[WORKFLOW], texts[ARTIFACTS], texts[CLAIMS]
    assert "| `kernels` | `positional_kernels`, `etc_table`, `kernel_heatmaps`, `kernel_widths` | K1–K5, K11 |" \
        in workflow
    assert "| `kernel_widths` | `kernels` | The width of every head's kernel at each query position (K11). | K11 |" \
        in workflow
    # its own requirement and the one of positional_kernels, which it reads
    assert ("| `kernel_widths` | `learned_wpos` | `positional_kernels` | `learned_wpos`, `raw_scores_layout`, "
            "`plain_scores` |") in workflow
    assert ("| `results/{model}/kernels/widths.csv` | `kernel_widths` | `kernels.kernel_widths__table` | "
            "Positional kernels and ETC (K1-K5); `workflow/report/kernel_widths.rst` |") in artifacts
    assert "| `results/{model}/scorecard/kernel_widths.csv` | `kernel_widths` |" in artifacts
    assert ("| K11 | `kernel_widths` (rule `kernels`) | `median_width` ≥ `findings.k11_min_width` (default 2) | "
            "above its twin's by ≥ 0.5 | — | `learned_wpos`, `raw_scores_layout`, `plain_scores` |") in claims
    # the shipped docs do not show it yet: they are stale against these declarations
    assert all(p.read_text(encoding="utf-8") != texts[p] for p in (WORKFLOW, ARTIFACTS, CLAIMS))


def test_a_new_rule_needs_a_block_for_its_files(tmp_path):
    """A rule of its own has no section in docs/artifacts.md until one is written: the
    generator names it."""
    folder = _declarations(tmp_path)
    solo = {"solo": {"does": "Something of its own (K11).", "outputs": {"table": "results/{model}/solo/solo.csv"}}}
    (folder / "solo.yaml").write_text(yaml.safe_dump(solo), encoding="utf-8")
    sources = Sources(analyses=read_declarations(folder))
    with pytest.raises(PosmechError, match=r"no block shows the files of \['solo'\].*outputs\.<rule>"):
        written(sources)
    text = ARTIFACTS.read_text(encoding="utf-8") + "\n<!-- generated: outputs.solo -->\n<!-- end generated -->\n"
    new, blocks, shown = fill(text, sources)
    assert "outputs.solo" in blocks and "solo" in shown
    assert "| `results/{model}/solo/solo.csv` | `solo` | `solo.table` | — |" in new


def test_the_markers_are_checked():
    sources = Sources()
    with pytest.raises(PosmechError, match="no such block"):
        fill("<!-- generated: nope -->\n<!-- end generated -->\n", sources)
    with pytest.raises(PosmechError, match="no analysis or rule 'nope'"):
        fill("<!-- generated: outputs.kernels+nope -->\n<!-- end generated -->\n", sources)
    with pytest.raises(PosmechError, match="has no `<!-- end generated -->` after it"):
        fill("<!-- generated: families -->\n", sources)
    # every block of the docs once: a second `families` table is refused
    doubled = [*DOCS, WORKFLOW]
    with pytest.raises(PosmechError, match="2 blocks `<!-- generated: families -->`"):
        written(sources, docs=doubled)
