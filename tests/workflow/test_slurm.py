"""Cluster submission for real: the CI-sized DAG through ``profiles/slurm`` on a
throw-away single-node Slurm (munged + slurmctld + slurmd on localhost, one fake GPU;
``tests/slurm/localslurm.py``).

The run uses config/ci.yaml plus ``cluster: {gpu: always}``: every model-heavy job
*requests* a GPU while the code still runs on the CPU (``device: cpu``), so the outputs
must equal the local CI run's (``ci_run``).  Checked on the cluster's own records
(``scontrol show job``): exactly the non-local jobs were submitted, GPU-marked ones with a
GPU (``TresPerJob=gres:gpu:1``) and the others without, all completed; a job made to fail
(corrupt corpus) is reported as failed.  Every subprocess has a hard timeout: a hung status
check fails the test instead of hanging CI.  The daemons are stopped by PID in teardown.
Needs Debian's slurmctld slurmd slurm-client munge (installed by .ci/run); skipped
elsewhere unless POSMECH_REQUIRE_SYSTEM_TESTS is set.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from posmech.pipeline.cluster import mem_mb, model_shape

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "slurm"))

from compare import compare_results  # noqa: E402
from localslurm import LocalSlurm  # noqa: E402

pytestmark = pytest.mark.workflow

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
PROFILE = REPO / "profiles" / "slurm"
# Hard limits (s); POSMECH_SLURM_TIMEOUT overrides the first on a slow machine.
RUN_TIMEOUT = int(os.environ.get("POSMECH_SLURM_TIMEOUT", 1800))  # whole DAG through Slurm (~6 min locally)
FAIL_TIMEOUT = 300  # s, the run whose job fails
DRY_TIMEOUT = 120


def _require_slurm() -> None:
    sys.path.insert(0, str(REPO))
    from tests.conftest import require_system

    for tool in ("slurmctld", "slurmd", "munged", "sbatch", "squeue", "scontrol", "srun"):
        require_system(tool)
    if os.geteuid() != 0:  # slurmd launches job steps as their owner: it must be root
        if os.environ.get("POSMECH_REQUIRE_SYSTEM_TESTS"):
            pytest.fail("the Slurm integration test starts slurmd and must run as root")
        pytest.skip("the Slurm integration test starts slurmd and must run as root")


def _config(tmp: Path, gpu: str) -> Path:
    cfg = yaml.safe_load((REPO / "config" / "ci.yaml").read_text())
    cfg["cluster"] = {"gpu": gpu}
    path = tmp / f"ci_gpu_{gpu}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _cmd(workdir: Path, configfile: Path, *args: str) -> list[str]:
    return [SNAKEMAKE, "--snakefile", str(REPO / "workflow" / "Snakefile"), "--directory", str(workdir),
            "--configfile", str(configfile), "--workflow-profile", str(PROFILE), *args]


def _start(cmd: list[str], env: dict[str, str], workdir: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            cwd=workdir, start_new_session=True)


def _finish(proc: subprocess.Popen[str], timeout: float, what: str) -> str:
    """Output of ``proc``; on timeout kill its process group (ours) and fail."""
    try:
        out, _ = proc.communicate(timeout=timeout)
        return out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=30)
        pytest.fail(f"{what} did not finish within {timeout} s (stuck status check?):\n{out[-5000:]}")


def dry_run_jobs(workdir: Path, configfile: Path, env: dict[str, str] | None = None) -> list[dict[str, str]]:
    """Jobs of a dry run with the slurm profile: rule, wildcards and resources of each."""
    proc = subprocess.run(_cmd(workdir, configfile, "-n"), capture_output=True, text=True,
                          timeout=DRY_TIMEOUT, env=env or {**os.environ, "HF_HUB_OFFLINE": "1"}, cwd=workdir)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return parse_jobs(proc.stdout + proc.stderr)


def parse_jobs(log: str) -> list[dict[str, str]]:
    """Job blocks of a Snakemake log: ``rule``, ``local`` (printed as localrule),
    ``jobid``, ``wildcards`` and ``resources`` (dicts of strings)."""
    jobs = []
    for block in re.split(r"\n(?=(?:local)?rule \w+:\n)", log):
        m = re.match(r"(local)?rule (\w+):\n", block)
        if not m:
            continue
        fields = dict(re.findall(r"^    (\w+): (.*)$", block, flags=re.M))
        res = dict(kv.split("=", 1) for kv in fields.get("resources", "").split(", ") if "=" in kv)
        wc = dict(kv.split("=", 1) for kv in fields.get("wildcards", "").split(", ") if "=" in kv)
        jobs.append({"rule": m.group(2), "local": bool(m.group(1)), "jobid": fields.get("jobid"),
                     "wildcards": wc, "resources": res})
    return jobs


def slurm_comment(job: dict) -> str:
    """The ``--comment`` the plugin gives a job: ``rule_<rule>[_wildcards_<v1>_<v2>]``."""
    wc = "_".join(job["wildcards"].values())
    return f"rule_{job['rule']}" + (f"_wildcards_{wc}" if wc else "")


def run_uuid(log: str) -> str:
    m = re.search(r"SLURM run ID: (\S+)", log)
    assert m, f"no SLURM run ID in the log:\n{log[-3000:]}"
    return m.group(1)


@pytest.fixture(scope="module")
def slurm_runs():
    """Start the cluster; run (a) the whole GPU-config DAG and (b) a DAG whose Slurm job
    fails, concurrently; yield both logs, the dry-run jobs and the cluster's job records."""
    _require_slurm()
    if Path("/etc/slurm/slurm.conf").exists() and not os.environ.get("POSMECH_REQUIRE_SYSTEM_TESTS"):
        pytest.skip("a real Slurm is configured on this machine (/etc/slurm/slurm.conf); "
                    "the throw-away cluster's srun would talk to it")
    root = Path(tempfile.mkdtemp(prefix="posmech-slurm-"))  # munged needs a world-traversable path
    # Two fake GPUs and four CPU slots (oversubscribed on a 2-core machine): two of the
    # 2-thread GPU jobs run at once, so their start-up and status-check latencies overlap.
    cluster = LocalSlurm(root, min_job_age=3600, cpus=4, gpus=2)
    procs: list[subprocess.Popen[str]] = []
    try:
        cluster.start()
        env = {**cluster.env(), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
        cfg = _config(root, "always")
        run_dir, fail_dir = root / "work-run", root / "work-fail"
        run_dir.mkdir()
        fail_dir.mkdir()
        dry = dry_run_jobs(run_dir, cfg, env)
        # (b) a corpus that is not JSON lines: train_demo_model's job must fail in Slurm.
        corpus = fail_dir / "resources" / "corpora" / "bible.jsonl"
        corpus.parent.mkdir(parents=True)
        corpus.write_text("this is not json\n")
        quick = ["--slurm-init-seconds-before-status-checks", "2", "--seconds-between-status-checks", "2"]
        procs.append(_start(_cmd(run_dir, cfg, *quick), env, run_dir))
        procs.append(_start(_cmd(fail_dir, cfg, *quick, "--retries", "0", "resources/models/demo/manifest.json"),
                            env, fail_dir))
        started = time.monotonic()
        fail_log = _finish(procs[1], FAIL_TIMEOUT, "the failing Slurm run")
        run_log = _finish(procs[0], max(1.0, RUN_TIMEOUT - (time.monotonic() - started)),
                          "the Slurm run of the CI DAG")
        yield {"root": root, "run_dir": run_dir, "run_log": run_log, "run_rc": procs[0].returncode,
               "fail_log": fail_log, "fail_rc": procs[1].returncode, "dry": dry, "jobs": cluster.jobs(),
               "cluster": cluster}
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(30)
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def _minutes(limit: str) -> int:
    """Slurm's ``[D-]HH:MM:SS`` time limit in minutes."""
    days, _, hms = limit.rpartition("-")
    h, m, sec = (int(x) for x in hms.split(":"))
    return int(days or 0) * 1440 + h * 60 + m + (sec > 0)


def _jobs_of(runs: dict, log: str) -> dict[str, dict[str, str]]:
    uuid = run_uuid(log)
    return {j["Comment"]: j for j in runs["jobs"] if j.get("JobName") == uuid}


def test_slurm_run_completes_and_equals_local_run(slurm_runs, ci_run):
    assert slurm_runs["run_rc"] == 0, slurm_runs["run_log"][-6000:]
    problems = compare_results(ci_run, slurm_runs["run_dir"])
    assert not problems, "\n".join(problems[:20])


def test_remote_jobs_request_gpu_exactly_when_marked(slurm_runs):
    assert slurm_runs["run_rc"] == 0, slurm_runs["run_log"][-6000:]
    executed = parse_jobs(slurm_runs["run_log"])
    remote = {slurm_comment(j): j for j in executed if not j["local"] and j["rule"] != "all"}
    local = {slurm_comment(j) for j in executed if j["local"]}
    submitted = _jobs_of(slurm_runs, slurm_runs["run_log"])
    # exactly the non-local jobs went to Slurm, the localrules did not
    assert set(submitted) == set(remote), (set(submitted), set(remote))
    assert local and not (local & set(submitted))
    assert {"rule_prepare_corpus_wildcards_bible", "rule_tokenize_wildcards_demo_bible"} <= local
    # GPU-marked in the dry run  <=>  submitted with a GPU
    planned_gpu = {slurm_comment(j): int(j["resources"].get("gpu", 0)) for j in slurm_runs["dry"]}
    gpu_jobs, cpu_jobs = set(), set()
    for comment, job in submitted.items():
        assert job["JobState"] == "COMPLETED", job
        has_gpu = "gpu" in job.get("TresPerJob", "") + job.get("TresPerNode", "") + job.get("TRES", "")
        assert has_gpu == (planned_gpu[comment] > 0), (comment, job.get("TresPerJob"), planned_gpu[comment])
        (gpu_jobs if has_gpu else cpu_jobs).add(comment)
        # memory and time limits are the ones planned in the dry run
        planned = next(j["resources"] for j in slurm_runs["dry"] if slurm_comment(j) == comment)
        assert job["MinMemoryNode"] == f"{planned['mem_mb']}M", (comment, job["MinMemoryNode"], planned)
        assert _minutes(job["TimeLimit"]) == int(planned["runtime"]), (comment, job["TimeLimit"], planned)
    assert any(c.startswith("rule_cache_activations") for c in gpu_jobs), gpu_jobs
    assert "rule_train_demo_model_wildcards_demo" in cpu_jobs  # trains on the CPU by design


def test_each_checkpoint_of_the_sweep_is_an_independent_slurm_job(slurm_runs):
    """config/ci.yaml's model saves three checkpoints (`train.checkpoints`), each the model
    `demo@step<N>` of the dynamics sweep: its sweep point (rule sweep_demo: the followed family,
    taxonomy) is a Slurm job of its own for each (its weights, rule checkpoint_model, are a copy
    made locally), all completed, and the sweep's table lists
    the three and the model itself (its equality with the local run: the test above)."""
    assert slurm_runs["run_rc"] == 0, slurm_runs["run_log"][-6000:]
    cfg = yaml.safe_load((REPO / "config" / "ci.yaml").read_text())
    steps = cfg["models"]["demo"]["train"]["checkpoints"]
    assert len(steps) >= 3
    submitted = _jobs_of(slurm_runs, slurm_runs["run_log"])
    sweep = {c: j for c, j in submitted.items() if c.startswith("rule_sweep_demo_wildcards_demo@step")}
    assert sorted(sweep) == sorted(f"rule_sweep_demo_wildcards_demo@step{s}" for s in steps), sorted(submitted)
    assert len({j["JobId"] for j in sweep.values()}) == len(steps)
    assert all(j["JobState"] == "COMPLETED" for j in sweep.values())
    table = (slurm_runs["run_dir"] / "results" / "report" / "dynamics.csv").read_text()
    assert all(f"demo@step{s}," in table for s in steps) and ",final,60,demo," in table


def test_failing_job_is_reported_as_failed(slurm_runs):
    log = slurm_runs["fail_log"]
    assert slurm_runs["fail_rc"] != 0, log[-4000:]
    assert "Error in rule train_demo_model" in log, log[-4000:]
    assert "SLURM status is: 'FAILED'" in log, log[-4000:]
    jobs = _jobs_of(slurm_runs, log)
    assert [j["JobState"] for j in jobs.values()] == ["FAILED"], jobs


def test_dry_run_shows_estimated_resources_and_cpu_config_requests_no_gpu(tmp_path):
    """`snakemake -n --workflow-profile profiles/slurm` shows the estimates; the CPU-only
    config (device cpu, cluster.gpu auto) plans no GPU, the same config with
    cluster.gpu: always plans one for every GPU-capable heavy job."""
    cfg = yaml.safe_load((REPO / "config" / "ci.yaml").read_text())
    cpu_jobs = dry_run_jobs(tmp_path, REPO / "config" / "ci.yaml")
    gpu_jobs = dry_run_jobs(tmp_path, _config(tmp_path, "always"))
    assert cpu_jobs and all(int(j["resources"].get("gpu", 0)) == 0 for j in cpu_jobs)
    marked = {j["rule"] for j in gpu_jobs if int(j["resources"].get("gpu", 0)) > 0}
    assert "cache_activations" in marked and "train_demo_model" not in marked
    train = next(j for j in cpu_jobs if j["rule"] == "train_demo_model")
    expected = mem_mb(model_shape("demo", {**cfg["models"]["demo"], "n_ctx": None}), "float32")
    assert int(train["resources"]["mem_mb"]) == expected
    assert int(train["resources"]["runtime"]) >= 10


#: Peak RSS (MB) of the L rules' calls on the attn-only-2l-shaped stand-in at the study's
#: settings (bench/attn_only.py --peak, 2026-11-27: a fresh interpreter importing, loading the
#: 51.5 M-parameter stand-in and running the call; docs/cluster.md).
# by job: the attn_only family's job (docs/workflow.md "Families") peaks in its
# random_token_patterns pass (1686 MB; its input_decomposition pass 1217)
ATTN_ONLY_PEAK_MB = {"attn_only": 1686, "bos_induction": 1215}


def _study_dry_run(tmp_path: Path, gpu: str | None = None) -> subprocess.CompletedProcess[str]:
    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    if gpu:
        cfg["cluster"] = {"gpu": gpu}
    path = tmp_path / f"study_{gpu}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PATH": _path_without("nvidia-smi")}
    return subprocess.run(_cmd(tmp_path, path, "-n"), capture_output=True, text=True, timeout=DRY_TIMEOUT,
                          env=env, cwd=tmp_path)


