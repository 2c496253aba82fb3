"""The analyses as declared, once each: ``workflow/analyses/<rule>.yaml`` (docs/workflow.md,
"Declaring an analysis").

One file per analysis rule, named as the rule; its entries are the rule's analyses in the
order its job runs them (format and meaning of each key: ``workflow/schemas/analyses.schema.yaml``).
A rule with several analyses is a *family*: one job per model runs them in one process
(:func:`posmech.pipeline.runner.run_family`), each output named ``<analysis>__<key>``; a rule
of its own has one analysis, named as the rule, and plain output keys.

Everything else is derived from the declarations, here and in the floors above:

* :data:`FAMILIES` (family rule → its analyses) and :data:`LINKS` (what an analysis reads
  from an earlier analysis of its job), :func:`rule_of`;
* the rule files' outputs and their inputs from other rules (:func:`rule_outputs`,
  :func:`rule_inputs`; ``workflow/rules/common.smk``: ``declared_outputs``/``declared_inputs``);
* which rule runs on which model (:data:`posmech.pipeline.applicability.RULES`: an analysis's
  ``needs``, and the analyses it reads);
* the findings' quantities, predicates and thresholds (:func:`claims`;
  :mod:`posmech.verdicts.findings` joins them with the sentences of ``resources/findings.yaml``).

Data only (the files are read once, at import): any floor may read it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from posmech.core.errors import PosmechError
from posmech.core.io import REPO

#: where the declarations are: one YAML file per analysis rule
DECLARATIONS = REPO / "workflow" / "analyses"
#: their format
SCHEMA = REPO / "workflow" / "schemas" / "analyses.schema.yaml"
#: separates an analysis's name from its own key in a family rule's outputs and inputs
SEP = "__"


@dataclass(frozen=True)
class Output:
    """One file an analysis writes: ``path`` (with ``{model}``); a file the report shows has
    a ``caption`` (``workflow/report/<caption>.rst``), the report's ``category`` (the claim
    family) and ``section`` (its subcategory)."""

    path: str
    caption: str | None = None
    category: str | None = None
    section: str | None = None


@dataclass(frozen=True)
class Claim:
    """How an analysis's scorecard judges one claim's finding: the row's ``quantity``, how a
    list or mapping value becomes one number (``aggregate``), and ``value predicate
    threshold`` (``threshold``: a key of the config section ``findings``) means "holds"."""

    claim: str
    quantity: str
    predicate: str
    threshold: str
    aggregate: str | None = None


@dataclass(frozen=True)
class Analysis:
    """One declared analysis (``workflow/analyses/<rule>.yaml``, entry ``name``)."""

    name: str
    rule: str
    does: str
    needs: tuple[str, ...] = ()
    #: input name → (analysis, output key) it reads
    reads: dict[str, tuple[str, str]] = field(default_factory=dict)
    outputs: dict[str, Output] = field(default_factory=dict)
    claims: dict[str, Claim] = field(default_factory=dict)
    category: str | None = None
    source: str = ""
    #: the config section it reads, and the keys of its own there: ``{key: JSON schema}``
    section: str = ""
    config: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: the keys of the config section ``findings`` that only its claims use
    thresholds: dict[str, dict[str, Any]] = field(default_factory=dict)

    def key(self, output: str) -> str:
        """The rule's name of this analysis's output ``output``: ``<analysis>__<output>`` in a
        family rule, ``output`` in a rule of its own."""
        return output if self.name == self.rule else f"{self.name}{SEP}{output}"

    @property
    def after(self) -> tuple[str, ...]:
        """The analyses it reads, in the order of its inputs (each once)."""
        return tuple(dict.fromkeys(a for a, _ in self.reads.values()))


def _entry(rule: str, name: str, e: dict[str, Any], where: str) -> Analysis:
    category = e.get("category")
    outputs = {}
    for key, spec in e["outputs"].items():
        if isinstance(spec, str):
            outputs[key] = Output(spec)
        elif category is None:
            raise PosmechError(f"{where}: {name}.outputs.{key} is shown in the report but {name} has no `category` "
                               "(the claim family whose section shows it: P, L, K, C or S)")
        else:
            outputs[key] = Output(spec["path"], spec["caption"], category, spec["section"])
    reads = {}
    for inp, ref in e.get("reads", {}).items():
        analysis, _, key = ref.partition(".")
        reads[inp] = (analysis, key)
    claims = {c: Claim(c, v["quantity"], v["predicate"], v["threshold"], v.get("aggregate"))
              for c, v in e.get("claims", {}).items()}
    return Analysis(name, rule, " ".join(e["does"].split()), tuple(e.get("needs", ())), reads, outputs, claims,
                    category, where, e.get("section", rule), dict(e.get("config", {})), dict(e.get("thresholds", {})))


def read_declarations(folder: str | os.PathLike[str] = DECLARATIONS,
                      schema: str | os.PathLike[str] = SCHEMA) -> dict[str, Analysis]:
    """Every analysis of ``folder/<rule>.yaml``, validated: ``{name: Analysis}`` in the order
    of the files (by name) and of their entries. Raises :class:`PosmechError` naming the file
    and the entry: a schema error, an analysis declared twice, a read of an undeclared
    analysis or output, a read of a later analysis of the same job, a claim scored by two
    analyses, two analyses of a rule reading one input name from different outputs."""
    import jsonschema

    folder = Path(folder)
    files = sorted(folder.glob("*.yaml"))
    if not files:
        raise PosmechError(f"no analysis declarations in {str(folder)!r} (workflow/analyses/<rule>.yaml)")
    sch = yaml.safe_load(Path(schema).read_text(encoding="utf-8"))
    out: dict[str, Analysis] = {}
    for f in files:
        where = f"workflow/analyses/{f.name}" if folder == DECLARATIONS else str(f)
        try:
            doc = yaml.safe_load(f.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as err:
            raise PosmechError(f"cannot read {where}: {err}") from None
        errors = sorted(jsonschema.Draft202012Validator(sch).iter_errors(doc), key=lambda e: list(map(str, e.path)))
        if errors:
            e = errors[0]
            raise PosmechError(f"{where} at {'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message} "
                               "(format: workflow/schemas/analyses.schema.yaml)")
        rule = f.stem
        if len(doc) == 1 and next(iter(doc)) != rule:
            raise PosmechError(f"{where}: a rule of its own declares one analysis named as the rule ({rule!r}), "
                               f"not {next(iter(doc))!r}")
        if len(doc) > 1 and rule in doc:
            raise PosmechError(f"{where}: a family rule's analyses are named apart from the rule ({rule!r})")
        for name, e in doc.items():
            if name in out:
                raise PosmechError(f"{where}: analysis {name} is declared in {out[name].source} too; keep one")
            out[name] = _entry(rule, name, e, where)
    _check(out)
    return out


def _check(analyses: dict[str, Analysis]) -> None:
    scored: dict[str, str] = {}
    order = list(analyses)
    for a in analyses.values():
        for inp, (src, key) in a.reads.items():
            up = analyses.get(src)
            if up is None or key not in up.outputs:
                raise PosmechError(f"{a.source}: {a.name}.reads.{inp} names {src}.{key}, which no analysis declares "
                                   "as an output")
            if up.rule == a.rule and order.index(src) >= order.index(a.name):
                raise PosmechError(f"{a.source}: {a.name} reads {src}.{key}, which its job runs after it; "
                                   "declare the analyses in the order they run")
        for c in a.claims:
            if c in scored:
                raise PosmechError(f"{a.source}: claim {c} is scored by {scored[c]} and {a.name}; keep one")
            scored[c] = a.name
    for rule in {a.rule for a in analyses.values()}:
        rule_inputs(rule, analyses)  # the shared input names agree


def rule_analyses(analyses: dict[str, Analysis] | None = None) -> dict[str, tuple[str, ...]]:
    """``{rule: its analyses in order}`` for every analysis rule."""
    out: dict[str, tuple[str, ...]] = {}
    for a in (ANALYSES if analyses is None else analyses).values():
        out[a.rule] = (*out.get(a.rule, ()), a.name)
    return out


def rule_of(analysis: str) -> str:
    """The Snakemake rule that runs ``analysis``: its family's, else its own name."""
    a = ANALYSES.get(analysis)
    return a.rule if a is not None else analysis


