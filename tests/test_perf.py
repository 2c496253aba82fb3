"""Per-job accounting (issue 15): the runner's ``PERF`` line and ``<log>.perf.json`` carry the
job's CPU seconds (self + children, from the OS), its peak RSS and its forward passes by
shape, counted by the bridge's hook, by the posmech engine and by the cache's capture."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from posmech.core import perf
from posmech.models import handbuilt as hb

REPO = Path(__file__).resolve().parents[1]

JOB = textwrap.dedent('''
    import subprocess, sys, time
    from types import SimpleNamespace
    import numpy as np, torch
    from posmech.models.loading import load_bridge, prepare_local_model
    from posmech.pipeline.runner import run

    model_dir, work = sys.argv[1], sys.argv[2]

    def burn(seconds):
        t = time.process_time()
        while time.process_time() - t < seconds:
            pass

    def main(smk, log):
        man = prepare_local_model("m", {"source": model_dir}, work + "/man")
        bridge = load_bridge(man, "cpu", "float32", "compatibility")
        with torch.inference_mode():
            for _ in range(2):
                bridge(torch.zeros(3, 7, dtype=torch.long), return_type=None)
            bridge.run_with_hooks(torch.zeros(1, 5, dtype=torch.long), return_type="logits",
                                  fwd_hooks=[("blocks.0.attn.hook_pattern", lambda t, hook: None)])
            bridge.run_with_cache(torch.zeros(2, 12, dtype=torch.long))
        # a child that burns 1.5 CPU-s (children count) and 400 MB touched here (peak RSS)
        child = subprocess.run([sys.executable, "-c",
                                "import time\\nt=time.process_time()\\nwhile time.process_time()-t<1.5: pass"])
        assert child.returncode == 0
        block = np.ones(400 * 2**20 // 8)
        del block

    smk = SimpleNamespace(input=[], output=[], log=[work + "/rule.log"], rule="tiny_rule", threads=1)
    run(smk, main)
''')


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    n = 12
    spec = hb.positional_spec(n_ctx=n, n_layer=2, n_head=2, scores={(0, 1): hb.previous_token_scores(n)})
    return hb.save_model_dir(spec, tmp_path_factory.mktemp("models") / "m")


def test_runner_logs_cpu_rss_and_forwards_of_a_job(tiny_model_dir, tmp_path):
    """A job in its own process: its log ends with one PERF line equal to the JSON beside it;
    the forward passes are exactly the four made, by shape; the CPU time includes the
    child's 1.5 s; the peak RSS includes the 400 MB array."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    proc = subprocess.run([sys.executable, "-c", JOB, str(tiny_model_dir), str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = tmp_path / "rule.log"
    lines = [line for line in log.read_text().splitlines() if "PERF {" in line]
    assert len(lines) == 1
    rec = perf.read_log(log)
    assert rec == json.loads((tmp_path / "rule.log.perf.json").read_text())
    assert rec["rule"] == "tiny_rule"
    assert rec["forwards"] == {"2x12": 1, "3x7": 2, "1x5": 1}
    assert rec["cpu_s"] >= 1.5, rec  # the child's CPU time is counted
    assert rec["cpu_s"] <= rec["wall_s"] * (os.cpu_count() or 1) + 1.5 + 1, rec
    assert rec["peak_rss_mb"] >= 400, rec
    # the first forward came before the child's 1.5 CPU-s
    assert 0 < rec["cpu_s_first_forward"] <= rec["cpu_s"] - 1.5, rec


def test_failed_job_still_logs_its_accounting(tmp_path):
    from types import SimpleNamespace

    from posmech.pipeline.runner import run

    perf.reset()

    def main(smk, log):
        perf.count_forward(4, 1024)
        raise ValueError("boom")

    smk = SimpleNamespace(input=[], output=[], log=[str(tmp_path / "r.log")], rule="r", threads=1)
    with pytest.raises(SystemExit):
        run(smk, main)
    rec = perf.read_log(tmp_path / "r.log")
    assert rec is not None and rec["forwards"] == {"4x1024": 1}
    assert (tmp_path / "r.log.perf.json").exists()
    perf.reset()


def test_the_cache_capture_counts_its_forwards(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from posmech.analyses.cache import as_capture

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="eager").eval()
    cap = as_capture(model, "compatibility")
    perf.reset()
    cap(np.zeros((2, 9), dtype=np.int64), ("resid_pre",))
    cap(np.zeros((2, 9), dtype=np.int64), ("ln1_out",))
    cap(np.zeros((1, 12), dtype=np.int64), ("resid_pre",))
    assert perf.forwards() == {"2x9": 2, "1x12": 1}
    perf.reset()
    assert perf.forwards() == {}


