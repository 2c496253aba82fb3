"""An analysis that fails on one model does not stop the others (issue 44, item 0): its job
ends normally, what it had computed stays, each output it did not write is a failure record
(posmech.core.failures), an analysis reading one does not run, and its findings are not
measurable with the error and the log's path; an error naming a config key still ends the
run; a later run deletes the records so their jobs run again."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from posmech.core.errors import PosmechError
from posmech.core.failures import MAGIC, failure_of, remove_failures, write_failure
from posmech.pipeline.runner import Names, run, run_family
from posmech.verdicts.findings import Finding, judge
from posmech.verdicts.scorecard import failed_rules, read_scorecards, registered_rules
from tests.test_runner_family import _analysis


def _job(tmp_path: Path) -> SimpleNamespace:
    res = tmp_path / "results" / "phi"
    return SimpleNamespace(
        input=Names({"manifest": str(tmp_path / "m.json")}),
        output=Names({"positional_kernels__h5": str(res / "kernels/kernels.h5"),
                      "etc_table__table": str(res / "kernels/etc.csv"),
                      "etc_table__scorecard": str(res / "scorecard/etc_table.csv"),
                      "posembed_averaging__scorecard": str(res / "scorecard/posembed_averaging.csv")}),
        params=Names({}), wildcards=Names({"model": "phi"}), log=[str(tmp_path / "logs/kernels/phi.log")],
        rule="kernels", threads=1,
    )


def test_a_failing_analysis_leaves_records_and_the_job_goes_on(tmp_path):
    ran = []

    def positional_kernels(smk, log):
        raise IndexError("index 1 is out of bounds for dimension 2 with size 1")

    def etc_table(smk, log):
        ran.append("etc_table")

    def posembed_averaging(smk, log):
        Path(smk.output.scorecard).parent.mkdir(parents=True, exist_ok=True)
        Path(smk.output.scorecard).write_text("claim,model,quantity,value,detail\n")
        ran.append("posembed_averaging")

    smk = _job(tmp_path)
    run_family(smk, [(_analysis("positional_kernels", positional_kernels), {}),
                     (_analysis("etc_table", etc_table), {"h5": "positional_kernels__h5"}),
                     (_analysis("posembed_averaging", posembed_averaging), {})])
    assert ran == ["posembed_averaging"]  # etc_table read a failure record: not run
    rec = failure_of(smk.output.positional_kernels__h5)
    assert rec["analysis"] == "positional_kernels" and rec["model"] == "phi" and rec["log"] == smk.log[0]
    assert rec["error"].startswith("IndexError: index 1 is out of bounds")
    up = failure_of(smk.output.etc_table__scorecard)
    assert up["analysis"] == "etc_table" and "kernels.h5 failed" in up["error"] and up["log"] == smk.log[0]
    assert failure_of(smk.output.posembed_averaging__scorecard) is None  # what was computed stays
    log = Path(smk.log[0]).read_text()
    assert "analysis positional_kernels failed on this model: IndexError" in log and "Traceback" in log
    assert "analysis etc_table not run: its input" in log
    perf = json.loads(Path(smk.log[0] + ".perf.json").read_text())
    assert [a.get("failed", "")[:10] for a in perf["analyses"]] == ["IndexError", "input", ""]


def test_a_config_key_error_still_ends_the_job(tmp_path):
    def positional_kernels(smk, log):
        raise PosmechError("config key `kernels.etc_positions`: 99 is beyond the context")

    smk = _job(tmp_path)
    with pytest.raises(SystemExit):
        run_family(smk, [(_analysis("positional_kernels", positional_kernels), {})])
    assert failure_of(smk.output.positional_kernels__h5) is None


def test_an_analysis_with_a_job_of_its_own_is_isolated_too(tmp_path):
    out = tmp_path / "results/phi/scorecard/attention_statistics.csv"
    smk = SimpleNamespace(input=Names({}), output=Names({"scorecard": str(out)}), params=Names({}),
                          wildcards=Names({"model": "phi"}), log=[str(tmp_path / "s.log")], rule="attention_statistics",
                          threads=1)
    run(smk, lambda smk, log: (_ for _ in ()).throw(KeyError("blocks.0.attn.hook_k")))
    assert "KeyError" in failure_of(out)["error"]
    plain = SimpleNamespace(input=Names({}), output=Names({}), log=[str(tmp_path / "p.log")], rule="findings", threads=1)
    with pytest.raises(SystemExit):  # not an analysis: fails as before
        run(plain, lambda smk, log: (_ for _ in ()).throw(KeyError("x")))


def test_a_failed_scorecard_is_a_failed_not_measurable_finding(tmp_path):
    sc = tmp_path / "results/phi/scorecard/etc_table.csv"
    write_failure(sc, {"analysis": "positional_kernels", "model": "phi", "error": "IndexError: boom",
                       "log": "logs/kernels/phi.log"})
    ok = tmp_path / "results/gpt2/scorecard/etc_table.csv"
    ok.parent.mkdir(parents=True)
    ok.write_text("claim,model,quantity,value,detail,artifact\nK1,gpt2,kernel_defined_fraction,1.0,,etc.csv\n")
    paths = [str(sc), str(ok)]
    assert list(read_scorecards(paths)["model"]) == ["gpt2"]  # no row, never a 0
    assert registered_rules(paths)["phi"] == {"etc_table"}
    why = failed_rules(paths)[("phi", "etc_table")]
    f = Finding(claim="K1", finding="f", rule="etc_table", quantity="kernel_defined_fraction", predicate=">=",
                threshold="t", not_measurable="x")
    v = judge(f, "phi", {"t": 0.5}, None, True, None, why)
    assert v.verdict == "not measurable" and v.value is None
    assert v.reason.startswith("failed: rule etc_table failed on phi") and "logs/kernels/phi.log" in v.reason
    assert "IndexError: boom" in v.reason


def test_records_are_deleted_so_their_jobs_run_again(tmp_path):
    write_failure(tmp_path / "a/x.h5", {"analysis": "a"})
    (tmp_path / "a/y.csv").write_text("claim\n")
    (tmp_path / "a/z.bin").write_bytes(MAGIC[:5])
    assert remove_failures(tmp_path) == [str(tmp_path / "a/x.h5")]
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["y.csv", "z.bin"]
