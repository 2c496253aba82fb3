"""Every file the CI-sized run writes opens the plain way: each CSV with a bare
``pandas.read_csv(path)``, each HDF5 dataset with a ``description`` attribute."""

from __future__ import annotations

import h5py
import pandas as pd
import pytest

from posmech.store.hdf5 import undescribed

pytestmark = pytest.mark.workflow


def test_every_csv_opens_with_plain_read_csv(ci_run):
    csvs = sorted((ci_run / "results").rglob("*.csv"))
    assert len(csvs) >= 20  # tables and scorecards of every stage, the report's copies
    for path in csvs:
        with open(path, encoding="utf-8") as f:
            first = f.readline()
        assert not first.startswith("#"), f"{path}: starts with a comment line"
        df = pd.read_csv(path)  # no comment=, no skiprows=
        assert len(df.columns) >= 2 and not any(str(c).startswith("#") for c in df.columns), path
    scorecard = pd.read_csv(ci_run / "results/report/scorecard.csv")
    assert {"claim", "model", "status"} <= set(scorecard.columns) and len(scorecard) > 0
    # table metadata went to sidecars, next to the tables
    assert (ci_run / "results/demo/taxonomy/taxonomy.meta.json").is_file()


def test_every_hdf5_dataset_has_a_description(ci_run):
    files = sorted((ci_run / "results").rglob("*.h5"))
    kinds = set()
    for path in files:
        with h5py.File(path, "r") as f:
            kinds.add(str(f.attrs.get("kind")))
            assert undescribed(f) == [], path
    assert {"tokens", "activations", "kernels", "extended_embeddings", "posembed_attention"} <= kinds


def _strings(obj):
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _strings(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _strings(v)


def test_table_metadata_does_not_depend_on_the_working_directory(ci_run):
    """Two runs of the same inputs from different working directories (a Slurm run with
    ``--directory``, a moved project) write the same metadata: no sidecar records a path
    that climbs out of the working directory or names it absolutely."""
    import json

    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    sidecars = sorted((ci_run / "results").rglob("*.meta.json"))
    assert sidecars
    for path in sidecars:
        for s in _strings(json.loads(path.read_text())):
            assert "../" not in s and str(repo) not in s and str(ci_run) not in s, f"{path}: {s!r}"
