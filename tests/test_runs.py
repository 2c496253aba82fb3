"""posmech.pipeline.runs (issue 32, item 4): `--unlock` is only advised, and only accepted, when no
other run is live in the working directory."""

import json
import subprocess
import sys

from posmech.pipeline import runs


def _lock(tmp_path):
    (tmp_path / runs.LOCKS).mkdir(parents=True, exist_ok=True)
    (tmp_path / runs.LOCKS / "0.output.lock").write_text("x")


def test_a_live_run_refuses_unlock_and_says_the_lock_is_not_stale(tmp_path):
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        runs.register(tmp_path, pid=other.pid, argv=["snakemake", "--cores", "2"])
        _lock(tmp_path)
        [live] = runs.live_runs(tmp_path)
        assert live["pid"] == other.pid
        msg, refuse = runs.lock_report(tmp_path, unlocking=True)
        assert refuse and f"pid {other.pid}" in msg and "not unlocking" in msg and "snakemake --cores 2" in msg
        msg, refuse = runs.lock_report(tmp_path)
        assert not refuse and "do not use `--unlock`" in msg and f"pid {other.pid}" in msg
    finally:
        other.kill()
        other.wait()
    # the same pid file, its process gone (kill -9): not live; the lock is stale
    assert runs.live_runs(tmp_path) == []
    msg, refuse = runs.lock_report(tmp_path)
    assert not refuse and "`--unlock` is safe" in msg
    assert runs.lock_report(tmp_path, unlocking=True) == (None, False)


def test_a_reused_pid_is_not_the_recorded_run(tmp_path):
    p = runs.register(tmp_path)  # this process, recorded with another start time
    rec = json.loads(p.read_text())
    rec["start_ticks"] = "1"
    p.write_text(json.dumps(rec))
    assert runs.live_runs(tmp_path, exclude_pid=-1) == []
    rec["start_ticks"] = runs._start_ticks(rec["pid"])
    p.write_text(json.dumps(rec))
    assert [r["pid"] for r in runs.live_runs(tmp_path, exclude_pid=-1)] == [rec["pid"]]


def test_register_and_unregister(tmp_path):
    p = runs.register(tmp_path)
    assert p.is_file() and runs.live_runs(tmp_path) == []  # this process itself is not "another run"
    runs.unregister(tmp_path)
    assert not p.exists()
    assert runs.lock_report(tmp_path) == (None, False)  # nothing recorded, no lock: nothing to say
