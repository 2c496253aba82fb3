"""A throw-away single-node Slurm cluster on localhost, for the Slurm integration test.

Starts ``munged``, ``slurmctld`` and ``slurmd`` (Debian's ``munge``, ``slurmctld``,
``slurmd``, ``slurm-client``; installed by ``.ci/run``) in the foreground as child
processes, with every file (config, key, socket, state, spool, logs) in one temporary
directory and free TCP ports, so nothing under ``/etc`` is used and concurrent instances
do not collide.  The node has the machine's CPUs (or more, oversubscribed), ``slurmd -C``'s
memory (a node may not claim more) and fake GPUs (``GresTypes=gpu``, node ``Gres=gpu:N``,
``gres.conf``: ``Name=gpu File=/dev/null``, then ``/dev/zero``, ...).  Clients find
it through ``SLURM_CONF`` (see :meth:`LocalSlurm.env`).  Daemons are stopped by their
recorded PIDs.

Manual use (e.g. to try ``profiles/slurm`` by hand)::

    python tests/slurm/localslurm.py start /tmp/myslurm   # prints `export SLURM_CONF=...`
    python tests/slurm/localslurm.py stop /tmp/myslurm
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
#: Device files of the fake GPUs (never opened: no task plugin constrains devices).
FAKE_GPU_FILES = ("/dev/null", "/dev/zero", "/dev/full")
PARTITION = "debug"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _which(tool: str) -> str:
    for d in (None, "/usr/sbin", "/sbin"):
        path = shutil.which(tool, path=d)
        if path:
            return path
    raise FileNotFoundError(f"{tool} not found (install Debian's slurmctld slurmd slurm-client munge)")


def node_hardware() -> dict[str, str]:
    """``slurmd -C``'s node line as a dict (CPUs, RealMemory, ...)."""
    out = subprocess.run([_which("slurmd"), "-C"], capture_output=True, text=True, timeout=30, check=True).stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("NodeName="))
    return dict(kv.split("=", 1) for kv in line.split())


