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


# ------------------------------------------------------------- the architectures' run
#: the architectures of the CI-sized run on random-init tiny models (tests/tiny_archs.py;
#: issue 44's ten and GPT-BigCode), tests/workflow/test_ten_architectures.py and
#: test_architectures.py read the same run
ARCHS = ("gpt2", "opt", "neox", "llama", "qwen2", "gemma2", "phi", "gptj", "falcon", "bloom", "gpt_bigcode")
#: OPT forced onto the TransformerLens bridge (`engine: bridge`): its hook_attn_scores is not
#: OPT's pre-softmax score, so its raw-score analyses fail at run time, on purpose
BROKEN = "opt_bridge"
#: a one-layer GPT-2: no layer >= 1, what several findings study is absent
ONE = "one"
ARCH_MODELS = (*ARCHS, BROKEN, ONE)
#: models whose analyses run in one job without figures (config `figures: false`): the same
#: tables, verdicts and logs, ~7 jobs fewer each. Figures are drawn on one model per position
#: scheme (NeoX's partial rotary, Llama's grouped-query rotary, BLOOM's ALiBi; learned positions:
#: the CI-sized run's GPT-2 demo, tests/workflow/conftest.py ``ci_run``) and on OPT on the
#: bridge, whose rules must fail as jobs of their own
FIGURELESS = ("gpt2", "opt", "qwen2", "gemma2", "phi", "gptj", "falcon", "gpt_bigcode", ONE)
#: the one model read against a random-init twin (config section `twins`): the others' nulls
#: would double the run, and are checked by the self-check's random-init cases
ARCH_TWINS = {"llama": "llama-twin"}


def arch_config(root: Path, dirs: dict[str, Path], models=ARCH_MODELS, twins=tuple(ARCH_TWINS),
                bloom_context: bool = True) -> Path:
    """config/ci.yaml with ``models`` (local directories ``dirs``), twins only for ``twins``, 12
    documents; written to ``root``/config.yaml. BLOOM's config has no context length: the
    config gives it (`n_ctx`) unless ``bloom_context`` is false."""
    import yaml

    from tests import tiny_archs

    cfg = yaml.safe_load((REPO / "config" / "ci.yaml").read_text())
    cfg["models"] = {m: {"source": str(dirs["opt" if m == BROKEN else m]), "device": "cpu"} for m in models}
    for m in set(FIGURELESS) & set(models):
        cfg["models"][m]["figures"] = False
    if BROKEN in models:
        cfg["models"][BROKEN]["engine"] = "bridge"
    if "neox" in models:  # TransformerLens 4.3's compatibility mode is wrong on GPT-NeoX (preflight)
        cfg["models"]["neox"]["processing"] = "raw"
    if "bloom" in models and bloom_context:  # ALiBi: no context in its config
        cfg["models"]["bloom"]["n_ctx"] = tiny_archs.N_CTX
    cfg["corpora"]["bible"]["n_documents"] = 12
    # the twin reads half the documents (twins.documents_fraction; test_architectures.py checks it)
    cfg["twins"] = {"enabled": True, "models": list(twins), "documents_fraction": 0.5} if twins else {"enabled": False}
    root.mkdir(parents=True, exist_ok=True)
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="session")
def arch_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``{architecture: its random-init tiny model's directory}`` (tests/tiny_archs.py)."""
    from tests import tiny_archs

    root = tmp_path_factory.mktemp("arch-models")
    builders = {**tiny_archs.BUILDERS, ONE: tiny_archs.gpt2_one_layer}
    return {m: builders[m](root / m) for m in (*ARCHS, ONE)}


#: seconds the architectures' run took (printed by test_ten_architectures)
ARCH_TIMING: dict[str, float] = {}


@pytest.fixture(scope="session")
def arch_run(tmp_path_factory: pytest.TempPathFactory, arch_dirs) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """One CI-sized run of every model of :data:`ARCH_MODELS` (and the Llama model's twin):
    its working directory and the finished process. One run instead of one per test file:
    each model's jobs cost mostly their fixed start-up, so two runs sharing four models cost
    ~5 min more of CI."""
    import time

    root = tmp_path_factory.mktemp("arch-run")
    work = root / "work"
    work.mkdir()
    t0 = time.perf_counter()
    proc = snakemake(work, configfile=arch_config(root, arch_dirs))
    ARCH_TIMING["run_s"] = time.perf_counter() - t0
    if proc.returncode != 0:
        pytest.fail(f"CI-sized DAG on {len(ARCH_MODELS)} models failed (rc {proc.returncode}):\n{proc.stderr[-6000:]}")
    return work, proc
