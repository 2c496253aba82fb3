"""Shared fixtures: hand-built GPT-2-architecture models with known behaviour."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

# Tests write only under temporary directories: every cache a library could fill (Hugging
# Face hub/datasets, torch, matplotlib, XDG) points into one per-session temporary folder,
# set before any of those libraries is imported (they read these variables at import).
_CACHE = tempfile.mkdtemp(prefix="posmech-test-cache-")
atexit.register(shutil.rmtree, _CACHE, True)
for _var, _sub in (("HF_HOME", "hf"), ("HF_DATASETS_CACHE", "hf/datasets"), ("TORCH_HOME", "torch"),
                   ("MPLCONFIGDIR", "matplotlib"), ("XDG_CACHE_HOME", "xdg")):
    os.environ[_var] = os.path.join(_CACHE, _sub)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from posmech.models import handbuilt as hb  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def flip_bytes(path: Path, n: int = 64) -> None:
    """Flip ``n`` bytes in the middle of a file in place (as a disk or copy error would):
    its size, and a header at its start, unchanged."""
    size = path.stat().st_size
    with open(path, "r+b") as fh:
        fh.seek(size // 2)
        block = fh.read(n)
        fh.seek(size // 2)
        fh.write(bytes(b ^ 0xFF for b in block))


def require_system(tool: str) -> None:
    """Skip when a system tool is absent, except in CI where it must be there."""
    if shutil.which(tool) is None:
        if os.environ.get("POSMECH_REQUIRE_SYSTEM_TESTS"):
            pytest.fail(f"{tool} is required in CI (installed by .ci/run) but not found")
        pytest.skip(f"{tool} not installed")


@pytest.fixture(scope="session")
def prev_token_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer positional model: L0H1 exact previous-token head, L1H0 exponential
    kernel ``-0.5·(n−i)``, all other heads uniform (zero scores)."""
    n = 12
    scores = {
        (0, 1): hb.previous_token_scores(n),
        (1, 0): -0.5 * np.subtract.outer(np.arange(n), np.arange(n)).astype(float),
    }
    spec = hb.positional_spec(n_ctx=n, n_layer=2, n_head=2, scores=scores)
    return hb.save_model_dir(spec, tmp_path_factory.mktemp("models") / "prevtok")