class LocalSlurm:
    """A single-node Slurm cluster rooted at ``root`` (a directory it owns)."""

    def __init__(self, root: str | os.PathLike[str], min_job_age: int = 300, real_memory: int | None = None,
                 cpus: int | None = None, gpus: int = 1):
        """``cpus``: CPUs the node offers (default ``slurmd -C``'s; more oversubscribes the
        machine, so that several jobs run at once); ``gpus``: fake GPUs (1 to 3);
        ``real_memory``: MB, capped at ``slurmd -C``'s (a node may not claim more)."""
        if not 1 <= gpus <= len(FAKE_GPU_FILES):
            raise ValueError(f"gpus must be 1..{len(FAKE_GPU_FILES)}")
        self.root = Path(root)
        self.min_job_age = min_job_age
        self.real_memory = real_memory
        self.cpus_wanted = cpus
        self.gpus = gpus
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.conf = self.root / "etc" / "slurm.conf"

    # ------------------------------------------------------------------ configuration
    def env(self) -> dict[str, str]:
        """``os.environ`` plus ``SLURM_CONF`` pointing at this cluster, and ``bin/`` (the
        ``srun`` shim, see :meth:`write_config`) first on ``PATH``."""
        path = f"{self.root / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
        return {**os.environ, "SLURM_CONF": str(self.conf), "PATH": path}

    def write_config(self) -> None:
        r = self.root
        for d in ("etc", "state", "spool", "log", "run"):
            (r / d).mkdir(parents=True, exist_ok=True)
        # munged insists on a socket directory everyone can traverse and a private key.
        r.chmod(0o755)
        (r / "run").chmod(0o755)
        keydir = r / "munge"
        keydir.mkdir(mode=0o700, exist_ok=True)
        key = keydir / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
            key.chmod(0o600)
        hw = node_hardware()
        host = socket.gethostname().split(".")[0]
        mem = min(int(hw["RealMemory"]), self.real_memory or int(hw["RealMemory"]))
        self.ctld_port = _free_port()
        self.node, self.memory = host, mem
        self.cpus = max(int(hw["CPUs"]), self.cpus_wanted or 0)
        conf = f"""\
ClusterName=posmechci
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={self.ctld_port}
SlurmdPort={_free_port()}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={r / 'run' / 'munge.socket'}
SlurmUser=root
SlurmdUser=root
StateSaveLocation={r / 'state'}
SlurmdSpoolDir={r / 'spool'}
SlurmctldPidFile={r / 'run' / 'slurmctld.pid'}
SlurmdPidFile={r / 'run' / 'slurmd.pid'}
SlurmctldLogFile={r / 'log' / 'slurmctld.log'}
SlurmdLogFile={r / 'log' / 'slurmd.log'}
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
MinJobAge={self.min_job_age}
KillWait=5
InactiveLimit=0
GresTypes=gpu
SlurmdParameters=config_overrides
NodeName={host} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={mem} Gres=gpu:{self.gpus} State=UNKNOWN
PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
        self.conf.write_text(conf)
        # snakemake-executor-plugin-slurm-jobstep removes every SLURM_* variable but the
        # job's identity, SLURM_CONF included, before its `srun` inside the job; a real
        # cluster's config is at /etc/slurm or served configless, ours is here. This shim
        # gives the real srun our SLURM_CONF back (nothing else).
        (r / "bin").mkdir(exist_ok=True)
        shim = r / "bin" / "srun"
        shim.write_text(f'#!/bin/sh\nSLURM_CONF="{self.conf}" exec {_which("srun")} "$@"\n')
        shim.chmod(0o755)
        (r / "etc" / "gres.conf").write_text(
            "".join(f"NodeName={host} Name=gpu File={f}\n" for f in FAKE_GPU_FILES[: self.gpus]))

    # ------------------------------------------------------------------ lifecycle
    def start(self, timeout: float = 60) -> None:
        """Write the config, start the three daemons, wait until the node is idle."""
        self.write_config()
        r = self.root
        env = self.env()
        cmds = {
            "munged": [_which("munged"), "-F", f"--socket={r / 'run' / 'munge.socket'}",
                       f"--key-file={r / 'munge' / 'munge.key'}", f"--seed-file={r / 'munge' / 'munged.seed'}",
                       f"--pid-file={r / 'run' / 'munged.pid'}", f"--log-file={r / 'log' / 'munged.log'}"],
            "slurmctld": [_which("slurmctld"), "-D", "-i", "-f", str(self.conf)],
            "slurmd": [_which("slurmd"), "-D", "-f", str(self.conf), "-N", self.node],
        }
        try:
            for name in DAEMONS:
                out = open(r / "log" / f"{name}.out", "ab")
                self.procs[name] = subprocess.Popen(cmds[name], stdout=out, stderr=subprocess.STDOUT,
                                                    env=env, start_new_session=True)
                (r / "run" / f"{name}.child.pid").write_text(str(self.procs[name].pid))
                if name == "munged":
                    self._wait(lambda: (r / "run" / "munge.socket").exists(), 15, "munged socket")
                elif name == "slurmctld":
                    self._wait(lambda: self._ok(["scontrol", "ping"], "UP"), 30, "slurmctld")
            self._wait(lambda: self.node_state().startswith("IDLE"), timeout, "node to become idle")
        except BaseException:
            self.stop()
            raise

    def _ok(self, cmd: list[str], needle: str) -> bool:
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=10, env=self.env())
        except subprocess.TimeoutExpired:
            return False
        return p.returncode == 0 and needle in p.stdout

    def _wait(self, cond, timeout: float, what: str) -> None:  # noqa: ANN001
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited with {p.returncode} while waiting for {what}:\n{self.logs()}")
            if cond():
                return
            time.sleep(0.3)
        raise TimeoutError(f"timed out after {timeout} s waiting for {what}:\n{self.logs()}")

    def node_state(self) -> str:
        try:
            p = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True,
                               timeout=10, env=self.env())
        except subprocess.TimeoutExpired:
            return ""
        return p.stdout.strip().upper()

    def stop(self, timeout: float = 15) -> None:
        """Cancel this cluster's jobs (their processes are slurmstepd's, not ours), then stop
        the daemons this object started, by PID: SIGTERM, then SIGKILL."""
        ctld = self.procs.get("slurmctld")
        if ctld is not None and ctld.poll() is None:
            try:
                subprocess.run(["scancel", "--full", f"--user={os.getuid()}"], capture_output=True,
                               timeout=10, env=self.env())
                end = time.monotonic() + timeout
                while time.monotonic() < end and any(
                        j.get("JobState") in ("RUNNING", "PENDING", "COMPLETING", "CONFIGURING") for j in self.jobs()):
                    time.sleep(0.5)
            except (subprocess.SubprocessError, OSError):
                pass
        for name in reversed(DAEMONS):
            p = self.procs.pop(name, None)
            if p is None or p.poll() is not None:
                continue
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)

    def logs(self, tail: int = 40) -> str:
        out = []
        for f in sorted((self.root / "log").glob("*")):
            lines = f.read_text(errors="replace").splitlines()[-tail:]
            out.append(f"==> {f.name} <==\n" + "\n".join(lines))
        return "\n".join(out)

    # ------------------------------------------------------------------ queries
    def jobs(self) -> list[dict[str, str]]:
        """Every job slurmctld still remembers (finished ones for ``MinJobAge`` s), as
        ``scontrol -o show job`` key/value dicts."""
        p = subprocess.run(["scontrol", "-o", "show", "job"], capture_output=True, text=True,
                           timeout=30, env=self.env(), check=True)
        jobs = []
        for line in p.stdout.splitlines():
            if not line.startswith("JobId="):
                continue
            # values may contain spaces only in a few free-text fields; split on ' Key='
            parts = re.split(r" (?=[A-Za-z:/]+=)", line.strip())
            jobs.append({k: v.strip() for k, v in (part.split("=", 1) for part in parts if "=" in part)})
        return jobs

    def __enter__(self) -> "LocalSlurm":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _cli(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("start", "stop"):
        print(__doc__)
        return 2
    root = Path(argv[1])
    if argv[0] == "start":
        root.mkdir(parents=True, exist_ok=True)
        cluster = LocalSlurm(root)
        cluster.start()
        for p in cluster.procs.values():
            p.returncode = 0  # detach: keep the daemons running after this process exits
        print(f"export SLURM_CONF={cluster.conf}")
        return 0
    for name in reversed(DAEMONS):
        pidfile = root / "run" / f"{name}.child.pid"
        if pidfile.exists():
            try:
                os.kill(int(pidfile.read_text()), signal.SIGTERM)
            except ProcessLookupError:
                pass
            pidfile.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(_cli(sys.argv[1:]))