def test_shapes_are_sorted_largest_first_and_line_round_trips():
    perf.reset()
    perf.count_forward(1, 5)
    perf.count_forward(1, 1024)
    perf.count_forward(1, 1024)
    perf.count_tensor_forward(torch.zeros(7, dtype=torch.long))
    assert list(perf.forwards()) == ["1x1024", "1x7", "1x5"]
    rec = perf.job_record("x", 1.0)
    assert perf.parse_line("12:00:00 INFO posmech: " + perf.format_line(rec)) == rec
    assert perf.parse_line("no record here") is None
    perf.reset()


def test_the_record_names_the_heavy_libraries_the_job_imported(monkeypatch):
    import sys

    monkeypatch.delitem(sys.modules, "sklearn", raising=False)
    assert "sklearn" not in perf.job_record("x")["libraries"]
    monkeypatch.setitem(sys.modules, "sklearn", object())
    libraries = perf.job_record("x")["libraries"]
    assert "sklearn" in libraries and "torch" in libraries  # this test module imports torch
    assert libraries == [name for name in perf.HEAVY_LIBRARIES if name in libraries]  # the documented order


def _job(tmp_path: Path, rule: str = "probed", n_forwards: int = 1, fail: bool = False):
    """Run a job through :func:`posmech.pipeline.runner.run` in this process; its PERF record and log text."""
    from types import SimpleNamespace

    from posmech.pipeline.runner import run

    perf.reset()

    def main(smk, log):
        for _ in range(n_forwards):
            perf.count_forward(2, 12)
        if fail:
            raise ValueError("boom")

    log = tmp_path / f"{rule}.log"
    smk = SimpleNamespace(input=[], output=[], log=[str(log)], rule=rule, threads=1)
    try:
        run(smk, main)
    finally:
        perf.reset()
    rec = perf.read_log(log)
    assert rec == json.loads((tmp_path / f"{rule}.log.perf.json").read_text())
    return rec, log.read_text()


def test_probe_records_the_jobs_own_floor_and_excludes_its_cost(tiny_model_dir, tmp_path, monkeypatch):
    """POSMECH_PERF_PROBE set: the job's record carries a probe of 1 x n_ctx (12 < 1024) with the
    rounds asked, a positive median pass and the job's thread count; the job's cpu_s was taken
    before the probe: cpu_s + the probe's own total does not exceed the process's CPU now
    (it would by the probe's cost had cpu_s been taken after it)."""
    monkeypatch.setenv(perf.PROBE_ENV, str(tiny_model_dir))
    monkeypatch.setenv(perf.PROBE_ROUNDS_ENV, "5")
    rec, _ = _job(tmp_path)
    now = perf._cpu_s()
    p = rec["probe"]
    assert p["shape"] == "1x12" and p["rounds"] == 5 and p["threads"] == torch.get_num_threads() == 1, p
    assert 0 < p["cpu_s_per_pass"] < p["cpu_s_total"], p
    assert p["cpu_s_total"] > 0.01, p  # the model load alone: large enough for the check below
    assert rec["cpu_s"] + p["cpu_s_total"] <= now + 0.002, (rec, now)


@pytest.mark.parametrize("case", ["no env", "no forwards", "failed job"])
def test_no_probe_without_the_variable_forwards_or_success(tiny_model_dir, tmp_path, monkeypatch, case):
    """The probe is opt-in (no variable: no key) and only for finished jobs that made forward passes."""
    if case == "no env":
        monkeypatch.delenv(perf.PROBE_ENV, raising=False)
    else:
        monkeypatch.setenv(perf.PROBE_ENV, str(tiny_model_dir))
    if case == "failed job":
        with pytest.raises(SystemExit):
            _job(tmp_path, fail=True)
        rec = perf.read_log(tmp_path / "probed.log")
    else:
        rec, _ = _job(tmp_path, n_forwards=0 if case == "no forwards" else 1)
    assert rec is not None and "probe" not in rec, rec
    assert rec["forwards"] == ({} if case == "no forwards" else {"2x12": 1}), rec


@pytest.mark.parametrize("setting", [("missing", "3"), ("model", "0")])
def test_a_failing_probe_warns_and_the_job_succeeds(tiny_model_dir, tmp_path, monkeypatch, setting):
    """A probe that cannot load its model, or is asked for 0 rounds, is a warning in the log;
    the job finishes (no SystemExit), its record has no probe."""
    where, rounds = setting
    monkeypatch.setenv(perf.PROBE_ENV, str(tmp_path / "no-such-model") if where == "missing" else str(tiny_model_dir))
    monkeypatch.setenv(perf.PROBE_ROUNDS_ENV, rounds)
    rec, text = _job(tmp_path)
    assert "probe" not in rec, rec
    assert "WARNING" in text and "floor probe" in text and perf.PROBE_ENV in text, text
    assert "rule probed done" in text, text
