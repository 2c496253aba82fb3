"""`make selfcheck` end to end: the DAG on the hand-built models of config/selfcheck.yaml gives
every expected verdict, and a run with one threshold flipped disagrees, naming the (claim,
model) (issue 29: the self-check must be able to fail).

Cost: the whole self-check DAG runs once per module; the flipped-threshold test reruns only rule
`findings` on its output. No self-check model draws figures (`figures: false` in
config/selfcheck.yaml): each model's analyses run in one job, so the DAG's jobs are its models'
corpus job and one job per model (26 models and 6 twins, ~40 jobs instead of ~139). Measured
(2026-11-29, the shared 2-core machine at load 4-8, this file's three tests): 171 CPU s (user +
system of the test, Snakemake and every job), 175 s wall; before, the 101-job layout's jobs alone
recorded 398 CPU s and issue 43's 34 jobs added ~230 (docs/performance.md, "`make test` and CI"). Most of a job is its fixed cost (interpreter, imports,
model load), so the cost follows the number of jobs, not the models' sizes."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from tests.workflow.conftest import REPO, snakemake

pytestmark = pytest.mark.workflow

CONFIG = REPO / "config" / "selfcheck.yaml"
#: the random-init models of six architectures (posmech.models.handbuilt.RandomSpec), each read
#: against a random-init twin of its own (config/selfcheck.yaml, `twins`)
RANDOM = ("random-gpt2", "random-llama", "random-neox", "random-bloom", "random-opt", "random-gptneo")


def compare(work) -> subprocess.CompletedProcess[str]:
    """``python -m posmech selfcheck``: the run's findings against the cases' expected verdicts
    (posmech.verdicts.selfcheck.CASES, whatever config the run used)."""
    return subprocess.run([sys.executable, "-m", "posmech", "selfcheck", str(work / "results/report")],
                          capture_output=True, text=True, cwd=REPO)


@pytest.fixture(scope="module")
def selfcheck_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("selfcheck")
    built = subprocess.run([sys.executable, "-m", "posmech.verdicts.selfcheck", "build", str(work / "resources/selfcheck")],
                           capture_output=True, text=True, cwd=REPO)
    assert built.returncode == 0, built.stderr[-3000:]
    heads = [f"results/{m}/heads.csv" for m in RANDOM]
    proc = snakemake(work, "results/report/findings.csv", *heads, configfile=CONFIG)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return work


def test_the_dag_gives_every_expected_verdict(selfcheck_run):
    proc = compare(selfcheck_run)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "DISAGREES" not in proc.stdout


def test_a_flipped_threshold_makes_the_selfcheck_fail_naming_the_pair(selfcheck_run, tmp_path):
    """L5 demands 0.99 of the look-back-two head's attention at offset -2: attn-planted's planted
    head puts ~0.6 there (scores 5, 4, 3 at offsets -2, -1, -3), so L5 fails on it. Only rule
    findings reruns (its thresholds changed)."""
    cfg = yaml.safe_load(CONFIG.read_text())
    cfg.setdefault("findings", {})["l5_min_offset2_mass"] = 0.99
    flipped = tmp_path / "flipped.yaml"
    flipped.write_text(yaml.safe_dump(cfg))
    proc = snakemake(selfcheck_run, "results/report/findings.csv", configfile=flipped)
    assert proc.returncode == 0, proc.stderr[-6000:]
    out = compare(selfcheck_run)
    assert out.returncode == 1
    bad = [line.split()[:4] for line in out.stdout.splitlines() if "DISAGREES" in line]
    assert bad == [["L5", "attn-planted", "holds", "fails"]], out.stdout


def test_nothing_holds_on_random_weights_beyond_the_null(selfcheck_run):
    """Issue 43: random-init models of six architectures (no training), each read against its
    twin: no plain `holds` on a finding that is not structural by construction (K1), and no
    head of theirs holds any role of heads.csv."""
    import pandas as pd

    from posmech.store.tables import read_table

    table = pd.read_csv(selfcheck_run / "results/report/findings.csv")
    rows = table[table["model"].isin(RANDOM)]
    assert set(rows["model"]) == set(RANDOM)
    assert (rows["origin"].fillna("") != "no null").all(), "every random model has its twin"
    plain = rows[(rows["verdict"] == "holds") & (rows["origin"] != "structural")]
    assert plain.empty, plain[["model", "claim", "value", "reason"]].to_string()
    for m in RANDOM:
        heads = read_table(selfcheck_run / f"results/{m}/heads.csv")
        assert not heads["previous_token"].fillna(False).astype(bool).any(), m
        for column, no_role in (("p7_chosen", {"none"}), ("kernel_role", {"none"}), ("score_taxon", {"neither"}),
                                ("k7_class", {"other"}), ("l_role", {"none"}), ("sink", {False, "False"})):
            if column in heads:
                assert set(heads[column].dropna()) <= no_role, (m, column, sorted(set(heads[column].dropna())))
