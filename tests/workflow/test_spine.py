"""The spine of the DAG on the CI-sized offline config."""

import json

import h5py
import numpy as np
import pandas as pd

from posmech.data.tokens import read_tokens


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
        books = [b.decode() for b in f["documents/book"][()]]
        chapters = f["documents/chapter"][()]
        titles = [t.decode() for t in f["documents/title"][()]]
    assert len(books) == 120 and chapters.min() >= 1
    # the seeded draw keeps corpus order: canonical book order, then chapter order
    assert titles[0].split()[-1] == str(chapters[0]) and books[0].isupper()