def _path_without(tool: str) -> str:
    """PATH without the directories holding ``tool``: the dry run sees a login node without a GPU."""
    import shutil

    keep = [d for d in os.environ.get("PATH", "").split(os.pathsep) if not (Path(d) / tool).exists()]
    assert shutil.which(tool, path=os.pathsep.join(keep)) is None
    return os.pathsep.join(keep)


def test_dry_run_requests_of_attn_only_2l_rules_fit_their_sequences(tmp_path):
    """The study's L rules on attn-only-2l (51.5 M parameters; sequences of 11-41 tokens, batch
    100) request between the stand-in's measured peak and twice it (they requested 68 GB, the
    estimate of 100 full 1024-token contexts with their logits)."""
    proc = _study_dry_run(tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    jobs = {j["rule"]: j for j in parse_jobs(proc.stdout + proc.stderr) if j["wildcards"].get("model") == "attn-only-2l"}
    assert set(ATTN_ONLY_PEAK_MB) <= set(jobs)
    for rule, peak in ATTN_ONLY_PEAK_MB.items():
        requested = int(jobs[rule]["resources"]["mem_mb"])
        assert peak <= requested <= 2 * peak, (rule, requested, peak)


def test_dry_run_warns_when_no_heavy_job_gets_a_gpu(tmp_path):
    """From a machine without a GPU, the study (devices auto, cluster.gpu auto) plans gpu=0
    for every heavy job: the dry run says so and how to ask for GPUs; with cluster.gpu:
    always every heavy job gets one and nothing is said."""
    proc = _study_dry_run(tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    log = proc.stdout + proc.stderr
    heavy = [j for j in parse_jobs(log) if "gpu" in j["resources"]]
    assert heavy and all(j["resources"]["gpu"] == "0" for j in heavy)
    assert log.count("WARNING (posmech): no model-heavy job requests a GPU") == 1
    assert "gpt2, tinystories-instruct-33m, attn-only-2l" in log and "cluster.gpu: always" in log
    proc = _study_dry_run(tmp_path, "always")
    assert proc.returncode == 0, proc.stderr[-4000:]
    log = proc.stdout + proc.stderr
    assert "WARNING (posmech)" not in log
    assert all(j["resources"]["gpu"] == "1" for j in parse_jobs(log) if "gpu" in j["resources"])
