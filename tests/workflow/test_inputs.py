"""Issue 32 on the CI-sized DAG: inputs are trusted only once checked. Damaged weights,
mistakes the config's prompt files reveal, a file-size limit, a live run and badly-formed
corpora each stop with a message naming the cause, and no earlier output is deleted."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
import yaml

from tests.conftest import flip_bytes

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


def test_flipped_weight_bytes_stop_before_any_job(ci_run, tmp_path_factory):
    """64 bytes flipped in the trained model's weights: the dry run, a plain run and a
    --forcerun of the cache all stop before any job, naming the file, both hashes and the
    fix; the activation cache, its kept copy and every other output are untouched."""
    work = _copy(ci_run, tmp_path_factory, "weights")
    weights = work / "resources/models/demo/hf/model.safetensors"
    flip_bytes(weights)
    actual = hashlib.sha256(weights.read_bytes()).hexdigest()
    before = _state(work)
    for args in (("-n",), (), ("--forcerun", "cache_activations", "results/demo/activations/bible.h5")):
        proc = snakemake(work, *args, timeout=300)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0, out[-3000:]
        assert "before any job" in out and "hf/model.safetensors" in out and actual in out, out[-3000:]
        assert "delete resources/models/demo/ and rerun" in out
        assert _state(work) == before


def test_damaged_checkpoints_stop_before_any_job(ci_run, tmp_path_factory):
    """Issue 45, items 1-2: 64 bytes flipped in the checkpoint model demo@step20 (the copy its
    sweep point reads): a --forcerun of the sweep and a plain run stop before any job, naming
    the model, the file and rule checkpoint_model (today's main deleted the sweep point's 5
    outputs, then failed in the job). Restored, and the training's own copy damaged instead
    (checkpoints/step20/hf): a --forcerun of checkpoint_model, and a run after deleting
    demo@step20 as the first message said, stop before any job naming the training's record
    and train_demo_model (today's main sealed the damaged bytes in a new manifest, rc 0, and
    dynamics.csv changed). No output's bytes change."""
    work = _copy(ci_run, tmp_path_factory, "checkpoint")
    installed = work / "resources/models/demo@step20/hf/model.safetensors"
    intact = installed.read_bytes()
    flip_bytes(installed)
    actual = hashlib.sha256(installed.read_bytes()).hexdigest()
    before = _state(work)
    for args in (("--forcerun", "sweep_demo"), ()):
        proc = snakemake(work, *args, timeout=300)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0, out[-3000:]
        assert "before any job" in out and "model 'demo@step20'" in out and actual in out, out[-3000:]
        assert "demo@step20/hf/model.safetensors" in out and "rule checkpoint_model" in out, out[-3000:]
        assert "delete resources/models/demo@step20/ and rerun" in out and "fetch_model" not in out, out[-3000:]
        assert _state(work) == before
    installed.write_bytes(intact)

    saved = work / "resources/models/demo/checkpoints/step20/hf/model.safetensors"
    flip_bytes(saved)
    actual = hashlib.sha256(saved.read_bytes()).hexdigest()
    for args, remove in ((("--forcerun", "checkpoint_model"), False), ((), True)):
        if remove:
            shutil.rmtree(work / "resources/models/demo@step20")
        before = _state(work)
        proc = snakemake(work, *args, timeout=300)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0, out[-3000:]
        assert "before any job" in out and "model 'demo@step20'" in out and actual in out, out[-3000:]
        assert "checkpoints/step20/hf/model.safetensors" in out and "checkpoints/step20/weights.sha256.json" in out
        assert "delete resources/models/demo/checkpoints/ and rerun: rule train_demo_model" in out, out[-3000:]
        assert _state(work) == before


