"""A dynamics sweep point as one job: the checkpoint's followed rules, in one process.

A checkpoint (``<m>@<revision>``, :mod:`posmech.models.checkpoints`) runs only the rules the
``dynamics`` section follows (:func:`posmech.verdicts.dynamics.sweep_analyses`), and the rules they
read (the activation cache). Run as jobs of their own, each pays an interpreter, the imports
(torch alone ~2.5 CPU s here) and the model's loading, and their figures, which no report
shows for a checkpoint: most of a small model's checkpoint. So the workflow runs them as
*one* job per checkpoint, rule ``sweep_<model>`` (workflow/rules/dynamics.smk): its
*parts* are the jobs the followed rules would have been, with the same inputs, params and
output paths (their tables, HDF5 files and scorecards; no figures), run in data-flow order
by :func:`posmech.pipeline.runner.run_sweep_point`. The analysis rules themselves never run on a
checkpoint (their ``model`` wildcard is constrained to the other models).

This module finds the parts from the rules' own declarations (Snakemake's ``Rule`` objects:
``expand_input``, ``expand_params``), so a followed rule's job in a sweep point is the job
it would be on its own; nothing here names a rule.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection
from typing import Any

from posmech.core.errors import PosmechError
from posmech.settings import COUNT_KEYS, DOCUMENT_KEYS

#: separates a part's rule name from its own key in the sweep point rule's inputs and outputs
PART_SEP = "___"
#: outputs with these suffixes are figures: a sweep point draws none
FIGURE_SUFFIXES = (".png", ".svg", ".jpg", ".jpeg", ".pdf")


def _wildcards(values: dict[str, str]) -> Any:
    from snakemake.iocontainers import Wildcards

    return Wildcards(fromdict=dict(values))


def _fill(pattern: Any, values: dict[str, str]) -> str:
    from snakemake.io import apply_wildcards, strip_wildcard_constraints

    return apply_wildcards(strip_wildcard_constraints(str(pattern)), values)


def _files(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def is_figure(path: Any) -> bool:
    """Whether an output path is a figure (by its suffix)."""
    return str(path).lower().endswith(FIGURE_SUFFIXES)


def find_parts(checkpoint: str, followed: list[Any], producers: list[Any],
               values: dict[str, list[str]], omitted: Collection[str] = ()) -> list[tuple[Any, dict[str, str]]]:
    """The parts of ``checkpoint``'s sweep point: ``(rule, wildcards)`` in data-flow order
    (each after the parts whose outputs it reads). ``followed``: the rules the sweep follows
    that run on the checkpoint, each a rule (its job of the checkpoint) or ``(rule, wildcards)``
    (one job of a rule with other wildcards, e.g. the activation cache of one corpus);
    ``producers``: the rules a part may read from (the analysis rules and the activation
    cache); ``values``: the values of every wildcard but ``model`` (``{"corpus": [...]}``), to
    find which job of a producer writes an input. ``omitted``: the rules the run leaves out
    (Snakemake's ``--omit-from``): as Snakemake drops them and every job downstream of them
    from the DAG, a followed rule that is omitted, or that reads what an omitted rule writes
    (through its producers), is no part, so that a point (a twin's) runs what its model runs."""
    parts: list[tuple[Any, dict[str, str]]] = []
    seen: dict[tuple[str, tuple[tuple[str, str], ...]], bool] = {}

    def jobs_of(rule: Any) -> list[dict[str, str]]:
        names = [n for n in rule.wildcard_names if n != "model"]
        unknown = [n for n in names if n not in values]
        if unknown:
            raise PosmechError(f"rule {rule.name}: wildcard {unknown[0]} has no known values for a sweep point "
                               "(posmech.pipeline.sweep; workflow bug)")
        return [{"model": checkpoint, **dict(zip(names, combo))} for combo in itertools.product(*(values[n] for n in names))]

    writers: dict[str, tuple[Any, dict[str, str]]] = {}
    for rule in producers:
        for wc in jobs_of(rule):
            for _, value in rule.output.items():
                for f in _files(value):
                    writers[_fill(f, wc)] = (rule, wc)

    def add(rule: Any, wc: dict[str, str]) -> bool:
        """Whether ``rule``'s job runs (after the parts it reads, added first)."""
        key = (rule.name, tuple(sorted(wc.items())))
        if key in seen:
            return seen[key]
        seen[key] = False
        if rule.name in omitted:
            return False
        inputs = rule.expand_input(_wildcards(wc))[0]
        if not all([add(*writers[str(f)]) for f in inputs if str(f) in writers]):
            return False
        parts.append((rule, wc))
        seen[key] = True
        return True

    for step in followed:
        rule, wc = step if isinstance(step, tuple) else (step, {})
        add(rule, {**wc, "model": checkpoint})
    return parts


def omitted_rules(argv: list[str]) -> frozenset[str]:
    """The rules a Snakemake command line leaves out, ``--omit-from RULE ...`` (or
    ``--omit-from=RULE``; file targets too, harmless: no rule has a path as its name).
    Snakemake parses the Snakefile before it holds its DAG settings, hence the command line
    (as :func:`posmech.pipeline.preflight.jobs_run_locally`); a profile's ``omit-from`` is not
    seen."""
    out: set[str] = set()
    taking = False
    for a in argv:
        if a.startswith("--omit-from="):
            out.add(a.split("=", 1)[1])
            taking = False
        elif a in ("--omit-from", "-O"):
            taking = True
        elif taking and not a.startswith("-"):
            out.add(a)
        else:
            taking = False
    return frozenset(out)


def signature(parts: list[tuple[Any, dict[str, str]]]) -> tuple[tuple[str, tuple[tuple[str, str], ...]], ...]:
    """What a sweep point runs, the checkpoint's name left out: its rules and their other
    wildcards, in order (every checkpoint of a model must have the same)."""
    return tuple((rule.name, tuple(sorted((k, v) for k, v in wc.items() if k != "model"))) for rule, wc in parts)


def point_outputs(parts: list[tuple[Any, dict[str, str]]]) -> dict[str, str]:
    """The sweep point rule's outputs (patterns in ``{model}``): every part's outputs but
    its figures, named ``<rule>___<key>``."""
    out: dict[str, str] = {}
    for rule, wc in parts:
        rest = {k: v for k, v in wc.items() if k != "model"}
        for key, value in rule.output.items():
            if isinstance(value, list):
                raise PosmechError(f"rule {rule.name}: output {key} is a list; a sweep point needs one path per key")
            if not is_figure(value):
                out[f"{rule.name}{PART_SEP}{key}"] = _fill(value, {**rest, "model": "{model}"})
    return out


def _part_files(rule: Any, wc: dict[str, str]) -> tuple[Any, Any]:
    inputs = rule.expand_input(_wildcards(wc))[0]
    outputs = rule.expand_output(_wildcards(wc))[0]
    return inputs, outputs


def point_inputs(parts: list[tuple[Any, dict[str, str]]]) -> dict[str, Any]:
    """The sweep point job's inputs: every part's inputs that no earlier part writes,
    named ``<rule>___<key>``."""
    made: set[str] = set()
    out: dict[str, Any] = {}
    for rule, wc in parts:
        inputs, outputs = _part_files(rule, wc)
        named = dict(inputs.items())
        if sum(len(v) if isinstance(v, list) else 1 for v in named.values()) != len(inputs):
            raise PosmechError(f"rule {rule.name}: name every input (key=path) so that a sweep point can run it")
        for key, value in named.items():
            outside = [f for f in _files(value) if f not in made]
            if outside:
                out[f"{rule.name}{PART_SEP}{key}"] = outside if isinstance(value, list) else outside[0]
        made.update(str(f) for f in outputs)
    return out




def thinned(params: Any, fraction: float) -> Any:
    """``params`` with the document count of each settings param (:data:`DOCUMENT_KEYS`), and
    the counts its claims' quantities average over (:data:`COUNT_KEYS`, e.g.
    ``geometry.n_tokens``), cut to ``fraction`` of it (:func:`posmech.data.tokens.kept_documents`:
    at least 2); a null count (every document) is left to the tokens read
    (:func:`posmech.data.tokens.documents_fraction`), and every other key and param as it is.
    The cut values are the job's settings, so its outputs record them as they record the
    settings (e.g. ``n_tokens_requested`` of geometry's extended embeddings)."""
    from posmech.data.tokens import kept_documents
    from posmech.settings import PARAM_KEY, is_param

    def cut(value: dict[str, Any]) -> dict[str, Any]:
        section = str(value[PARAM_KEY])
        keys = [k for k in (DOCUMENT_KEYS.get(section), COUNT_KEYS.get(section)) if k and value.get(k) is not None]
        return {**value, **{k: kept_documents(int(value[k]), fraction) for k in keys}}

    return {k: cut(v) if is_param(v) else v for k, v in params.items()}


def point_parts(parts: list[tuple[Any, dict[str, str]]], fraction: float | None = None,
                claims_only: bool = False) -> list[dict[str, Any]]:
    """What the sweep point's script runs (:func:`posmech.pipeline.runner.run_sweep_point`): per part,
    its rule, wildcards, inputs, outputs (figures ``None``) and params, as its own job would
    have them (plain strings and values). ``fraction`` (a twin's ``twins.documents_fraction``,
    below 1): each part reads that fraction of the documents (its params :func:`thinned`, and
    its ``documents_fraction`` for the tokens it reads). ``claims_only`` (a twin's, config
    ``twins.claims_only``): each part computes only what its claims read
    (:func:`posmech.core.null.claims_only`)."""
    out = []
    for rule, wc in parts:
        inputs, outputs = _part_files(rule, wc)
        params = rule.expand_params(_wildcards(wc), inputs, outputs, None)[0]
        out.append({
            "rule": rule.name,
            "wildcards": dict(wc),
            "input": {k: (_files(v) if isinstance(v, list) else str(v)) for k, v in inputs.items()},
            "output": {k: (None if is_figure(v) else str(v)) for k, v in outputs.items()},
            "params": dict(params.items()) if fraction is None else thinned(dict(params.items()), fraction),
            **({} if fraction is None else {"documents_fraction": fraction}),
            **({"claims_only": True} if claims_only else {}),
        })
    return out


#: the rules that make a model's weights, tokens and head table (a sweep point runs none)
NOT_IN_SWEEP_POINTS = frozenset({"fetch_model", "train_demo_model", "build_twin", "checkpoint_model", "tokenize",
                                 "head_table"})
#: what a twin's point runs first, its weights (one job instead of two: one interpreter and one
#: ``import torch`` fewer, ~3-4 CPU s on the CI-sized run; docs/performance.md, "Twins")
IN_TWIN_POINTS = frozenset({"build_twin"})
#: what the point of a model configured with ``figures: false`` runs first: a local model's
#: validation and its tokens (two jobs fewer per model); a Hub model is still downloaded by
#: ``fetch_model`` of its own, on the machine that reaches the Hub (profiles/slurm: the login node)
IN_OWN_POINTS = frozenset({"fetch_model", "tokenize"})


def parts_by_checkpoint(rules: list[Any], collected: list[tuple[Any, list[dict[str, str]], bool]],
                        checkpoint_of: dict[str, str], corpora: list[str],
                        builds: dict[str, Collection[str]] | None = None,
                        omitted: Collection[str] = ()) -> dict[str, list[tuple[Any, dict[str, str]]]]:
    """``{checkpoint: its parts}`` (:func:`find_parts`): the analysis jobs collected on the
    checkpoint (``collected``: :attr:`posmech.pipeline.collect.Collector.entries`, which apply
    applicability and the config sections' models) and what they read, among ``rules``
    (the workflow's; those of :data:`NOT_IN_SWEEP_POINTS` never run in a sweep point).
    ``checkpoint_of``: ``{point: the model whose rule runs it}``; every point of a model must
    run the same rules. A model run as one job (config ``figures: false``) is a point of its
    own (``{model: model}``): every analysis it runs, no figures; so is a random-init twin
    (config ``twins.figures: false``). ``builds``: ``{point: the rules of``
    :data:`NOT_IN_SWEEP_POINTS` ``it runs first}`` (a twin its weights, :data:`IN_TWIN_POINTS`; a
    figureless model its validation and tokens, :data:`IN_OWN_POINTS`). ``omitted``: the rules
    the run leaves out (``--omit-from``; :func:`find_parts`): no point runs them, nor what reads
    them, as no model's own job does."""
    builds = builds or {}
    producers = [r for r in rules if "model" in (r.wildcard_names or ()) and r.name not in NOT_IN_SWEEP_POINTS]
    followed: dict[str, list[tuple[Any, dict[str, str]]]] = {}
    for step, jobs, _ in collected:
        for wc in jobs:
            c = wc.get("model")
            if c in checkpoint_of and (step.name not in NOT_IN_SWEEP_POINTS or step.name in builds.get(c, ())):
                job = (step, {k: v for k, v in wc.items() if k != "model"})
                if job not in followed.setdefault(c, []):
                    followed[c].append(job)
    out: dict[str, list[tuple[Any, dict[str, str]]]] = {}
    first: dict[str, str] = {}
    for c, m in checkpoint_of.items():
        builders = [r for r in rules if r.name in builds.get(c, ())]
        out[c] = find_parts(c, followed.get(c, []), producers + builders, {"corpus": list(corpora)}, omitted)
        first.setdefault(m, c)
        if signature(out[c]) != signature(out[first[m]]):
            raise PosmechError(f"checkpoints {first[m]} and {c} of model {m} would run different rules in the "
                               "dynamics sweep (posmech.pipeline.sweep); give them the same analyses")
    return out


def swept_models(parts: dict[str, list[Any]], checkpoint_of: dict[str, str]) -> dict[str, str]:
    """``{swept model: its first checkpoint}`` (the rule of its sweep points is declared
    from that checkpoint's parts; the others' are the same); a model whose checkpoints
    follow no analysis rule (only head quantities, say) has no sweep point."""
    out: dict[str, str] = {}
    for c, m in checkpoint_of.items():
        if parts[c]:
            out.setdefault(m, c)
    return out


def rule_name(model: str) -> str:
    """The name of the rule of ``model``'s sweep points, ``sweep_<model>`` (``-``, ``.`` as ``_``)."""
    import re

    return "sweep_" + re.sub(r"\W", "_", model)


def part_resource(parts: list[tuple[Any, dict[str, str]]], name: str, combine: Any, attempt: int) -> Any:
    """Resource ``name`` of a sweep point's job: ``combine`` (max, sum) of its parts'
    (each part rule's own value for its wildcards and the attempt); 0 when none asks."""
    found = []
    for rule, wc in parts:
        res = rule.resources.get(name)
        if res is None:
            continue
        v = res.evaluate(_wildcards(wc), attempt=attempt).value
        if isinstance(v, int | float):
            found.append(v)
    return combine(found) if found else 0


def twin_reads(twins: Collection[str], points: Collection[str], cfg: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{twin: what its analyses read}`` (config section ``twins``, ``cfg``), recorded in
    ``findings.meta.json`` (``twin_reads``) and said in the findings grid's legend: a twin run
    as one job without figures (in ``points``, :class:`SweepPoints`) reads
    ``documents_fraction`` of its model's documents (each count ``ceil(fraction × n)``, at
    least 2: :func:`thinned`) and, with ``claims_only``, computes only what its verdicts read;
    a twin with figures reads every document and computes everything, as its model."""
    return {t: ({"documents_fraction": float(cfg["documents_fraction"]), "claims_only": bool(cfg["claims_only"])}
                if t in points else {"documents_fraction": 1.0, "claims_only": False}) for t in twins}


class SweepPoints:
    """The sweep points of one run, ``parts``: ``{checkpoint: its parts}``
    (:func:`parts_by_checkpoint`); its methods are the ``sweep_<model>`` rules' input,
    params and resource functions of a job (``wildcards.model``: the checkpoint).
    ``fractions``: ``{point: the fraction of the documents it reads}`` (a twin's
    ``twins.documents_fraction``; a point not named, or at 1, reads every document).
    ``nulls``: the points that compute only what their claims read (the twins, config
    ``twins.claims_only``)."""

    def __init__(self, parts: dict[str, list[tuple[Any, dict[str, str]]]],
                 fractions: dict[str, float] | None = None, nulls: Collection[str] = ()) -> None:
        self.parts = parts
        self.fractions = {p: f for p, f in (fractions or {}).items() if f < 1}
        self.nulls = frozenset(nulls)

    def inputs(self, wildcards: Any) -> dict[str, Any]:
        return point_inputs(self.parts[wildcards.model])

    def params(self, wildcards: Any) -> list[dict[str, Any]]:
        return point_parts(self.parts[wildcards.model], self.fractions.get(wildcards.model),
                           wildcards.model in self.nulls)

    def resource(self, name: str, combine: Any) -> Any:
        """Resource ``name`` of a sweep point's job: ``combine`` (max, sum) of its parts'."""
        return lambda wildcards, attempt: part_resource(self.parts[wildcards.model], name, combine, attempt)
