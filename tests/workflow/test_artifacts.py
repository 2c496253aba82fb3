"""Every file the CI-sized run writes opens the plain way: each CSV with a bare
``pandas.read_csv(path)``, each HDF5 dataset with a ``description`` attribute."""

from __future__ import annotations

import h5py
import pandas as pd
import pytest

from posmech.hdf5 import undescribed

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
