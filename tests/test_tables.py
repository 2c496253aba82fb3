"""Tables are plain CSV (pandas.read_csv reads them as they are); metadata in a sidecar."""

from __future__ import annotations

import hashlib
import json

import pandas as pd
import pytest

from posmech.core.errors import PosmechError
from posmech.store.tables import meta_path, read_meta, read_table, write_table


def test_table_is_plain_csv_and_metadata_is_a_sidecar(tmp_path):
    df = pd.DataFrame({"claim": ["P6", "P6"], "model": "gpt2", "head": ["L4H11", "L5H6"], "ratio": [0.01, 0.18]})
    path = tmp_path / "taxonomy.csv"
    meta = {"n_documents": 500, "pin": {}, "note": "# not a comment", "heads": ["L4H11"]}
    write_table(df, path, meta)
    assert path.read_text().splitlines()[0] == "claim,model,head,ratio"
    pd.testing.assert_frame_equal(pd.read_csv(path), df)
    assert meta_path(path) == tmp_path / "taxonomy.meta.json"
    side = json.loads(meta_path(path).read_text())
    assert side == {**meta, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    back = read_table(path)
    pd.testing.assert_frame_equal(back, df)
    assert back.attrs == meta


def test_rewrite_without_metadata_leaves_only_the_integrity_record(tmp_path):
    path = tmp_path / "t.csv"
    write_table(pd.DataFrame({"a": [1]}), path, {"k": 1})
    write_table(pd.DataFrame({"a": [2]}), path)
    assert set(read_meta(path)) == {"sha256"} and read_table(path).attrs == {}


@pytest.mark.parametrize("edit", [
    lambda p: p.write_text(p.read_text().replace("0.18", "0.81")),  # one value changed
    lambda p: p.write_text("\n".join(p.read_text().splitlines()[:-1]) + "\n"),  # the last row dropped
])
def test_a_table_changed_after_it_was_written_is_refused_naming_how_to_regenerate_it(tmp_path, edit):
    """Issue 45: an edited or damaged table flowed into the verdicts with rc 0."""
    df = pd.DataFrame({"claim": ["P6", "P6"], "head": ["L4H11", "L5H6"], "ratio": [0.01, 0.18]})
    path = tmp_path / "heads.csv"
    write_table(df, path, {"k": 1})
    edit(path)
    with pytest.raises(PosmechError, match=r"heads\.csv' was changed after it was written.*snakemake -f"):
        read_table(path)


def test_a_table_written_before_the_integrity_record_is_read_as_it_is(tmp_path):
    path = tmp_path / "t.csv"
    pd.DataFrame({"a": [1]}).to_csv(path, index=False)
    meta_path(path).write_text(json.dumps({"k": 1}))
    assert read_table(path).attrs == {"k": 1}


def test_broken_sidecar_names_the_file(tmp_path):
    path = tmp_path / "t.csv"
    write_table(pd.DataFrame({"a": [1]}), path, {"k": 1})
    meta_path(path).write_text("{not json")
    with pytest.raises(PosmechError, match=r"t\.meta\.json"):
        read_table(path)


def test_numeric_looking_text_and_integers_with_gaps_keep_their_types(tmp_path):
    """``source`` "000" stays text and ``rank`` with a gap stays integer through read_table;
    the sidecar records why (plain pandas would read 0 and 1.0)."""
    df = pd.DataFrame({"source": ["000", "003", None], "rank": pd.array([1, None, 3], dtype="Int64"),
                       "ratio": [0.5, 1.0, 2.0]})
    path = tmp_path / "t.csv"
    write_table(df, path, {"k": 1})
    assert read_meta(path)["column_types"] == {"source": "str", "rank": "Int64"}
    plain = pd.read_csv(path)
    assert plain["source"].tolist()[:2] == [0, 3] and plain["rank"].dtype == float  # what read_table repairs
    back = read_table(path)
    assert back["source"].tolist()[:2] == ["000", "003"] and pd.isna(back["source"].iloc[2])
    assert str(back["rank"].dtype) == "Int64" and back["rank"].tolist()[0] == 1 and back["rank"].isna().sum() == 1
    assert back["ratio"].dtype == float and back.attrs == {"k": 1}


def test_write_not_measurable_writes_empty_tables_a_figure_and_valueless_rows(tmp_path):
    from posmech.plots import write_not_measurable
    from posmech.store.tables import read_table

    why = "no broad layer-0 head"
    t, fig, sc = tmp_path / "t.csv", tmp_path / "f.png", tmp_path / "scorecard" / "r.csv"
    sc.parent.mkdir()
    write_not_measurable("C3", "m", why, ("median_pearson_r", "median_fvu"), {str(t): ["neuron", "pearson_r"]},
                         str(fig), str(sc))
    table = read_table(t)
    assert list(table.columns) == ["neuron", "pearson_r"] and len(table) == 0
    assert table.attrs["not_measurable"] == why
    assert fig.stat().st_size > 0
    rows = read_table(sc)
    assert list(rows["quantity"]) == ["median_pearson_r", "median_fvu"]
    assert rows["value"].isna().all() and set(rows["detail"]) == {why}


def test_claim_columns_go_in_front_in_place():
    from posmech.store.tables import claim_columns

    df = pd.DataFrame({"head": [0, 1], "value": [0.5, 0.25]})
    assert claim_columns(df, "X1", "m") is df
    assert list(df.columns) == ["claim", "model", "head", "value"]
    assert df["claim"].tolist() == ["X1", "X1"] and df["model"].tolist() == ["m", "m"]
    per_row = pd.DataFrame({"quantity": ["loss", "probability"]})
    claim_columns(per_row, pd.Series(["A", "A,B"]), "m")
    assert per_row["claim"].tolist() == ["A", "A,B"]
