"""Shared fixtures: hand-built GPT-2-architecture models with known behaviour."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from posmech.models import handbuilt as hb

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


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
