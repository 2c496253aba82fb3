"""docs/claims.md, the repository's own claims catalogue, stays in step with the
published values and the workflow: every claim is listed, every rule it names exists,
every post is linked; and nothing the project ships points outside the clone."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from posmech.core.families import FAMILIES

from posmech.report.html import claims_catalogue_html

REPO = Path(__file__).resolve().parents[2]
CATALOGUE = REPO / "docs" / "claims.md"


def _cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def _rows() -> dict[str, list[str]]:
    """The claims' rows of the hand-written tables (ID, what is measured, published, figures)."""
    rows, in_table = {}, False
    for line in CATALOGUE.read_text(encoding="utf-8").splitlines():
        in_table = line.startswith("| ID | what is measured") or (in_table and line.startswith("|"))
        cells = _cells(line)
        if in_table and re.fullmatch(r"[PLKCS]\d{1,2}", cells[0]):
            assert cells[0] not in rows, f"claim {cells[0]} has two rows in docs/claims.md"
            rows[cells[0]] = cells
    return rows


def _judged() -> dict[str, list[str]]:
    """The rows of the generated table "How each finding is judged" (posmech.pipeline.reference)."""
    text = CATALOGUE.read_text(encoding="utf-8")
    block = text.split("<!-- generated: claims -->", 1)[1].split("<!-- end generated -->", 1)[0]
    return {c[0]: c for c in map(_cells, block.splitlines()) if re.fullmatch(r"[PLKCS]\d{1,2}", c[0])}


def test_every_published_claim_is_catalogued_once_with_its_rules():
    rows, judged = _rows(), _judged()
    published = yaml.safe_load((REPO / "resources" / "published.yaml").read_text(encoding="utf-8"))["entries"]
    claims = {e["claim"] for e in published}
    assert claims <= set(rows), sorted(claims - set(rows))
    families = {"P": 18, "L": 5, "K": 10, "C": 3, "S": 5}
    assert set(rows) == {f"{f}{i}" for f, n in families.items() for i in range(1, n + 1)}
    assert set(judged) == set(rows)  # every claim's finding is judged by a declared analysis
    rules = set(re.findall(r"^rule (\w+):", "\n".join(
        p.read_text(encoding="utf-8") for p in (REPO / "workflow" / "rules").glob("*.smk")), re.M))
    rules |= {a for analyses in FAMILIES.values() for a in analyses}  # analyses run by a family's rule
    for cid, cells in judged.items():
        named = set(re.findall(r"`(\w+)`", cells[1] + cells[4]))
        assert named <= rules, (cid, named - rules)
    for e in published:  # a published entry's rule is one the catalogue names for the claim
        if e.get("rule"):
            assert f"`{e['rule']}`" in judged[e["claim"]][1] + judged[e["claim"]][4], e


def test_catalogue_links_every_post_and_renders_with_claim_anchors():
    text = CATALOGUE.read_text(encoding="utf-8")
    for url in ("https://www.lesswrong.com/posts/zRA8B2FJLtTYRgie6/", "https://efarrell1.github.io/posts/previous-token-head",
                "https://www.lesswrong.com/posts/9paB7YhxzsrBoXN8L/", "https://www.lesswrong.com/posts/QoFxZNG7bXishtxsv/"):
        assert url in text
    html = claims_catalogue_html(CATALOGUE)
    assert all(f'<tr id="claim-{c}">' in html for c in _rows())
    assert "<h1" not in html and "<h2" not in html  # the report's own headings rank above
    assert "&lt;!--" not in html and "<!--" not in html  # the generated table's markers are not shown


def test_nothing_shipped_points_outside_the_clone():
    offenders = []
    for top in ("README.md", "docs", "workflow", "src", "scripts", "config", "resources", "profiles", "Makefile"):
        base = REPO / top
        files = [base] if base.is_file() else [p for p in base.rglob("*") if p.is_file() and p.suffix != ".jsonl"]
        for p in files:
            try:
                text = p.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            if re.search(r"\.\./shared|shared/(CLAIMS|seeds|DESIGN)|\bCLAIMS\.md|\bseeds/", text):
                offenders.append(str(p.relative_to(REPO)))
    assert offenders == []
