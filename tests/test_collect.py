"""posmech.pipeline.collect: what the `collect` lines of the stage files register, and where each
output goes (rule all, scorecards, report figures and tables); posmech.pipeline.applicability.Schedule."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from posmech.pipeline.applicability import Schedule
from posmech.pipeline.collect import Collector, analyses_of, report_kind
from posmech.core.errors import PosmechError


class _File(str):
    def __new__(cls, path, report=None):
        f = super().__new__(cls, path)
        f.flags = {"report": report} if report is not None else {}
        return f


class _Outputs(dict):
    def __len__(self):
        return sum(len(v) if isinstance(v, list) else 1 for v in self.values())


def _rule(name, wildcards=("model",), **outputs):
    return SimpleNamespace(name=name, wildcard_names=set(wildcards), output=_Outputs(outputs))


REPORT = SimpleNamespace(caption=None, category="K")
FAMILY = _rule(
    "kernels",
    positional_kernels__h5=_File("results/{model}/kernels/kernels.h5"),
    etc_table__table=_File("results/{model}/kernels/etc.csv", REPORT),
    etc_table__scorecard=_File("results/{model}/scorecard/etc_table.csv"),
    kernel_heatmaps__layer0=_File("results/{model}/kernels/kernels_layer0.png", REPORT),
)
FAMILIES = {"kernels": ("positional_kernels", "etc_table", "kernel_heatmaps")}


def _collector(skip=None, checkpoint_of=None):
    schedule = Schedule(skip or {}, checkpoint_of or {}, set(FAMILIES["kernels"]))  # the sweep follows K
    return Collector(FAMILIES, schedule.runs_on, checkpoint_of or {})


def test_each_output_goes_where_its_key_and_report_flag_say():
    c = _collector(checkpoint_of={"m@step1": "m"})
    c.add(FAMILY, model=["m", "m@step1"])
    assert analyses_of(FAMILY) == {"positional_kernels": "positional_kernels__", "etc_table": "etc_table__",
                                   "kernel_heatmaps": "kernel_heatmaps__"}
    assert c.collected("scorecard") == ["results/m/scorecard/etc_table.csv", "results/m@step1/scorecard/etc_table.csv"]
    # a checkpoint's figures are not made; its tables are
    assert c.collected("figure") == ["results/m/kernels/kernels_layer0.png"]
    assert c.collected("table", checkpoints=False) == ["results/m/kernels/etc.csv"]
    assert len(c.collected()) == 7 and c.collected(models=["m@step1"])[0] == "results/m@step1/kernels/kernels.h5"
    flags = c.report_flags()
    assert flags["results/m/kernels/etc.csv"]["rule"] == "kernels (analysis etc_table)"
    assert flags["results/m/kernels/etc.csv"]["wildcards"] == {"model": "m"}
    assert report_kind("x.csv", "table", _File("x.csv", REPORT), report_tables=False) is None


def test_a_rule_is_not_scheduled_on_a_model_it_cannot_run_on():
    c = _collector(skip={"r": {"positional_kernels": "no learned W_pos", "etc_table": "x", "kernel_heatmaps": "x"}})
    c.add(FAMILY, model=["m", "r"])
    assert {p.split("/")[1] for p in c.collected()} == {"m"}
    c.add(FAMILY, when=False, model=["m"])
    assert c.entries[-1][1] == []


def test_collect_refuses_what_the_report_could_not_read():
    c = _collector()
    with pytest.raises(PosmechError, match="one list of values per wildcard"):
        c.add(FAMILY, corpus=["bible"])
    with pytest.raises(PosmechError, match="must list the same"):
        Collector({"kernels": ("positional_kernels",)}, lambda a, ms: ms, {}).add(FAMILY, model=["m"])
    bad = _rule("solo", scorecard=_File("results/{model}/scorecard/other.csv"))
    with pytest.raises(PosmechError, match="must be 'results/{model}/scorecard/solo.csv'"):
        c.add(bad, model=["m"])
    half = _collector(skip={"h": {"positional_kernels": "no learned W_pos"}})
    with pytest.raises(PosmechError, match="a family runs all its analyses or none"):
        half.add(FAMILY, model=["h"])


def test_the_schedule_runs_on_a_checkpoint_only_what_the_sweep_follows():
    s = Schedule({"r": {"kernels": "rotary"}}, {"m@1": "m"}, {"taxonomy"})
    assert s.runs_on("kernels", ["m", "r", "m@1"]) == ["m"]
    assert s.runs_on("taxonomy", ["m", "r", "m@1"]) == ["m", "r", "m@1"]
    arch = SimpleNamespace(scheme_words="rotary positions", model_type="llama")
    assert s.notes({"r": arch}) == [
        "posmech: model r (rotary positions, llama): 1 analysis rules do not apply and are not scheduled; their "
        "claims are `not measurable` with the reason (results/report/findings.csv, docs/workflow.md)"]


def test_a_figureless_twin_makes_no_figure_but_counts_as_a_final_model():
    """A random-init twin run as one job (config `twins.figures: false`, posmech.pipeline.sweep):
    its figures are not collected, its scorecards and tables are, also without checkpoints."""
    schedule = Schedule({}, {}, set())
    c = Collector(FAMILIES, schedule.runs_on, {}, figureless={"m-twin"})
    c.add(FAMILY, model=["m", "m-twin"])
    assert c.collected("figure") == ["results/m/kernels/kernels_layer0.png"]
    assert c.collected("scorecard", checkpoints=False) == ["results/m/scorecard/etc_table.csv",
                                                          "results/m-twin/scorecard/etc_table.csv"]
    assert "results/m-twin/kernels/etc.csv" in c.collected("table", checkpoints=False)


def test_a_twins_point_reads_a_fraction_of_each_settings_document_count():
    """posmech.pipeline.sweep.thinned (config `twins.documents_fraction`): in a twin's sweep
    point each section's document count is cut to ceil(fraction × n), at least 2, and so is
    geometry.n_tokens (a count P8's and P1/P9-P11's means average over); its other counts
    (attn_only's random-token samples), null counts (every document: the tokens read cuts them)
    and params that are not settings are left as they are."""
    from posmech.pipeline.sweep import thinned
    from posmech.settings import PARAM_KEY

    params = {
        "settings": {PARAM_KEY: "interventions", "n_documents": 3, "min_tokens": 16},
        "kernels": {PARAM_KEY: "kernels", "n_chapters": 8, "heatmap_max_position": 31},
        "sinks": {PARAM_KEY: "sinks", "n_samples": 64, "n_tokens": 64},
        "attn_only": {PARAM_KEY: "attn_only", "n_sequences": 40, "bos_induction": {"n_samples": 40}},
        "cache": {PARAM_KEY: "cache", "n_documents": None, "batch_size": 32},
        "entry": {"n_documents": 7},
        "geometry": {PARAM_KEY: "geometry", "n_tokens": 100, "batch_size": 8},
        "few": {PARAM_KEY: "geometry", "n_tokens": 3, "batch_size": 8},
    }
    out = thinned(params, 0.5)
    assert out["settings"] == {PARAM_KEY: "interventions", "n_documents": 2, "min_tokens": 16}
    assert out["kernels"]["n_chapters"] == 4 and out["kernels"]["heatmap_max_position"] == 31
    assert out["sinks"] == {PARAM_KEY: "sinks", "n_samples": 32, "n_tokens": 64}
    for same in ("attn_only", "cache", "entry"):
        assert out[same] == params[same]
    assert out["geometry"] == {PARAM_KEY: "geometry", "n_tokens": 50, "batch_size": 8}
    assert thinned(params, 0.25)["few"]["n_tokens"] == 2  # at least 2 (a pairwise cosine needs a pair)
    assert thinned(params, 1.0) == params


def test_omitted_rules_are_read_from_the_command_line():
    """posmech.pipeline.sweep.omitted_rules: the rule names after `--omit-from` (or `-O`, or
    `--omit-from=RULE`) up to the next option; none without it."""
    from posmech.pipeline.sweep import omitted_rules

    argv = ["snakemake", "--cores", "2", "--omit-from", "attn_only", "bos_induction", "--keep-going", "all"]
    assert omitted_rules(argv) == {"attn_only", "bos_induction"}
    assert omitted_rules(["snakemake", "-O", "kernels", "--omit-from=sinks"]) == {"kernels", "sinks"}
    assert omitted_rules(["snakemake", "--cores", "2", "all"]) == frozenset()


class _PartRule:
    """A rule as posmech.pipeline.sweep reads it: its name, wildcards, named inputs, outputs and
    params (each already for a given model)."""

    def __init__(self, name, inputs, outputs, params):
        from snakemake.iocontainers import Namedlist

        self.name, self.wildcard_names = name, ["model"]
        self._in, self._out, self._params = inputs, outputs, params
        self.output = Namedlist(fromdict=outputs)
        self.resources = {}

    def _fill(self, d, wc):
        from snakemake.iocontainers import Namedlist

        return Namedlist(fromdict={k: v.replace("{model}", wc["model"]) for k, v in d.items()})

    def expand_input(self, wc):
        return (self._fill(self._in, wc),)

    def expand_output(self, wc):
        return (self._fill(self._out, wc),)

    def expand_params(self, wc, inputs, outputs, job):
        from snakemake.iocontainers import Namedlist

        return (Namedlist(fromdict=self._params),)


def test_a_twins_parts_are_reduced_and_its_models_are_not():
    """posmech.pipeline.sweep.SweepPoints: a twin's point (config `twins`) reads the fraction
    of the documents and of geometry.n_tokens and computes only what its claims read
    (`claims_only`); its model's point, the same rules, keeps its settings and every part.
    A rule left out of the run (`--omit-from`) is no part of either, nor is what reads it."""
    from posmech.pipeline.sweep import SweepPoints, find_parts
    from posmech.settings import PARAM_KEY

    geometry = _PartRule("geometry", {}, {"h5": "results/{model}/geometry/extended.h5"},
                         {"settings": {PARAM_KEY: "geometry", "n_tokens": 100, "batch_size": 8}})
    attn = _PartRule("attn_only", {}, {"t": "results/{model}/attn_only/t.csv"}, {})
    reader = _PartRule("reader", {"t": "results/{model}/attn_only/t.csv"}, {"s": "results/{model}/s.csv"}, {})
    rules = [geometry, attn, reader]
    parts = {m: find_parts(m, rules, rules, {}) for m in ("m", "m-twin")}
    assert [r.name for r, _ in parts["m"]] == ["geometry", "attn_only", "reader"]
    points = SweepPoints(parts, {"m-twin": 0.25}, nulls={"m-twin"})
    twin, model = (points.params(SimpleNamespace(model=m)) for m in ("m-twin", "m"))
    assert twin[0]["params"]["settings"]["n_tokens"] == 25 and model[0]["params"]["settings"]["n_tokens"] == 100
    assert all(p["claims_only"] and p["documents_fraction"] == 0.25 for p in twin)
    assert not any("claims_only" in p or "documents_fraction" in p for p in model)
    omitted = find_parts("m-twin", rules, rules, {}, omitted={"attn_only"})
    assert [r.name for r, _ in omitted] == ["geometry"]
