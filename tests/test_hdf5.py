import h5py
import numpy as np
import pytest

from posmech.errors import PosmechError
from posmech.hdf5 import SCHEMA_VERSION, artifact_writer, attr_json, open_artifact


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
    from posmech.hdf5 import describe, undescribed

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
