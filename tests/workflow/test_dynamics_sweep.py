"""Checkpoints in the DAG (posmech.models.checkpoints, the `dynamics` section): a trained
model's `train.checkpoints` and a Hub model's `revisions` each expand into one job per
checkpoint, its sweep point (rule `sweep_<model>`, posmech.pipeline.sweep), running the followed
families and what they read, and into none for the other rules; the activation cache is not
built for a checkpoint whose followed rules do not read it. A dry run of config/ci.yaml
(three checkpoints of `demo`, the taxonomy family followed) plus a Hub model with two
revisions, offline from a Hugging Face cache built here; and a real run where a revision
has the model's own weights, so its sweep point must write what the family rules write."""

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


def _with_hub_model(tmp_path, monkeypatch, revisions, dynamics=None):
    """config/ci.yaml plus the Hub model `hub` (a tiny OPT, offline from a Hugging Face cache
    built here, every revision the same snapshot) with ``revisions``; ``dynamics`` replaces
    the section. Returns the config, its file and an empty working directory."""
    from huggingface_hub import constants

    cache = tmp_path / "hf-cache"
    _hub_cache(cache, tiny_archs.opt(tmp_path / "opt"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    cfg = yaml.safe_load((REPO / "config" / "ci.yaml").read_text())
    cfg["models"]["hub"] = {"source": "someorg/tiny-opt", "revisions": revisions, "device": "cpu"}
    if dynamics is not None:
        cfg["dynamics"] = dynamics
    # the Hub model's null (its random-init twin, on by default for a model the run does not
    # train) is another sweep point of its own; these tests count the checkpoints' points
    cfg["twins"] = {"enabled": False}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(cfg))
    work = tmp_path / "work"
    work.mkdir()
    return cfg, path, work


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


def sweep_blocks(log: str) -> list[str]:
    """The dry run's blocks of sweep point jobs (rules ``sweep_<model>``)."""
    return [b for b in re.split(r"\n(?=(?:local)?rule \w+:\n)", log) if re.match(r"(?:local)?rule sweep_\w+:\n", b)]


def test_each_checkpoint_is_one_sweep_point_job_and_none_of_the_other_rules(tmp_path, monkeypatch):
    cfg, path, work = _with_hub_model(tmp_path, monkeypatch, ["step1", "step2"])
    proc = snakemake(work, "-n", configfile=path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    jobs = jobs_by_rule(proc.stdout + proc.stderr)
    demo_ckpts = [f"demo@step{s}" for s in cfg["models"]["demo"]["train"]["checkpoints"]]
    hub_ckpts = ["hub@step1", "hub@step2"]
    # the followed family (dynamics.claims: P6, P7 -> taxonomy): once per model, and one
    # sweep point per checkpoint (one rule per swept model)
    assert sorted(jobs["taxonomy"]) == ["demo", "hub"]
    assert sorted(jobs["sweep_demo"]) == sorted(demo_ckpts) and sorted(jobs["sweep_hub"]) == sorted(hub_ckpts)
    assert sorted(jobs["head_table"]) == sorted(["demo", "hub", *demo_ckpts, *hub_ckpts])
    blocks = sweep_blocks(proc.stdout + proc.stderr)
    assert len(blocks) == len(demo_ckpts) + len(hub_ckpts)
    for block in blocks:  # the taxonomy family's tables and scorecard, no figure, no cache
        assert "/taxonomy/heads.csv" in block and "/scorecard/diagonal_taxonomy.csv" in block, block
        assert ".png" not in block.split("output:")[1] and "/activations/" not in block, block
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
    of the model and of its checkpoints' sweep points (capped by --cores, 2 in this dry run); 1 for the demo's
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
        blocks = [b for b in re.split(r"\n(?=(?:local)?rule \w+:\n)", log)
                  if re.match(r"rule (taxonomy|sweep_demo):\n", b)]
        assert len(blocks) == 1 + len(cfg["models"]["demo"]["train"]["checkpoints"]), len(blocks)
        seen[threads] = {re.search(r"model=([^,\s]+)", b).group(1): ("threads: 2" in b) for b in blocks}
    assert all(seen[None].values()) and not any(seen[1].values()), seen


def test_the_demo_sweep_points_build_the_cache_their_kernels_read_and_draw_nothing(tmp_path):
    """config/demo.yaml follows the kernels family too: its sweep points compute the
    activation cache the kernels read (inside the job: the cache rule never runs on a
    checkpoint), and no checkpoint gets a figure; and the demo's longest training starts first."""
    work = tmp_path / "work"
    work.mkdir()
    proc = snakemake(work, "-n", configfile=REPO / "config" / "demo.yaml")
    assert proc.returncode == 0, proc.stderr[-4000:]
    log = proc.stdout + proc.stderr
    jobs = jobs_by_rule(log)
    assert not [m for rule in ("cache_activations", "taxonomy", "kernels", "interventions", "attn_only")
                for m in jobs[rule] if "@" in m]
    blocks = sweep_blocks(log)
    assert len(blocks) == len(jobs["sweep_demo"]) + len(jobs["sweep_demo_attn"]) >= 7
    for block in blocks:
        outputs = block.split("output:")[1].split("\n")[0]
        assert "/activations/bible.h5" in outputs and "/kernels/kernels.h5" in outputs, outputs
        assert ".png" not in outputs, outputs
    # a sweep point asks for its parts' memory at most and their runtimes summed (Slurm's
    # limits): each part's request is its rule's on the model (a checkpoint has its shape)
    def resources(block):
        line = re.search(r"^    resources: (.*)$", block, flags=re.M).group(1)
        return {k: int(v) for k, v in re.findall(r"(mem_mb|runtime)=(\d+)", line)}

    by_rule = {re.match(r"(?:local)?rule (\w+):", b).group(1): resources(b)
               for b in re.split(r"\n(?=(?:local)?rule \w+:\n)", log)
               if re.match(r"(?:local)?rule (taxonomy|interventions|kernels|cache_activations|sinks):\n", b)
               and re.search(r"^    wildcards: model=demo(,|$)", b, flags=re.M)}
    assert len(by_rule) == 5, by_rule  # the sinks family too: the sweep follows S1, S2
    point = resources(next(b for b in blocks if "rule sweep_demo:" in b))
    assert point["mem_mb"] == max(r["mem_mb"] for r in by_rule.values()) > 0
    assert point["runtime"] == sum(r["runtime"] for r in by_rule.values())
    # the longest trainings start first (train_demo_model's priority: 10 plus its share of the
    # largest training's work): demo's, whose checkpoints and twin come after it, and demo-rope's,
    # of the same size since issue 44 (3 layers each; its SwiGLU MLP a little larger), before demo-attn's
    prio = {re.search(r"model=([^,\s]+)", b).group(1): float(re.search(r"^    priority: (\S+)$", b, flags=re.M).group(1))
            for b in re.split(r"\n(?=(?:local)?rule \w+:\n)", log) if re.match(r"(?:local)?rule train_demo_model:\n", b)}
    assert set(prio) == {"demo", "demo-attn", "demo-rope"} and max(prio.values()) == 11
    assert min(prio["demo"], prio["demo-rope"]) > 10.9 > prio["demo-attn"] > 10
    # the L rules run on demo-attn's checkpoints (attn_only.models), not on demo's
    assert all("/attn_only/head_roles.csv" in b for b in blocks if "rule sweep_demo_attn:" in b)
    assert not [b for b in blocks if "rule sweep_demo:" in b and "/attn_only/" in b]


def _same_table(a, b):
    import pandas as pd

    if a.suffix == ".h5":
        import h5py
        import numpy as np

        with h5py.File(a) as fa, h5py.File(b) as fb:
            names = []
            fa.visit(lambda n: names.append(n) if isinstance(fa[n], h5py.Dataset) else None)
            assert names and set(names) == set(n for n in names if n in fb), (a, names)
            for n in names:
                x, y = fa[n][()], fb[n][()]
                if isinstance(x, np.ndarray) and x.dtype.kind == "f":
                    assert np.array_equal(x, y, equal_nan=True), (a, n)
        return
    da, db = pd.read_csv(a), pd.read_csv(b)
    drop = [c for c in ("model", "artifact") if c in da]  # the model's name; a checkpoint draws no figure
    da, db = da.drop(columns=drop), db.drop(columns=drop)
    # texts naming the model ("hub, bible document 0 …")
    db = db.map(lambda v: v.replace("hub@step1", "hub") if isinstance(v, str) else v)
    pd.testing.assert_frame_equal(da, db)


def test_a_sweep_point_writes_what_the_family_rules_write_on_the_same_weights(tmp_path, monkeypatch):
    """The Hub model's revision step1 is the snapshot of main, and the sweep follows every
    claim of resources/findings.yaml judged at a checkpoint (not S5, judged on the whole sweep): the sweep point hub@step1 (one job: every family and
    rule that runs on the model, and the activation cache) writes the same tables, HDF5 values
    and scorecards as those rules' own jobs on hub, and no figure."""
    from posmech.core.families import ANALYSES
    from posmech.verdicts.dynamics import FORMATION_ANALYSIS

    # every claim judged at a checkpoint (S5, the order of formation, reads the whole sweep)
    whole = set(ANALYSES[FORMATION_ANALYSIS].claims)
    claims = [f["claim"] for f in yaml.safe_load((REPO / "resources" / "findings.yaml").read_text())["findings"]
              if f["claim"] not in whole]
    _, path, work = _with_hub_model(tmp_path, monkeypatch, ["step1"],
                                    {"claims": claims, "heads": ["sharpest_previous_token"]})
    proc = snakemake(work, "results/hub@step1/heads.csv", configfile=path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    log = proc.stdout + proc.stderr
    assert "rule sweep_hub:" in log and "wildcards: model=hub@step1" in log
    point = work / "results" / "hub@step1"
    files = sorted(str(f.relative_to(point)) for f in point.rglob("*")
                   if f.is_file() and f.suffix in (".csv", ".h5") and f.name != "heads.csv")
    families = {f.split("/")[0] for f in files}
    # every family that runs on an OPT model (attn_only: attention-only models only)
    assert {"taxonomy", "interventions", "kernels", "activations", "anatomy", "geometry", "contextual",
            "neurons", "posembed", "scorecard"} <= families, families
    assert not list(point.rglob("*.png"))
    proc = snakemake(work, *[f"results/hub/{f}" for f in files], configfile=path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    for f in files:
        _same_table(work / "results" / "hub" / f, point / f)


def test_a_figureless_model_runs_its_analyses_as_one_job_and_draws_nothing(tmp_path):
    """Config `figures: false` on a local model (a tiny GPT-2): its analyses run in one job,
    rule `sweep_<model>`, whose outputs are every table, HDF5 file and scorecard its rules'
    own jobs would write (the same code: test_a_sweep_point_writes_what_the_family_rules_write
    above) and no figure, after validating the local model's directory and tokenizing its corpus
    (the manifest and the tokens are that job's outputs: two jobs fewer); no analysis, fetch or
    tokenize rule runs on it; the other models are unchanged."""
    cfg = yaml.safe_load((REPO / "config" / "ci.yaml").read_text())
    cfg["models"]["quick"] = {"source": str(tiny_archs.BUILDERS["gpt2"](tmp_path / "gpt2")), "device": "cpu", "figures": False}
    cfg["twins"] = {"enabled": False}
    path = tmp_path / "quick.yaml"
    path.write_text(yaml.safe_dump(cfg))
    work = tmp_path / "work"
    work.mkdir()
    proc = snakemake(work, "-n", configfile=path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    log = proc.stdout + proc.stderr
    jobs = jobs_by_rule(log)
    assert jobs["sweep_quick"] == ["quick"] and "quick" not in jobs["fetch_model"] + jobs["tokenize"]
    for rule in ("taxonomy", "kernels", "anatomy", "geometry", "interventions", "contextual", "cache_activations"):
        assert "quick" not in jobs[rule] and "demo" in jobs[rule], (rule, jobs[rule])
    (block,) = [b for b in sweep_blocks(log) if "wildcards: model=quick" in b]
    out = block.split("output:")[1].split("log:")[0]
    assert "results/quick/taxonomy/heads.csv" in out and "results/quick/scorecard/diagonal_taxonomy.csv" in out
    assert "resources/models/quick/manifest.json" in out and "results/quick/tokens/bible.h5" in out
    assert ".png" not in out
    assert "quick" in jobs["head_table"] and "rule build_twin" not in log


def test_figures_false_on_a_swept_model_stops_before_any_job(tmp_path):
    """A model whose checkpoints are swept runs its followed analyses per checkpoint in a job of
    another kind: `figures: false` on it is refused before any job, naming the key and the fix."""
    cfg = yaml.safe_load((REPO / "config" / "ci.yaml").read_text())
    cfg["models"]["demo"]["figures"] = False
    path = tmp_path / "swept.yaml"
    path.write_text(yaml.safe_dump(cfg))
    work = tmp_path / "work"
    work.mkdir()
    proc = snakemake(work, "-n", configfile=path, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "`models.demo.figures`" in out and "Remove `figures: false`" in out, out[-2000:]
    assert not (work / "results").exists()


def test_a_twins_job_runs_what_its_model_runs_and_no_rule_left_out(tmp_path):
    """A random-init twin's one job (rule `sweep_<model>_twin`) runs what its model runs: with
    `--omit-from attn_only bos_induction` (bench/study.py leaves gpt2's attention-only rules out so)
    neither the model nor its twin runs them, and without it both do; the twin's other outputs
    (tables and scorecards its verdicts read) are there either way."""
    cfg = yaml.safe_load((REPO / "config" / "ci.yaml").read_text())
    cfg["models"]["quick"] = {"source": str(tiny_archs.BUILDERS["gpt2"](tmp_path / "gpt2")), "device": "cpu"}
    cfg["twins"] = {"enabled": True, "models": ["quick"]}
    path = tmp_path / "twin.yaml"
    path.write_text(yaml.safe_dump(cfg))
    outputs = {}
    for omit in (False, True):
        work = tmp_path / f"work{int(omit)}"
        work.mkdir()
        args = ("-n", "--omit-from", "attn_only", "bos_induction") if omit else ("-n",)
        proc = snakemake(work, *args, configfile=path)
        assert proc.returncode == 0, proc.stderr[-4000:]
        log = proc.stdout + proc.stderr
        (block,) = [b for b in sweep_blocks(log) if "wildcards: model=quick-twin" in b]
        outputs[omit] = block.split("output:")[1].split("log:")[0]
        jobs = jobs_by_rule(log)
        assert ("quick" in jobs["attn_only"]) == (not omit), jobs["attn_only"]
    assert "results/quick-twin/scorecard/random_token_patterns.csv" in outputs[False]
    assert "/attn_only/" not in outputs[True] and "/scorecard/random_token_patterns.csv" not in outputs[True]
    for out in outputs.values():
        assert "results/quick-twin/scorecard/induction_intervention.csv" in out
        assert "results/quick-twin/scorecard/diagonal_taxonomy.csv" in out
