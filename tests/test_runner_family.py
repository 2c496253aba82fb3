"""A family job (docs/workflow.md, "Families"): each analysis sees its own slice of the job,
runs in order in one process, and a failure names the analysis."""

from __future__ import annotations

import importlib
import json
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest

from posmech.core.errors import PosmechError
from posmech.pipeline.runner import Names, analysis_view, run_family


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
    from posmech.pipeline.runner import run

    plain = SimpleNamespace(input=Names({}), output=Names({}), log=[str(tmp_path / "plain.log")], rule="plain",
                            threads=1)
    with pytest.raises(SystemExit):
        run(plain, lambda smk, log: (_ for _ in ()).throw(PosmechError("boom")))
    assert "rule plain failed: boom" in Path(plain.log[0]).read_text()


def test_a_family_by_name_runs_the_analyses_and_links_of_posmech_families():
    """``run_family(snakemake, "<family>")``: the analyses of posmech.core.families.FAMILIES, each the
    ``main`` of its script, with the links of posmech.core.families.LINKS."""
    from posmech.core.families import FAMILIES, LINKS
    from posmech.pipeline.runner import family_analyses

    scripts = str(Path(__file__).resolve().parents[1] / "scripts")
    sys.path.insert(0, scripts)
    try:
        for family, names in FAMILIES.items():
            found = family_analyses(family, importlib.import_module)
            assert [fn.__module__ for fn, _ in found] == list(names), family
            assert [links for _, links in found] == [LINKS.get(n, {}) for n in names], family
        # every link names an earlier analysis of the same family
        for family, names in FAMILIES.items():
            for i, name in enumerate(names):
                for key in LINKS.get(name, {}).values():
                    assert key.split("__")[0] in names[:i], (family, name, key)
        assert [fn.__module__ for fn, _ in family_analyses("cache_activations", importlib.import_module)] == ["cache_activations"]
    finally:
        sys.path.remove(scripts)


def test_a_sweep_point_runs_its_parts_in_order_without_figures(tmp_path, monkeypatch):
    """posmech.pipeline.runner.run_sweep_point: each part (a rule's job on the checkpoint) gets a view
    shaped like its own job; a family's analyses run on their slices of it, an analysis whose
    outputs are all figures (None) is skipped, and the others see their figures as None."""
    from posmech.core import families
    from posmech.pipeline.runner import run_sweep_point

    seen = []

    def single(smk, log):  # a rule of its own: its unprefixed keys
        Path(smk.output.h5).write_text("cache")
        seen.append(("single", smk.rule, smk.wildcards.corpus, smk.params.n))

    def first(smk, log):
        seen.append(("first", Path(smk.input.cache).read_text(), smk.output.figure))
        Path(smk.output.table).write_text("t")

    def drawing(smk, log):
        seen.append(("drawing",))

    _analysis("sw_single", single)
    _analysis("sw_first", first)
    _analysis("sw_drawing", drawing)
    monkeypatch.setitem(families.FAMILIES, "fam", ("sw_first", "sw_drawing"))
    h5, table = str(tmp_path / "c.h5"), str(tmp_path / "t.csv")
    parts = [
        {"rule": "sw_single", "wildcards": {"model": "m@step1", "corpus": "web"}, "input": {"manifest": "m.json"},
         "output": {"h5": h5}, "params": {"n": 3}},
        {"rule": "fam", "wildcards": {"model": "m@step1"}, "input": {"cache": h5},
         "output": {"sw_first__table": table, "sw_first__figure": None, "sw_drawing__figure": None}, "params": {}},
    ]
    smk = SimpleNamespace(input=Names({}), output=Names({}), params=Names({"parts": parts}),
                          wildcards=Names({"model": "m@step1"}), log=[str(tmp_path / "sweep.log")],
                          rule="sweep_m", threads=1)
    run_sweep_point(smk, importlib.import_module)
    assert seen == [("single", "sw_single", "web", 3), ("first", "cache", None)]
    log = Path(smk.log[0]).read_text()
    assert "analysis sw_drawing (rule fam, 2/2): skipped, it makes figures only" in log
    record = json.loads(Path(smk.log[0] + ".perf.json").read_text())
    assert record["rule"] == "sweep_m" and [a["analysis"] for a in record["analyses"]] == ["sw_single", "sw_first"]
