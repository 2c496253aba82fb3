"""The activation cache in the CI-sized DAG: the trained demo model's cached activations
equal Hugging Face's hidden states, its position-wise means equal an independent
computation, and ``python -m posmech inspect`` reads every file the DAG writes."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from posmech.analyses.cache import read_document, read_position_means
from posmech.data.tokens import read_tokens
from posmech.store.hdf5 import open_artifact
from posmech.models.loading import read_manifest
from tests.analyses.test_cache import hf_reference


def test_ci_cache_equals_huggingface_hidden_states(ci_run):
    path = ci_run / "results/demo/activations/bible.h5"
    with open_artifact(path, "activations") as f:
        assert f.attrs["model"] == "demo" and f.attrs["corpus"] == "bible"
        assert f.attrs["processing"] == "compatibility" and f.attrs["storage_dtype"] == "float16"
        assert f.attrs["rule"] == "cache_activations" and f.attrs["n_layers"] == 2
    tokens = read_tokens(ci_run / "results/demo/tokens/bible.h5")
    docs = [tokens.doc(j) for j in range(tokens.n_documents)]
    ref = hf_reference(read_manifest(ci_run / "resources/models/demo/manifest.json")["hf_dir"], docs)
    # compatibility mode centres the writing weights: the residual stream is HF's, centred
    hidden = [r["hidden"] - r["hidden"].mean(-1, keepdims=True) for r in ref]
    for j in (0, 1, len(docs) - 1):
        for layer in range(3):
            got = read_document(path, "resid_pre", layer, j).astype(np.float64)
            np.testing.assert_allclose(got, hidden[j][layer], rtol=2e-3, atol=2e-3 * np.abs(hidden[j]).max())
        ln = hidden[j][:2] / np.sqrt((hidden[j][:2] ** 2).mean(-1, keepdims=True) + 1e-5)
        for layer in range(2):
            got = read_document(path, "ln1_out", layer, j).astype(np.float64)
            np.testing.assert_allclose(got, ln[layer], rtol=2e-3, atol=1e-2)
    mean, count = read_position_means(path, "resid_pre")
    lengths = tokens.lengths()
    assert mean.shape == (3, lengths.max(), 32) and count[0] == len(docs)
    np.testing.assert_array_equal(count, [(lengths > p).sum() for p in range(lengths.max())])
    for p in (0, 5, lengths.max() - 1):
        expected = np.mean([h[:, p] for h, n in zip(hidden, lengths, strict=True) if n > p], axis=0)
        np.testing.assert_allclose(mean[:, p], expected, atol=1e-4)


def test_ci_files_are_inspectable(ci_run):
    for rel in ("results/demo/activations/bible.h5", "results/demo/tokens/bible.h5"):
        proc = subprocess.run([sys.executable, "-m", "posmech", "inspect", str(ci_run / rel), "--json"],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        info = json.loads(proc.stdout)
        assert info["status"] == "complete" and info["datasets"]
    assert (ci_run / "logs/cache_activations/demo/bible.log").read_text().count("cached 120 documents") == 1
    assert (ci_run / "benchmarks/cache_activations/demo/bible.tsv").exists()
