import h5py
import numpy as np
import pytest

from posmech.core.errors import PosmechError
from posmech.store.hdf5 import SCHEMA_VERSION, artifact_writer, attr_json, open_artifact


def _write(path, **attrs):
    with artifact_writer(path, "demo_kind", "some_rule", {"corpus_config": {"a": 1}, **attrs}) as f:
        f.create_dataset("x", data=np.arange(3))


def test_complete_artifact_opens_with_provenance(tmp_path):
    p = tmp_path / "a.h5"
    _write(p)
    with open_artifact(p, "demo_kind") as f:
        assert f.attrs["schema_version"] == SCHEMA_VERSION
        assert attr_json(f, "corpus_config") == {"a": 1}
        for key in ("created", "git_commit", "version_torch", "version_h5py", "version_transformer_lens"):
            assert key in f.attrs


def test_missing_completion_marker_is_refused_naming_rule(tmp_path):
    p = tmp_path / "a.h5"
    with h5py.File(p, "w") as f:
        f.attrs.update({"schema_version": SCHEMA_VERSION, "kind": "demo_kind", "rule": "some_rule"})
    with pytest.raises(PosmechError, match="some_rule"):
        open_artifact(p)


def test_truncated_file_is_refused(tmp_path):
    p = tmp_path / "a.h5"
    _write(p)
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 3])
    with pytest.raises(PosmechError, match="corrupt or truncated"):
        open_artifact(p)


def test_other_schema_version_and_kind_refused(tmp_path):
    p = tmp_path / "a.h5"
    _write(p, schema_version=SCHEMA_VERSION + 1)
    with pytest.raises(PosmechError, match="schema_version"):
        open_artifact(p)
    q = tmp_path / "b.h5"
    _write(q)
    with pytest.raises(PosmechError, match="kind"):
        open_artifact(q, "tokens")


def test_writer_error_leaves_no_file(tmp_path):
    p = tmp_path / "a.h5"
    with pytest.raises(RuntimeError):
        with artifact_writer(p, "k", "r") as f:
            f.create_dataset("x", data=[1])
            raise RuntimeError("boom")
    assert not p.exists() and not list(tmp_path.iterdir())


def test_describe_sets_descriptions_and_undescribed_lists_the_rest(tmp_path):
    from posmech.store.hdf5 import describe, undescribed

    path = tmp_path / "a.h5"
    with artifact_writer(path, "demo_kind", "some_rule") as f:
        f.create_dataset("x", data=np.arange(3))
        f.create_dataset("g/y", data=np.zeros(2))
        f.create_dataset("g/z", data=np.zeros(2))
        describe(f, {"x": "[3] int counts", "g/y": "[2] float zeros"})
        assert undescribed(f) == ["g/z"]
        with pytest.raises(PosmechError, match="no dataset 'g/w'"):
            describe(f, {"g/w": "stale text"})
        describe(f, {"g/z": "[2] float zeros too"})
    with h5py.File(path, "r") as f:
        assert undescribed(f) == [] and f["g/y"].attrs["description"] == "[2] float zeros"


def test_wrong_kind_names_the_rule_that_writes_the_expected_kind(tmp_path):
    """An activation cache where the tokens file should be: the message names `tokenize`
    (which writes tokens files), not `cache_activations` (which wrote this one)."""
    p = tmp_path / "bible.h5"
    with artifact_writer(p, "activations", "cache_activations") as f:
        f["x"] = np.arange(3)
    with pytest.raises(PosmechError) as info:
        open_artifact(p, "tokens")
    msg = str(info.value)
    assert "Rerun rule `tokenize`" in msg and "snakemake --forcerun tokenize" in msg
    assert "kind 'activations' (written by rule `cache_activations`)" in msg


def test_every_writer_agrees_with_the_kind_table(tmp_path):
    from posmech.analyses import cache, contextual, geometry, kernels, neurons
    from posmech.analyses.taxonomy import statistics
    from posmech.data import tokens
    from posmech.store.hdf5 import KIND_RULES

    assert KIND_RULES[tokens.KIND] == "tokenize" and KIND_RULES[cache.KIND] == cache.RULE
    for m in (kernels, geometry, neurons, contextual):
        assert KIND_RULES[m.KIND] == m.RULE, m.__name__
    assert KIND_RULES[statistics.KIND] == "attention_statistics"
    with pytest.raises(PosmechError, match="internal"):
        with artifact_writer(tmp_path / "t.h5", "tokens", "cache_activations"):
            pass
    assert not list(tmp_path.iterdir())


def test_an_analysis_of_a_family_is_rerun_through_its_familys_rule(tmp_path):
    """A damaged kernels.h5 names the analysis that wrote it and the rule that runs it
    (its family's, docs/workflow.md "Families"): `--forcerun positional_kernels` would be
    refused by Snakemake, which has no such rule."""
    path = tmp_path / "kernels.h5"
    with artifact_writer(path, "kernels", "positional_kernels") as f:
        f["x"] = np.arange(3)
    with h5py.File(path, "a") as f:
        f.attrs["complete"] = False
    with pytest.raises(PosmechError) as err:
        open_artifact(path, "kernels")
    msg = str(err.value)
    assert "Rerun rule `kernels` (analysis `positional_kernels`)" in msg and "snakemake --forcerun kernels" in msg
