"""Checkpoints in the DAG (posmech.models.checkpoints, the `dynamics` section): a trained
model's `train.checkpoints` and a Hub model's `revisions` each expand into one job per
checkpoint for every rule of the followed families, and into none for the other rules; the
activation cache is not built for a checkpoint whose followed rules do not read it. A dry
run of config/ci.yaml (three checkpoints of `demo`, the taxonomy family followed) plus a
Hub model with two revisions, offline from a Hugging Face cache built here."""

from __future__ import annotations

import re
import shutil
from collections import defaultdict

import yaml

from tests import tiny_archs
from tests.workflow.conftest import REPO, snakemake

COMMITS = {"main": "a" * 40, "step1": "b" * 40, "step2": "c" * 40}


def _hub_cache(root, src):
    repo = root / "models--someorg--tiny-opt"
    (repo / "refs").mkdir(parents=True)
    for ref, commit in COMMITS.items():
        (repo / "refs" / ref).write_text(commit)
        shutil.copytree(src, repo / "snapshots" / commit)


def jobs_by_rule(log: str) -> dict[str, list[str]]:
    """``{rule: [its jobs' model wildcard]}`` of a dry run's log."""
    out: dict[str, list[str]] = defaultdict(list)
    for block in re.split(r"\n(?=(?:local)?rule \w+:\n)", log):
        m = re.match(r"(?:local)?rule (\w+):\n", block)
        if m:
            wc = re.search(r"^    wildcards: (.*)$", block, flags=re.M)
            model = re.search(r"model=([^,\s]+)", wc.group(1)) if wc else None
            out[m.group(1)].append(model.group(1) if model else "")
    return out


def test_each_checkpoint_is_one_job_per_followed_rule_and_none_of_the_others(tmp_path, monkeypatch):
    from huggingface_hub import constants

    cache = tmp_path / "hf-cache"
    _hub_cache(cache, tiny_archs.opt(tmp_path / "opt"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    cfg = yaml.safe_load((REPO / "config" / "ci.yaml").read_text())
    cfg["models"]["hub"] = {"source": "someorg/tiny-opt", "revisions": ["step1", "step2"], "device": "cpu"}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(cfg))
    work = tmp_path / "work"
    work.mkdir()
    proc = snakemake(work, "-n", configfile=path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    jobs = jobs_by_rule(proc.stdout + proc.stderr)
    demo_ckpts = [f"demo@step{s}" for s in cfg["models"]["demo"]["train"]["checkpoints"]]
    hub_ckpts = ["hub@step1", "hub@step2"]
    # the followed family (dynamics.claims: P6, P7 -> taxonomy): once per model and checkpoint
    assert sorted(jobs["taxonomy"]) == sorted(["demo", "hub", *demo_ckpts, *hub_ckpts])
    assert sorted(jobs["head_table"]) == sorted(["demo", "hub", *demo_ckpts, *hub_ckpts])
    # the weights: a trained checkpoint is copied from the training job, a Hub one fetched at its revision
    assert sorted(jobs["checkpoint_model"]) == sorted(demo_ckpts) and jobs["train_demo_model"] == ["demo"]
    assert sorted(jobs["fetch_model"]) == sorted(["hub", *hub_ckpts])
    # the other families and rules: the models only
    for rule in ("anatomy", "geometry", "interventions", "kernels", "contextual", "posembed_averaging"):
        assert set(jobs[rule]) <= {"demo", "hub"}, (rule, jobs[rule])
    # nothing followed reads the cache: it is not built for a checkpoint
    assert not [m for m in jobs["cache_activations"] if "@" in m]
    assert jobs["dynamics"] == [""] and jobs["findings"] == [""]


def test_a_models_threads_are_its_analysis_jobs_and_its_checkpoints_threads(tmp_path):
    """`models.<m>.threads` (schema default 2) is the Snakemake `threads` of every analysis job
    of the model and of its checkpoints (capped by --cores, 2 in this dry run); 1 for the demo's
    tiny models, so two of their jobs share a 2-core machine."""
    cfg = yaml.safe_load((REPO / "config" / "ci.yaml").read_text())
    seen = {}
    for threads in (None, 1):
        if threads:
            cfg["models"]["demo"]["threads"] = threads
        path = tmp_path / f"threads-{threads}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        work = tmp_path / f"work-{threads}"
        work.mkdir()
        proc = snakemake(work, "-n", configfile=path)
        assert proc.returncode == 0, proc.stderr[-4000:]
        log = proc.stdout + proc.stderr
        blocks = [b for b in re.split(r"\n(?=(?:local)?rule \w+:\n)", log) if re.match(r"rule taxonomy:\n", b)]
        assert len(blocks) == 1 + len(cfg["models"]["demo"]["train"]["checkpoints"]), len(blocks)
        seen[threads] = {re.search(r"model=([^,\s]+)", b).group(1): ("threads: 2" in b) for b in blocks}
    assert all(seen[None].values()) and not any(seen[1].values()), seen
