"""One name per quantity (issue 46, item 3): the per-head attention measures that look alike
are named by :mod:`posmech.core.names` in the report, the tables' docs and the docs, and the
ambiguous names they had (a bare "previous-token score" for three different measures) are gone."""

from __future__ import annotations

import re
from pathlib import Path

from posmech.core import names

REPO = Path(__file__).resolve().parents[1]
#: where a reader meets the names: the docs, the report's code and template, the dynamics' words
PLACES = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
          *sorted((REPO / "src" / "posmech" / "report").rglob("*.py")),
          *sorted((REPO / "src" / "posmech" / "report" / "templates").glob("*.j2")),
          REPO / "src" / "posmech" / "verdicts" / "dynamics.py", REPO / "src" / "posmech" / "verdicts" / "heads.py")
#: a name that no longer names one quantity, and why
STALE = {
    r"(?<!held-out )(?<!head_detector )(?<!``head_detector`` )(?<!`head_detector` )previous-token scores?\b":
        f"say '{names.HELDOUT_PREV_SCORE}' (training summary) or '{names.PREV_TOKEN_MASS}' (heads.csv)",
    r"(?<!held-out )look-back-two scores?\b":
        f"say '{names.HELDOUT_LOOK_BACK_TWO}' (training summary) or '{names.RANDOM_OFFSET2_MASS}' (heads.csv)",
    r"mean attention to the previous position": f"name the measure: '{names.PREV_TOKEN_MASS}' or "
                                                 f"'{names.HELDOUT_PREV_SCORE}'",
}


def stale_names(paths) -> list[str]:
    found = []
    for path in paths:
        for n, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
            for pattern, fix in STALE.items():
                for m in re.finditer(pattern, line):
                    found.append(f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}:{n}: "
                                 f"{m.group(0)!r}: {fix}")
    return found


def test_no_stale_name_of_a_quantity():
    found = stale_names(PLACES)
    assert found == [], "\n".join(found)


def test_the_check_finds_a_stale_name(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("the previous-token score of L1H0\nits held-out previous-token score\n"
                   "TransformerLens's head_detector previous-token score\nthe look-back-two score 0.2\n",
                   encoding="utf-8")
    assert [f.split(": ")[1] for f in stale_names([doc])] == ["'previous-token score'", "'look-back-two score'"]


def test_the_table_docs_define_each_name():
    """docs/artifacts.md, where heads.csv's columns and summary.json's keys are described, names
    each measure beside its column or key."""
    text = re.sub(r"\s+", " ", (REPO / "docs" / "artifacts.md").read_text(encoding="utf-8"))
    for name, (column, _) in names.WORDS.items():
        assert f"**{name}**" in text, name
        assert f"`{column}`" in text, column
