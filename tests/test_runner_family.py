"""A family job (docs/workflow.md, "Families"): each analysis sees its own slice of the job,
runs in order in one process, and a failure names the analysis."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest

from posmech.errors import PosmechError
from posmech.runner import Names, analysis_view, run_family


def _analysis(name: str, fn) -> object:
    """A ``main`` whose module is ``name``, as a script ``scripts/<name>.py`` imported by its
    family's script has."""
    module = types.ModuleType(name)
    fn.__module__ = name
    module.main = fn
    sys.modules.setdefault(name, module)
    return fn


def family_job(tmp_path: Path) -> SimpleNamespace:
    return SimpleNamespace(
        input=Names({"manifest": "m.json", "first__only": "f.txt"}),
        output=Names({"first__h5": str(tmp_path / "a.h5"), "first__scorecard": str(tmp_path / "first.csv"),
                      "second__table": str(tmp_path / "b.csv"), "second__scorecard": str(tmp_path / "second.csv")}),
        params=Names({"entry": {"device": "cpu"}, "second__k": 3}),
        wildcards=Names({"model": "demo"}), log=[str(tmp_path / "family.log")], rule="fam", threads=1,
    )


def test_each_analysis_sees_its_outputs_the_shared_inputs_and_its_links(tmp_path):
    smk = family_job(tmp_path)
    first = analysis_view(smk, "first")
    assert dict(first.output.items()) == {"h5": str(tmp_path / "a.h5"), "scorecard": str(tmp_path / "first.csv")}
    assert dict(first.input.items()) == {"manifest": "m.json", "only": "f.txt"}
    assert dict(first.params.items()) == {"entry": {"device": "cpu"}}
    second = analysis_view(smk, "second", {"h5": "first__h5"})
    assert second.input.h5 == str(tmp_path / "a.h5") and second.input["manifest"] == "m.json"
    assert "only" not in second.input.keys() and second.params.k == 3
    assert second.output.scorecard == str(tmp_path / "second.csv") and second.rule == "second"
    assert list(second.output) == [str(tmp_path / "b.csv"), str(tmp_path / "second.csv")]


def test_a_link_to_nothing_and_an_analysis_without_outputs_are_workflow_bugs(tmp_path):
    smk = family_job(tmp_path)
    with pytest.raises(PosmechError, match="links to 'first__nope'"):
        analysis_view(smk, "second", {"h5": "first__nope"})
    with pytest.raises(PosmechError, match="no output named `third__<key>`"):
        analysis_view(smk, "third")


def test_a_family_runs_its_analyses_in_order_and_accounts_for_each(tmp_path):
    seen = []

    def first(smk, log):
        Path(smk.output.h5).write_text("x")
        seen.append(("first", smk.rule))

    def second(smk, log):
        seen.append(("second", Path(smk.input.h5).read_text()))

    smk = family_job(tmp_path)
    run_family(smk, [(_analysis("first", first), {}), (_analysis("second", second), {"h5": "first__h5"})])
    assert seen == [("first", "first"), ("second", "x")]
    log = Path(smk.log[0]).read_text()
    assert log.index("analysis first (rule fam, 1/2)") < log.index("analysis second (rule fam, 2/2)")
    record = json.loads(Path(smk.log[0] + ".perf.json").read_text())
    assert record["rule"] == "fam" and [a["analysis"] for a in record["analyses"]] == ["first", "second"]
    assert all(a["cpu_s"] >= 0 for a in record["analyses"])


def test_a_failing_analysis_is_named_and_the_next_does_not_run(tmp_path):
    ran = []

    def first(smk, log):
        raise PosmechError("config key `x`: bad")

    def second(smk, log):
        ran.append(True)

    smk = family_job(tmp_path)
    with pytest.raises(SystemExit):
        run_family(smk, [(_analysis("first", first), {}), (_analysis("second", second), {})])
    assert not ran
    assert "rule fam (analysis first) failed: config key `x`: bad" in Path(smk.log[0]).read_text()
    # the next job (a plain rule) is named by its own rule again
    from posmech.runner import run

    plain = SimpleNamespace(input=Names({}), output=Names({}), log=[str(tmp_path / "plain.log")], rule="plain",
                            threads=1)
    with pytest.raises(SystemExit):
        run(plain, lambda smk, log: (_ for _ in ()).throw(PosmechError("boom")))
    assert "rule plain failed: boom" in Path(plain.log[0]).read_text()
