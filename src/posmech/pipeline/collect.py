"""The outputs a run wants, named once: the ``collect`` lines of the stage files.

A path is named once, in its rule's ``output:``. Every stage file ends with one
``collect(rules.<rule>, <wildcard>=[values], ...)`` line per rule whose outputs the run
wants (``workflow/rules/common.smk`` binds ``collect`` to :meth:`Collector.add`); ``rule
all``, the report's inputs and the scorecard collection all derive from those rules'
outputs (docs/workflow.md):

- every output: a target of ``rule all`` (and runs before the report);
- the output named ``scorecard`` (``<analysis>__scorecard`` in a family rule): a scorecard
  the report reads, which must be ``results/{model}/scorecard/<analysis>.csv``;
- ``report(...)`` outputs ending in a figure suffix: figures of the HTML report (caption
  and category reused);
- ``report(...)`` outputs ending in ``.csv`` / ``.tsv``: tables of the HTML report (unless
  the rule was collected with ``report_tables=False``).

The rules are Snakemake ``Rule`` objects (``rules.<name>.rule``); nothing here names a rule.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any

from posmech.core.errors import PosmechError
from posmech.pipeline.sweep import FIGURE_SUFFIXES, is_figure

TABLE_SUFFIXES = (".csv", ".tsv")
#: separates an analysis's name from its own key in a family rule's outputs
SEP = "__"


def analysis_of(step: Any, key: str) -> str:
    """The analysis an output key of rule ``step`` belongs to."""
    return key.split(SEP, 1)[0] if SEP in key else step.name


def analyses_of(step: Any) -> dict[str, str]:
    """``{analysis: output key prefix}`` of a rule: a family rule (docs/workflow.md,
    "Families") names each output ``<analysis>__<key>``; any other rule is one analysis,
    its own name, with unprefixed keys."""
    found = {analysis_of(step, key): f"{analysis_of(step, key)}{SEP}" for key in step.output.keys() if SEP in key}
    return found or {step.name: ""}


def report_kind(path: str, key: str, f: Any, report_tables: bool) -> str | None:
    """``scorecard``, ``figure``, ``table`` or None for one collected output."""
    if key == "scorecard" or key.endswith(SEP + "scorecard"):
        return "scorecard"
    if f.flags.get("report") is None:
        return None
    if path.endswith(FIGURE_SUFFIXES):
        return "figure"
    if path.endswith(TABLE_SUFFIXES) and report_tables:
        return "table"
    return None


class Collector:
    """The collected rules of one workflow, in the order of their ``collect`` lines.

    ``families``: :data:`posmech.core.families.FAMILIES`; ``runs_on(analysis, models)``: the
    models an analysis can run on (applicability, and on a checkpoint only what the sweep
    follows); ``checkpoint_of``: ``{checkpoint: its model}`` (a checkpoint's figures are
    not made: its sweep point draws none, :mod:`posmech.pipeline.sweep`); ``figureless``: other
    models whose analyses run as one job without figures (the random-init twins, config
    ``twins.figures: false``), whose figures are not made either, though their scorecards
    and tables count as a final model's. ``omitted``: the rules the run leaves out
    (``--omit-from``, :func:`posmech.pipeline.sweep.omitted_rules`): their outputs are not
    collected for those models, whose one job does not run them (a twin runs what its model runs;
    for the other models Snakemake leaves them out)."""

    def __init__(self, families: Mapping[str, tuple[str, ...]],
                 runs_on: Callable[[str, list[str]], list[str]], checkpoint_of: Mapping[str, str],
                 figureless: Collection[str] = (), omitted: Collection[str] = ()) -> None:
        self.families, self.runs_on, self.checkpoint_of = families, runs_on, checkpoint_of
        self.figureless = set(figureless) | set(checkpoint_of)
        self.omitted = frozenset(omitted)
        #: ``(rule, [wildcards of each job], report_tables)``
        self.entries: list[tuple[Any, list[dict[str, str]], bool]] = []

    def add(self, proxy: Any, when: bool = True, report_tables: bool = True, **values: Any) -> None:
        """Register ``proxy`` (``rules.<name>``) for the run, once for every combination
        of the wildcard values given (``model=[...]``, ``corpus=[...]``; one list per
        wildcard of its outputs), or once for a rule without wildcards; nothing when
        ``when`` is false. Models the rule cannot run on are left out."""
        step = getattr(proxy, "rule", proxy)
        wildcards = set(step.wildcard_names or ())
        if set(values) != wildcards:
            raise PosmechError(
                f"collect(rules.{step.name}): give one list of values per wildcard of its outputs "
                f"({', '.join(sorted(wildcards)) or 'none'}), got {', '.join(sorted(values)) or 'none'}")
        named = sum(len(v) if isinstance(v, list) else 1 for _, v in step.output.items())
        if named != len(step.output):
            raise PosmechError(f"name every output of rule {step.name} (key=path) so that it can be collected")
        self._check_family(step)
        if "model" in values:  # a rule that cannot run on a model is not scheduled for it
            values = {**values, "model": self.family_runs_on(step, list(values["model"]))}
        jobs = [dict(zip(values, combo)) for combo in itertools.product(*values.values())]
        self.entries.append((step, jobs if when else [], report_tables))

    def _check_family(self, step: Any) -> None:
        from snakemake.io import strip_wildcard_constraints

        names = analyses_of(step)
        if list(names) != [step.name] and tuple(names) != self.families.get(step.name):
            raise PosmechError(
                f"the outputs of rule {step.name} name the analyses {', '.join(names)}; "
                "posmech.core.families.FAMILIES must list the same, in the same order "
                f"(it lists {', '.join(self.families.get(step.name, ())) or 'none'})")
        for analysis, key in names.items():
            scorecard = step.output.get(f"{key}scorecard")
            expected = f"results/{{model}}/scorecard/{analysis}.csv"
            if scorecard is not None and strip_wildcard_constraints(str(scorecard)) != expected:
                raise PosmechError(
                    f"the scorecard output of analysis {analysis} (rule {step.name}) must be {expected!r} "
                    "(the report finds the analysis of a scorecard row by the file name)")

    def family_runs_on(self, step: Any, models: list[str]) -> list[str]:
        """The models of ``models`` that every analysis of rule ``step`` can run on; a family
        runs on a model all or not at all (posmech.pipeline.applicability.family_problems: its
        analyses' requirements must agree; tested on every architecture)."""
        names = list(analyses_of(step))
        out = []
        for m in models:
            runs = [a for a in names if self.runs_on(a, [m])]  # an analysis not in the table runs
            if len(runs) == len(names):
                out.append(m)
            elif runs:
                raise PosmechError(
                    f"on model {m}, of the analyses of rule {step.name}, {', '.join(runs)} can run and "
                    f"{', '.join(a for a in names if a not in runs)} cannot: a family runs all its analyses or "
                    "none (posmech.pipeline.applicability: give them the same requirements)")
        return out

    def outputs(self) -> Iterator[tuple[str, Any, dict[str, str], str, Any, bool]]:
        """``(path, rule, wildcards, key, iofile, report_tables)`` of every collected output,
        in the order of the ``collect`` lines; a checkpoint's (and a figureless model's)
        figures are left out."""
        from snakemake.io import apply_wildcards

        for step, jobs, report_tables in self.entries:
            for wc in jobs:
                if step.name in self.omitted and wc.get("model") in self.figureless:
                    continue
                for key, files in step.output.items():
                    for f in files if isinstance(files, list) else [files]:
                        path = apply_wildcards(str(f), wc)
                        if wc.get("model") in self.figureless and is_figure(path):
                            continue
                        yield path, step, wc, key, f, report_tables

    def collected(self, kind: str | None = None, of: str | None = None, checkpoints: bool = True,
                  models: list[str] | None = None) -> list[str]:
        """Collected paths (no duplicates, in order): every one, or those of ``kind``
        (``scorecard``, ``figure``, ``table``), or those of the rule named ``of``;
        ``checkpoints=False``: not those of checkpoints (the findings grid and the report
        show the models; the dynamics sweep's points are shown by the dynamics rule); with
        ``models``, only those of jobs of these models."""
        out = [
            path for path, r, wc, key, f, tables in self.outputs()
            if (kind is None or report_kind(path, key, f, tables) == kind)
            and (of is None or r.name == of)
            and (checkpoints or wc.get("model") not in self.checkpoint_of)
            and (models is None or wc.get("model") in models)
        ]
        return list(dict.fromkeys(out))

    def report_flags(self) -> dict[str, dict[str, Any]]:
        """Per figure/table of the report: the producing rule, its wildcards and its
        report() caption and category (the HTML report reuses the captions of Snakemake's
        native report)."""
        out: dict[str, dict[str, Any]] = {}
        for path, step, wc, key, f, tables in self.outputs():
            if report_kind(path, key, f, tables) not in ("figure", "table") or path in out:
                continue
            flag = f.flags["report"]
            caption = flag.caption
            analysis = analysis_of(step, key)
            out[path] = {
                # what the report prints after "rule": a family's analysis says both names
                "rule": step.name if analysis == step.name else f"{step.name} (analysis {analysis})",
                "wildcards": dict(wc),
                "caption": caption.get_path_or_uri(secret_free=True) if caption else None,
                "category": flag.category,
            }
        return out
