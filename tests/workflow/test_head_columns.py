"""Every per-head table the CI-sized run writes follows the per-head column contract (issue 27):
``layer``, ``head`` (int) and ``head_name`` (``L{layer}H{head}``); no string ``head``."""

from posmech.verdicts.heads import head_column_problems
from posmech.store.tables import read_table


def test_every_per_head_table_of_the_ci_run_has_layer_head_and_head_name(ci_run):
    tables = sorted((ci_run / "results").rglob("*.csv"))
    problems = {str(p.relative_to(ci_run)): head_column_problems(read_table(p)) for p in tables}
    assert {p: why for p, why in problems.items() if why} == {}
    named = [p for p in tables if "head_name" in read_table(p).columns]
    # the run writes per-head tables of every family (P taxonomy and anatomy, K, L, interventions)
    assert {"taxonomy.csv", "taxa.csv", "etc.csv", "head_roles.csv", "prev_knockout.csv"} <= {p.name for p in named}
    # the head-roles table and the taxonomy's chosen heads (both named heads.csv)
    assert {ci_run / "results/demo/heads.csv", ci_run / "results/demo/taxonomy/heads.csv"} <= set(named)
