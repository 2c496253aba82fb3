"""Issue 45, items 1-2: the weights of derived models (a training's checkpoints, the
checkpoint models copied from them, random-init twins) are checked against a hash recorded
when they were written: by rule checkpoint_model before it installs a checkpoint, and by the
check before any job (posmech.pipeline.preflight.weights_problems) for every model of the run
on disk; a damaged one is refused naming the model, the file and the rule that writes it."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from posmech.core.errors import PosmechError
from posmech.models import loading
from posmech.models.training import (CHECKPOINT_RECORD, CHECKPOINTS_SUBDIR, install_checkpoint,
                                     saved_checkpoint_manifest, train_demo_model)
from posmech.models.twin import build_twin
from posmech.pipeline.preflight import run_models, weights_problems

from tests.conftest import flip_bytes

CFG = {"corpus": "c", "architecture": "gpt2", "n_layer": 1, "n_head": 2, "d_model": 16, "n_ctx": 16,
       "steps": 4, "batch_size": 4, "warmup_steps": 1, "heldout_every": 5, "eval_every": 4,
       "eval_batches": 1, "induction_samples": 4, "threads": 1, "checkpoints": [0, 2]}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A project whose model `m` was trained with checkpoints at steps 0 and 2."""
    rng = np.random.default_rng(3)
    docs = [{"text": "".join(rng.choice(list("abcdefgh "), 80))} for _ in range(10)]
    root = tmp_path_factory.mktemp("derived")
    train_demo_model(docs, CFG, root / "resources/models/m", "m")
    return root


@pytest.fixture
def project(trained, tmp_path) -> Path:
    """A fresh copy of the trained project (new inodes: hashed again once, as a copied project is)."""
    shutil.copytree(trained, tmp_path / "p")
    loading._VERIFIED_HERE.clear()
    return tmp_path / "p"


def _entry(step: int) -> dict:
    return {"checkpoint_of": "m", "step": step, "train": CFG}


def _config() -> dict:
    # a trained model gets its twin when the config asks (twins.trained, as config/demo.yaml does)
    return {"models": {"m": {"train": CFG, "device": "cpu"}}, "twins": {"enabled": True, "trained": True, "seed": 0}}


def test_the_training_records_each_checkpoints_hash_when_it_saves_it(project):
    ckpts = project / "resources/models/m" / CHECKPOINTS_SUBDIR
    for step in (0, 2):
        rec = json.loads((ckpts / f"step{step}" / CHECKPOINT_RECORD).read_text())
        weights = ckpts / f"step{step}" / "hf" / "model.safetensors"
        assert rec["step"] == step
        assert rec["weights_sha256"] == {"model.safetensors": hashlib.sha256(weights.read_bytes()).hexdigest()}
        assert rec["weights_sha256_16"] == loading.weights_digest(weights.parent)
        # and the verified-hash cache beside it: the first check is a stat, as for a manifest
        assert (ckpts / f"step{step}" / loading.VERIFIED).is_file()


def test_an_intact_checkpoint_is_installed_with_the_recorded_hashes(project):
    ckpts = project / "resources/models/m" / CHECKPOINTS_SUBDIR
    man = install_checkpoint("m@step2", _entry(2), ckpts, project / "resources/models/m@step2")
    rec = json.loads((ckpts / "step2" / CHECKPOINT_RECORD).read_text())
    assert man["weights_sha256"] == rec["weights_sha256"] and man["kind"] == "checkpoint"
    loading.read_manifest(project / "resources/models/m@step2")  # verifies


def test_a_damaged_checkpoint_is_refused_by_checkpoint_model_and_nothing_is_installed(project):
    """Item 1: 64 bytes flipped in the checkpoint the training saved: rule checkpoint_model
    refuses it, naming the file, both hashes, the training's record and the fix (train the
    model again: seeded and deterministic), and installs nothing; today's main sealed the
    damaged bytes in a new manifest."""
    ckpts = project / "resources/models/m" / CHECKPOINTS_SUBDIR
    weights = ckpts / "step2" / "hf" / "model.safetensors"
    recorded = json.loads((ckpts / "step2" / CHECKPOINT_RECORD).read_text())["weights_sha256"]["model.safetensors"]
    flip_bytes(weights)
    actual = hashlib.sha256(weights.read_bytes()).hexdigest()
    out = project / "resources/models/m@step2"
    with pytest.raises(PosmechError) as info:
        install_checkpoint("m@step2", _entry(2), ckpts, out)
    msg = str(info.value)
    assert "'m@step2'" in msg and str(weights) in msg and recorded in msg and actual in msg, msg
    assert CHECKPOINT_RECORD in msg and "rule train_demo_model trains 'm' again" in msg and "seeded" in msg, msg
    assert f"delete {os.path.relpath(ckpts)}/ and rerun" in msg, msg
    assert not (out / "manifest.json").exists() and not (out / "hf").exists()
    # the other checkpoint is intact and installs
    install_checkpoint("m@step0", _entry(0), ckpts, project / "resources/models/m@step0")