def rule_outputs(rule: str, analyses: dict[str, Analysis] | None = None) -> dict[str, Output]:
    """The outputs of rule ``rule`` as its analyses declare them, under the rule's keys, in
    order (every analysis's outputs in turn)."""
    analyses = ANALYSES if analyses is None else analyses
    out = {a.key(k): o for a in analyses.values() if a.rule == rule for k, o in a.outputs.items()}
    if not out:
        raise PosmechError(f"rule {rule!r} declares no analysis (workflow/analyses/{rule}.yaml)")
    return out


def rule_inputs(rule: str, analyses: dict[str, Analysis] | None = None) -> dict[str, tuple[str, str]]:
    """The inputs of rule ``rule`` that are other rules' outputs: ``{input name: (that rule,
    its output key)}``, the union of what its analyses read from analyses of other rules (a
    family's analyses share an input name, so each name must name one output)."""
    analyses = ANALYSES if analyses is None else analyses
    out: dict[str, tuple[str, str]] = {}
    for a in analyses.values():
        if a.rule != rule:
            continue
        for inp, (src, key) in a.reads.items():
            up = analyses[src]
            if up.rule == rule:
                continue
            ref = (up.rule, up.key(key))
            if out.setdefault(inp, ref) != ref:
                raise PosmechError(f"{a.source}: input {inp!r} of rule {rule} is {out[inp][1]} of rule {out[inp][0]} "
                                   f"for one analysis and {ref[1]} of rule {ref[0]} for {a.name}; name them apart")
    return out


