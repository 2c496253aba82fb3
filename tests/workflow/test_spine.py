"""The spine of the DAG on the CI-sized offline config."""

import json

import h5py
import numpy as np
import pandas as pd

from posmech.tokens import read_tokens


def test_ci_dag_trains_model_and_tokenizes(ci_run):
    summary = json.loads((ci_run / "results/demo/training/summary.json").read_text())
    assert summary["heldout_loss"] < 4.0
    curve = pd.read_csv(ci_run / "results/demo/training/curve.csv")
    assert curve["heldout_loss"].iloc[-1] < curve["heldout_loss"].iloc[0]
    toks = read_tokens(ci_run / "results/demo/tokens/bible.h5")
    assert toks.n_documents == 120
    assert toks.lengths().max() == 32  # cut to n_ctx
    assert np.all(toks.flat[toks.offsets[:-1]] == 0)  # BOS first
    with h5py.File(ci_run / "results/demo/tokens/bible.h5") as f:
        assert f.attrs["complete"]
        assert f["documents/book"][0].decode() == "GENESIS" or f["documents/book"].shape[0] == 120