def _write(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def _induction_without_words(tmp_path: Path) -> str:
    spec = yaml.safe_load((REPO / "resources/prompts/induction_short.yaml").read_text())
    a = spec["words"]["a"]
    spec["prompt"] = spec["prompt"].replace(a, a.swapcase())
    return _write(tmp_path, "no_words.yaml", yaml.safe_dump(spec))


@pytest.mark.parametrize(
    "mutate, expect",
    [
        (lambda c, t: c["posembed_averaging"].update(prompt_ids=["apple_orange", "pear_plum"]),
         ["posembed_averaging.prompts` / `prompt_ids`", "'pear_plum'"]),
        (lambda c, t: c["interventions"]["induction_intervention"].update(prompt=_induction_without_words(t)),
         ["interventions.induction_intervention.prompt", "does not contain `words`"]),
        (lambda c, t: c["posembed_averaging"].update(prompts=_write(t, "shape.yaml", "- apple\n- orange\n")),
         ["posembed_averaging.prompts", "shape.yaml' is a list, not a mapping"]),
        (lambda c, t: c["interventions"]["induction_intervention"].update(prompt=_write(t, "empty.yaml", "")),
         ["interventions.induction_intervention.prompt", "empty.yaml", "the file is empty"]),
        (lambda c, t: c.setdefault("taxonomy", {}).update(context=64),
         ["config key `taxonomy.context`: 64 tokens is beyond the context of model 'demo', 32"]),
    ],
    ids=["prompt-id-absent", "induction-words-absent", "prompt-file-shape", "empty-prompt-file", "taxonomy-context"],
)
def test_config_file_content_refused_before_any_job(ci_run, tmp_path, mutate, expect):
    """With every output present, a mistake in the content of a file the config names is
    reported before any job; nothing is run or deleted (today's main ran the rule, which
    failed after Snakemake had deleted its earlier outputs)."""
    cfg = _ci()
    mutate(cfg, tmp_path)
    before = _state(ci_run)
    proc = snakemake(ci_run, configfile=_write(tmp_path, "config.yaml", yaml.safe_dump(cfg)), timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "before any job" in out, out[-3000:]
    for e in expect:
        assert e in out, (e, out[-3000:])
    assert "Traceback" not in out and "NoneType" not in out
    assert _state(ci_run) == before


def test_file_size_limit_ends_cleanly_and_the_rerun_equals_the_uninterrupted_run(ci_run, tmp_path_factory):
    """`ulimit -f 600` (RLIMIT_FSIZE 600 KiB) on a run that must recompute the activation
    cache: the job ends with the project's `failed:` / `likely fix:` lines, no SIGSEGV, no
    partial file, no other output touched; the rerun without the limit writes a cache equal
    to the uninterrupted run's."""
    import os
    import resource
    import subprocess

    import h5py
    import numpy as np

    from .conftest import SNAKEMAKE

    work = _copy(ci_run, tmp_path_factory, "fsize")
    acts = work / "results/demo/activations"
    shutil.rmtree(acts / ".kept")
    (acts / "bible.h5").unlink()
    before = _state(work)
    limit = 600 * 1024

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    cmd = [SNAKEMAKE, "--snakefile", str(REPO / "workflow/Snakefile"), "--directory", str(work),
           "--configfile", str(REPO / "config/ci.yaml"), "--cores", "2", "results/demo/activations/bible.h5"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONFAULTHANDLER": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=work, preexec_fn=limited)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "SIGSEGV" not in out and "Segmentation fault" not in out, out[-3000:]
    log = (work / "logs/cache_activations/demo/bible.log").read_text()
    assert "rule cache_activations failed:" in log and "file involved: results/demo/activations/bible.h5.partial" in log
    assert "likely fix: the file-size limit was reached" in log and "ulimit -f unlimited" in log
    assert not acts.exists() or not [p for p in acts.rglob("*") if p.is_file()]
    assert _state(work) == before
    proc = snakemake(work, "results/demo/activations/bible.h5", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with h5py.File(ci_run / "results/demo/activations/bible.h5") as a, h5py.File(acts / "bible.h5") as b:
        names: list[str] = []
        a.visit(lambda n: names.append(n) if isinstance(a[n], h5py.Dataset) else None)
        for n in names:
            np.testing.assert_array_equal(a[n][()], b[n][()], err_msg=n)
        assert a.attrs["fingerprint"] == b.attrs["fingerprint"]


def test_unlock_is_refused_while_another_run_is_live(ci_run, tmp_path_factory):
    """Run A executes (its pid recorded in .snakemake/posmech-runs/ by onstart); `--unlock`
    in the same directory is refused naming A's pid, A's lock stays, and A completes."""
    import subprocess
    import time

    from .conftest import SNAKEMAKE

    work = _copy(ci_run, tmp_path_factory, "live")
    # the target before --forcerun, which takes every word after it as a rule name
    cmd = [SNAKEMAKE, "resources/models/demo/manifest.json", "--snakefile", str(REPO / "workflow/Snakefile"),
           "--directory", str(work), "--configfile", str(REPO / "config/ci.yaml"), "--cores", "2",
           "--forcerun", "train_demo_model"]
    output = work.parent / "run_a.out"
    with open(output, "w") as sink:
        a = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, text=True, cwd=work)
    try:
        deadline = time.monotonic() + 300
        while not list((work / ".snakemake/posmech-runs").glob("*.json")) and time.monotonic() < deadline:
            assert a.poll() is None, output.read_text()[-3000:]
            time.sleep(0.2)
        [rec] = list((work / ".snakemake/posmech-runs").glob("*.json"))
        assert rec.name == f"{a.pid}.json" and list((work / ".snakemake/locks").glob("*.lock"))
        proc = snakemake(work, "--unlock", timeout=300)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0 and "not unlocking" in out and f"pid {a.pid}" in out, out[-3000:]
        assert a.poll() is None and list((work / ".snakemake/locks").glob("*.lock"))
        assert a.wait(timeout=900) == 0, output.read_text()[-3000:]
        assert "1 of 1 steps (100%) done" in output.read_text()
    finally:
        if a.poll() is None:
            a.kill()
            a.wait()
    assert not list((work / ".snakemake/posmech-runs").glob("*.json"))  # removed at its end (onsuccess)


@pytest.mark.parametrize(
    "content, expect",
    [
        (b'{"text": "In the beginning"}\n{"text": null}\n', ["document 1", "line 2 of", "web.jsonl", "None"]),
        (b'{"text": "In the beginning"}\n{"text": "caf\xe9"}\n', ["web.jsonl', line 2, column 14: byte 0xe9"]),
    ],
    ids=["null-text", "non-utf8"],
)
def test_corpus_document_faults_name_document_file_and_line(ci_run, tmp_path, content, expect):
    """A local corpus with a null text or a byte that is not UTF-8: prepare_corpus's log names
    the document, the file and the line; nothing else is touched."""
    src = tmp_path / "web.jsonl"
    src.write_bytes(content)
    cfg = _ci()
    cfg["corpora"]["web"] = {"source": str(src)}
    before = _state(ci_run)
    proc = snakemake(ci_run, "resources/corpora/web.jsonl",
                     configfile=_write(tmp_path, "config.yaml", yaml.safe_dump(cfg)), timeout=300)
    assert proc.returncode != 0
    log = (ci_run / "logs/prepare_corpus/web.log").read_text()
    for e in expect:
        assert e in log, (e, log[-3000:])
    assert "UnicodeDecodeError" not in log and "text_target" not in log
    assert not (ci_run / "resources/corpora/web.jsonl").exists()
    assert _state(ci_run) == before


def test_wrong_kind_tokens_file_names_tokenize(ci_run, tmp_path_factory):
    """An activation cache copied over the tokens file: the rerun cache job names rule
    `tokenize` (which writes tokens files) and the kept cache survives."""
    work = _copy(ci_run, tmp_path_factory, "kind")
    shutil.copy(work / "results/demo/activations/bible.h5", work / "results/demo/tokens/bible.h5")
    kept = [p for p in (work / "results/demo/activations/.kept").iterdir() if p.suffix != ".sha256"]
    proc = snakemake(work, "results/demo/activations/bible.h5", timeout=600)
    assert proc.returncode != 0
    log = (work / "logs/cache_activations/demo/bible.log").read_text()
    assert "expected 'tokens', which rule `tokenize` writes" in log and "--forcerun tokenize" in log, log[-3000:]
    assert kept and all(p.is_file() for p in kept)