def test_a_checkpoint_without_a_record_is_refused_by_checkpoint_model(project):
    ckpts = project / "resources/models/m" / CHECKPOINTS_SUBDIR
    (ckpts / "step2" / CHECKPOINT_RECORD).unlink()
    with pytest.raises(PosmechError, match="no readable record of its hashes.*missing.*train_demo_model"):
        install_checkpoint("m@step2", _entry(2), ckpts, project / "resources/models/m@step2")
    assert saved_checkpoint_manifest("m", 2, ckpts, require_record=False) is None
    (ckpts / "step2" / CHECKPOINT_RECORD).write_text("{")
    with pytest.raises(PosmechError, match="no readable record"):
        saved_checkpoint_manifest("m", 2, ckpts, require_record=False)


def test_the_run_models_are_the_configured_ones_their_twins_and_checkpoints():
    assert list(run_models(_config())) == ["m", "m-twin", "m@step0", "m@step2"]


def _derived(project: Path) -> None:
    """Install both checkpoints and build the twin, as rules checkpoint_model and build_twin do."""
    models = project / "resources/models"
    for step in (0, 2):
        install_checkpoint(f"m@step{step}", _entry(step), models / "m" / CHECKPOINTS_SUBDIR, models / f"m@step{step}")
    build_twin("m-twin", {"twin_of": "m", "seed": 0}, models / "m" / "manifest.json", models / "m-twin")


def test_before_any_job_intact_derived_models_pass_and_are_not_hashed_again(project, monkeypatch):
    _derived(project)
    loading._VERIFIED_HERE.clear()
    calls = []
    real = loading.file_sha256
    monkeypatch.setattr(loading, "file_sha256", lambda p: calls.append(p) or real(p))
    assert weights_problems(_config(), project) == []
    assert calls == []  # every file's hash was recorded when it was written: a stat each


def test_before_any_job_a_damaged_twin_names_build_twin(project):
    _derived(project)
    weights = project / "resources/models/m-twin/hf/model.safetensors"
    flip_bytes(weights)
    [msg] = weights_problems(_config(), project)
    assert "model 'm-twin'" in msg and str(weights) in msg and "its manifest records" in msg, msg
    assert "rule build_twin builds the twin again" in msg and "fetch_model" not in msg, msg


def test_before_any_job_a_damaged_checkpoint_model_names_checkpoint_model(project):
    _derived(project)
    weights = project / "resources/models/m@step2/hf/model.safetensors"
    flip_bytes(weights)
    [msg] = weights_problems(_config(), project)
    assert "model 'm@step2'" in msg and str(weights) in msg, msg
    assert "rule checkpoint_model copies the checkpoint again" in msg and "fetch_model" not in msg, msg


@pytest.mark.parametrize("installed", [True, False], ids=["installed", "not-installed"])
def test_before_any_job_a_damaged_saved_checkpoint_names_train_demo_model(project, installed):
    """The training's own copy damaged: refused before any job whether or not its checkpoint
    model is installed (rule checkpoint_model would copy it once its directory is deleted, or
    with --forcerun)."""
    if installed:
        _derived(project)
    weights = project / "resources/models/m" / CHECKPOINTS_SUBDIR / "step2/hf/model.safetensors"
    flip_bytes(weights)
    [msg] = weights_problems(_config(), project)
    assert "model 'm@step2'" in msg and str(weights) in msg and CHECKPOINT_RECORD in msg, msg
    assert "rule train_demo_model trains 'm' again" in msg and "fetch_model" not in msg, msg


def test_before_any_job_a_saved_checkpoint_without_record_is_refused_only_when_it_must_be_copied(project):
    _derived(project)
    (project / "resources/models/m" / CHECKPOINTS_SUBDIR / "step2" / CHECKPOINT_RECORD).unlink()
    assert weights_problems(_config(), project) == []  # installed: no job copies it
    shutil.rmtree(project / "resources/models/m@step2")
    [msg] = weights_problems(_config(), project)
    assert "no readable record" in msg and "train_demo_model" in msg, msg
