"""Live runs in a working directory: when Snakemake's ``--unlock`` is safe.

Snakemake locks the working directory while a run executes; ``kill -9`` (or a power cut)
leaves the lock behind and a later run stops with ``LockException``, whose advice is
``--unlock``.  That advice is only safe when no other run is alive in the directory: run
while another one is executing, ``--unlock`` removes *its* lock and the two runs then
delete each other's outputs.  So each run records itself here while it executes:

* ``onstart`` writes ``.snakemake/posmech-runs/<pid>.json`` (pid, host, start time of
  the process, command line) — :func:`register`;
* ``onsuccess`` / ``onerror`` remove it — :func:`unregister` (a run killed with
  ``kill -9`` leaves it, and the pid is then dead: :func:`live_runs` ignores it);
* at parse time (``common.smk``, before Snakemake takes its lock) :func:`lock_report`
  says which runs are alive; ``--unlock`` is refused while one is, and when a lock is
  left with no live run the advice to unlock is given.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

RUNS = Path(".snakemake") / "posmech-runs"
LOCKS = Path(".snakemake") / "locks"


def _start_ticks(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22):
    with the pid, it identifies a process (a pid can be reused); None where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def register(workdir: str | os.PathLike[str] = ".", pid: int | None = None,
             argv: list[str] | None = None) -> Path:
    """Record the run of process ``pid`` (default: this one) as live in ``workdir``."""
    pid = os.getpid() if pid is None else pid
    d = Path(workdir) / RUNS
    d.mkdir(parents=True, exist_ok=True)
    p = d / f"{pid}.json"
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps({
        "pid": pid, "host": socket.gethostname(), "start_ticks": _start_ticks(pid),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"), "command": " ".join(sys.argv if argv is None else argv),
    }))
    os.replace(tmp, p)
    return p


def unregister(workdir: str | os.PathLike[str] = ".", pid: int | None = None) -> None:
    """Remove the record of the run of ``pid`` (default: this process)."""
    pid = os.getpid() if pid is None else pid
    (Path(workdir) / RUNS / f"{pid}.json").unlink(missing_ok=True)


def alive(run: dict[str, Any]) -> bool:
    """Whether a recorded run's process is alive: on this host, the pid exists with the
    recorded start time; on another host (a shared file system), it cannot be checked and
    counts as alive."""
    if run.get("host") != socket.gethostname():
        return True
    pid = int(run.get("pid", -1))
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    ticks = _start_ticks(pid)
    return run.get("start_ticks") is None or ticks is None or ticks == run["start_ticks"]


def live_runs(workdir: str | os.PathLike[str] = ".", exclude_pid: int | None = None) -> list[dict[str, Any]]:
    """The runs recorded in ``workdir`` whose process is alive (not ``exclude_pid``)."""
    exclude_pid = os.getpid() if exclude_pid is None else exclude_pid
    out = []
    for p in sorted((Path(workdir) / RUNS).glob("*.json")):
        try:
            run = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if int(run.get("pid", -1)) != exclude_pid and alive(run):
            out.append(run)
    return out


def locked(workdir: str | os.PathLike[str] = ".") -> bool:
    """Whether Snakemake's lock files are present in ``workdir``."""
    return any((Path(workdir) / LOCKS).glob("*.lock"))


def describe(run: dict[str, Any]) -> str:
    return f"pid {run.get('pid')} on {run.get('host')}, started {run.get('started')}: `{run.get('command', '')}`"


def lock_report(workdir: str | os.PathLike[str] = ".", unlocking: bool = False) -> tuple[str | None, bool]:
    """``(message, refuse)``: what to tell a run starting in ``workdir``.  With a live run,
    ``--unlock`` is refused (``refuse``) and any other run is told that the lock is not
    stale; with a lock and no live run, that ``--unlock`` is safe; else nothing."""
    live = live_runs(workdir)
    if live:
        who = "; ".join(describe(r) for r in live)
        if unlocking:
            return (f"posmech: not unlocking: another run is live in this directory ({who}). `--unlock` would "
                    "remove its lock and the two runs would delete each other's outputs. Wait for it to end "
                    "(or stop it), then run your command again.", True)
        if locked(workdir):
            return (f"posmech: another run is live in this directory ({who}); its lock is not stale: do not use "
                    "`--unlock`. Wait for it to end, or run in another directory (`--directory`).", False)
        return None, False
    if locked(workdir) and not unlocking:
        return ("posmech: a lock is left in .snakemake/locks/ and no run is live in this directory (a run killed "
                "with kill -9 or a power cut): `--unlock` is safe, then run the same command again.", False)
    return None, False
