"""End-to-end Snakemake runs of the CI-sized offline DAG (config/ci.yaml).

``ci_run`` runs the whole default target once per test session in a temporary working
directory (``--directory``), so tests never touch the repository's results/ and
concurrent runs do not share a Snakemake lock.  Tests then assert on its outputs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))


def snakemake(workdir: Path, *args: str, configfile: str | Path = REPO / "config" / "ci.yaml",
              timeout: int | None = None) -> subprocess.CompletedProcess[str]:
    """Run the repository's workflow in ``workdir`` with ``configfile``; capture output.

    ``timeout`` (seconds) defaults to ``POSMECH_WORKFLOW_TIMEOUT`` or 3600: the CI-sized DAG
    takes minutes on an idle 2-core machine but several times longer on a loaded one."""
    if timeout is None:
        timeout = int(os.environ.get("POSMECH_WORKFLOW_TIMEOUT", "3600"))
    cmd = [
        SNAKEMAKE, "--snakefile", str(REPO / "workflow" / "Snakefile"), "--directory", str(workdir),
        "--configfile", str(configfile), "--cores", "2", *args,
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=workdir)


@pytest.fixture(scope="session")
def ci_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Working directory of one complete CI-sized run of the default target."""
    workdir = tmp_path_factory.mktemp("ci_run")
    proc = snakemake(workdir)
    if proc.returncode != 0:
        pytest.fail(f"CI-sized DAG failed (rc {proc.returncode}):\n{proc.stderr[-6000:]}")
    return workdir


def analyses_run(workdir: Path, model: str) -> dict[str, dict]:
    """``{analysis: its record}`` of every analysis that ran on ``model``: a family job's
    ``PERF`` record lists its analyses (``logs/<family>/<model>.log.perf.json``, posmech.pipeline.runner
    .run_family); a rule of its own is one analysis, its own name, with the job's record."""
    import json

    out: dict[str, dict] = {}
    for perf in (workdir / "logs").glob(f"*/{model}.log.perf.json"):
        rec = json.loads(perf.read_text())
        for a in rec.get("analyses") or [{"analysis": perf.parent.name}]:
            out[a["analysis"]] = {**rec, **a}
    return out
