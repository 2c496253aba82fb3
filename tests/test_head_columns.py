"""The per-head column contract (issue 27): ``layer``, ``head`` (int), ``head_name`` ("L1H0")."""

import pandas as pd

from posmech.verdicts.heads import NO_HEAD, head_column_problems
from posmech.store.tables import read_table, write_table


def test_a_conforming_table_and_a_table_without_heads_pass():
    ok = pd.DataFrame({"layer": [0, 1], "head": [2, 0], "head_name": ["L0H2", "L1H0"], "x": [1.0, 2.0]})
    assert head_column_problems(ok) == []
    assert head_column_problems(pd.DataFrame({"claim": ["P1"], "value": [1.0]})) == []
    # an empty table (not measurable on a model) has the columns, read back untyped
    assert head_column_problems(pd.DataFrame(columns=["layer", "head", "head_name"], dtype=object)) == []


def test_a_row_naming_no_head_keeps_empty_integers_through_a_written_table(tmp_path):
    df = pd.DataFrame({"role": ["previous", "induction"], "layer": [1, None], "head": [0, None],
                       "head_name": ["L1H0", NO_HEAD]}).astype({"layer": "Int64", "head": "Int64"})
    write_table(df, tmp_path / "roles.csv")
    assert head_column_problems(read_table(tmp_path / "roles.csv")) == []
    # a "none" row that still carries a layer is wrong
    assert head_column_problems(df.assign(layer=pd.array([1, 1], dtype="Int64"))) == [
        "`layer` is set on a row whose head_name is 'none'"]


def test_the_old_layouts_are_caught():
    old = pd.DataFrame({"head": ["L0H2"], "layer": [0], "head_index": [2]})
    assert "head_index" in head_column_problems(old)[0]
    name_as_head = pd.DataFrame({"head": ["L0H2"], "layer": [0], "head_name": ["L0H2"]})
    assert head_column_problems(name_as_head)[0].startswith("`head` is not an integer")
    assert head_column_problems(pd.DataFrame({"head": [2], "head_name": ["L0H2"]})) == ["names heads but lacks `layer`"]
    wrong = pd.DataFrame({"layer": [1], "head": [2], "head_name": ["L2H1"]})
    assert "head_name disagrees" in head_column_problems(wrong)[0]


def test_heads_csv_p7_rank_is_an_integer_column(tmp_path):
    """heads.csv's p7_rank stays an integer through the written table, with gaps for the heads
    that are not previous-token heads (Int64 in the sidecar's column_types)."""
    from posmech.store.tables import read_meta
    from posmech.verdicts.heads import head_table

    taxonomy = pd.DataFrame({"head_name": ["L0H0", "L0H1"], "is_previous_token": [True, False],
                             "prev_token_mass": [0.9, 0.1], "prev_token_excess": [0.8, 0.0], "ratio": [0.1, 0.9],
                             "rank": pd.array([1, None], dtype="Int64")})
    write_table(head_table("m", taxonomy=taxonomy), tmp_path / "heads.csv")
    assert read_meta(tmp_path / "heads.csv")["column_types"]["p7_rank"] == "Int64"
    assert (tmp_path / "heads.csv").read_text().splitlines()[1].split(",")[8] == "1"
    back = read_table(tmp_path / "heads.csv")
    assert str(back["p7_rank"].dtype) == "Int64" and back["p7_rank"].tolist()[0] == 1 and back["p7_rank"].isna()[1]
