"""Scorecard rows are made in one place (issue 27, Deliver 6): each family's library module
(``src/posmech/analyses/``) returns its rows, findings and published comparisons alike; the
rule scripts (``scripts/*.py``) only write them.

A static check on the scripts' syntax trees: a script that builds a scorecard row itself has
a dict literal with a ``"quantity"`` key, passes a list it builds to ``scorecard_rows``, or
names the quantities of a not-measurable claim as a literal tuple or list. (A row passed on
by name, ``scorecard_rows(card)``, is the library's.)"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((REPO / "scripts").glob("*.py"))
# scripts still building rows, each with why and where they go; the test fails once one stops
PENDING: dict[str, str] = {}
LITERALS = (ast.List, ast.ListComp, ast.Tuple, ast.Dict)


def _called(node: ast.Call) -> str:
    f = node.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def row_building(source: str) -> list[str]:
    """``line: what`` for every place ``source`` builds scorecard rows itself."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Dict) and any(isinstance(k, ast.Constant) and k.value == "quantity"
                                              for k in node.keys):
            found.append(f"{node.lineno}: a dict with a 'quantity' key")
        elif isinstance(node, ast.Call) and _called(node) == "scorecard_rows" and node.args \
                and isinstance(node.args[0], LITERALS):
            found.append(f"{node.lineno}: scorecard_rows of rows the script builds")
        elif isinstance(node, ast.Call) and _called(node) in ("write_not_measurable", "not_measurable_rows") \
                and len(node.args) > 3 and isinstance(node.args[3], LITERALS):
            found.append(f"{node.lineno}: literal quantity names")
    return found


def test_the_check_sees_row_building():
    script = ('rows = [{"claim": "X1", "quantity": "q", "value": 1}]\n'
              'write_table(scorecard_rows([{**r, "model": m} for r in rows]), out)\n'
              'write_not_measurable("X1", m, why, ("q",), {}, None, out)\n')
    assert sorted(f.split(":")[0] for f in row_building(script)) == ["1", "2", "3"]
    assert row_building('write_table(scorecard_rows(lib.rows(df, m)), out)\n'
                        'write_not_measurable("X1", m, why, lib.QUANTITIES, {}, None, out)\n') == []


def test_no_script_builds_scorecard_rows():
    building = {p.name: row_building(p.read_text(encoding="utf-8")) for p in SCRIPTS}
    offenders = {name: where for name, where in building.items() if where and name not in PENDING}
    assert not offenders, ("scripts build scorecard rows themselves; move them to a function of the family's "
                           f"library module (posmech.analyses) returning the rows: {offenders}")
    stale = [name for name in PENDING if not building.get(name)]
    assert not stale, f"{stale} no longer build rows: drop them from PENDING"