def claims(analyses: dict[str, Analysis] | None = None) -> dict[str, tuple[Analysis, Claim]]:
    """``{claim: (the analysis that scores it, how)}`` for every declared claim."""
    analyses = ANALYSES if analyses is None else analyses
    return {c: (a, cl) for a in analyses.values() for c, cl in a.claims.items()}


#: every declared analysis, ``{name: Analysis}`` (:func:`read_declarations`)
ANALYSES: dict[str, Analysis] = read_declarations()

#: the family rules (several analyses, one job per model) and their analyses, in order
FAMILIES: dict[str, tuple[str, ...]] = {r: names for r, names in rule_analyses().items() if names != (r,)}

#: the inputs of each analysis that read an output of an analysis run before it in its
#: family's job: ``{analysis: {its input name: "<earlier analysis>__<output key>"}}``
#: (:func:`posmech.pipeline.runner.analysis_view`); an analysis not listed reads only its rule's inputs
LINKS: dict[str, dict[str, str]] = {
    a.name: links for a in ANALYSES.values()
    if (links := {inp: ANALYSES[src].key(key) for inp, (src, key) in a.reads.items() if ANALYSES[src].rule == a.rule})
}


def compose_schema(schema: dict[str, Any], analyses: dict[str, Analysis] | None = None) -> dict[str, Any]:
    """The config schema with the keys the analyses declare (``config``: in the analysis's
    section, which is added as an object of those keys when the schema lacks it;
    ``thresholds``: in section ``findings``), a new dict (``schema`` is not changed). Raises
    :class:`PosmechError` naming both places when a key is declared twice, and naming the
    declaration when a claim's threshold is no key of section ``findings`` (a misspelt key
    stops every run before any job, never only the findings job)."""
    import copy

    analyses = ANALYSES if analyses is None else analyses
    out = copy.deepcopy(schema)
    props = out.setdefault("properties", {})
    where: dict[tuple[str, str], str] = {}
    for a in analyses.values():
        for section, keys in ((a.section, a.config), ("findings", a.thresholds)):
            if not keys:
                continue
            sec = props.setdefault(section, {
                "type": "object", "additionalProperties": False, "default": {},
                "description": f"The keys of analysis {a.name} ({a.source}).", "properties": {}})
            sec_props = sec.setdefault("properties", {})
            for key, spec in keys.items():
                if key in sec_props:
                    other = where.get((section, key), "workflow/schemas/config.schema.yaml")
                    raise PosmechError(f"config key `{section}.{key}` is declared twice: in {a.source} and in {other}; "
                                       "keep one")
                sec_props[key] = copy.deepcopy(spec)
                where[(section, key)] = a.source
    thresholds = props.get("findings", {}).get("properties", {})
    for a in analyses.values():
        for c in a.claims.values():
            if c.threshold not in thresholds:
                raise PosmechError(f"{a.source}: claim {c.claim}'s threshold `{c.threshold}` is not a key of the config "
                                   f"section `findings`; declare it under {a.name}'s `thresholds:` (or fix the name: "
                                   f"the keys are {', '.join(sorted(thresholds))})")
    return out


#: the per-head tables the head-roles table gathers (rule head_table, :mod:`posmech.verdicts.heads`):
#: ``{its input name: "<analysis>__<output key>"}``, an output of the analysis's family rule,
#: read for the models the family runs on
HEAD_TABLE_SOURCES: dict[str, str] = {
    "taxonomy": "diagonal_taxonomy__table",
    "chosen": "diagonal_taxonomy__heads",
    "taxa": "score_taxa__table",
    "etc": "etc_table__table",
    "classes": "layer0_head_classes__table",
    "roles": "random_token_patterns__heads",
    "masses": "random_token_patterns__masses",
    "sinks": "attention_sinks__table",
}
