"""Issue 32 on the CI-sized DAG: inputs are trusted only once checked. Damaged weights,
mistakes the config's prompt files reveal, a file-size limit, a live run and badly-formed
corpora each stop with a message naming the cause, and no earlier output is deleted."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
import yaml

from .conftest import REPO, snakemake

pytestmark = pytest.mark.workflow


def _ci() -> dict:
    return yaml.safe_load((REPO / "config/ci.yaml").read_text())


def _state(work: Path) -> dict[str, tuple[int, str]]:
    """Every file under results/ and resources/models/: (mtime_ns, sha256)."""
    out = {}
    for sub in ("results", "resources/models"):
        for p in sorted((work / sub).rglob("*")):
            if p.is_file() and p.name != "weights.verified.json":
                out[str(p.relative_to(work))] = (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
    return out


def _copy(ci_run: Path, tmp_path_factory, name: str) -> Path:
    work = tmp_path_factory.mktemp(name) / "project"
    shutil.copytree(ci_run, work, symlinks=True)
    return work


def _flip(path: Path, n: int = 64) -> None:
    size = path.stat().st_size
    with open(path, "r+b") as fh:
        fh.seek(size // 2)
        block = fh.read(n)
        fh.seek(size // 2)
        fh.write(bytes(b ^ 0xFF for b in block))


def test_flipped_weight_bytes_stop_before_any_job(ci_run, tmp_path_factory):
    """64 bytes flipped in the trained model's weights: the dry run, a plain run and a
    --forcerun of the cache all stop before any job, naming the file, both hashes and the
    fix; the activation cache, its kept copy and every other output are untouched."""
    work = _copy(ci_run, tmp_path_factory, "weights")
    weights = work / "resources/models/demo/hf/model.safetensors"
    _flip(weights)
    actual = hashlib.sha256(weights.read_bytes()).hexdigest()
    before = _state(work)
    for args in (("-n",), (), ("--forcerun", "cache_activations", "results/demo/activations/bible.h5")):
        proc = snakemake(work, *args, timeout=300)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0, out[-3000:]
        assert "before any job" in out and "hf/model.safetensors" in out and actual in out, out[-3000:]
        assert "delete resources/models/demo/ and rerun" in out
        assert _state(work) == before
