"""What the docs say about the analyses, written from their declarations.

Each analysis is declared once, in ``workflow/analyses/<rule>.yaml``
(:mod:`posmech.core.families`); which one runs on which model follows from it
(:mod:`posmech.pipeline.applicability`). The docs' tables of analyses are written from
those declarations by this module, never by hand: each sits between the marker lines
``<!-- generated: NAME -->`` and ``<!-- end generated -->`` (as ``config/README.md``'s key
tables, :mod:`posmech.settings.reference`); the prose around them is the docs' own. The
blocks (:data:`BLOCKS`):

* ``families`` — each family rule, its analyses in the order its job runs them, the claims
  they judge (``docs/workflow.md``, "Families");
* ``analyses`` — every analysis: its rule, what it does (``does``), its claims;
* ``requirements`` — each requirement an analysis can have of a model
  (:data:`~posmech.pipeline.applicability.REQUIREMENTS`): what meets it, the reason in
  words when a model does not ("What runs on which model");
* ``applicability`` — every analysis: what it needs of a model, the analyses it reads, and
  what it needs with them;
* ``outputs.NAME[+NAME…]`` — the files of the analyses of each named rule or analysis: path,
  the rule's output name, the report's section and caption (``docs/artifacts.md``; every
  analysis must be shown by one such block);
* ``claims`` — every claim: the analysis whose scorecard quantity judges its finding, the
  predicate and the threshold, the analyses whose scorecards hold its published values
  (``resources/published.yaml``'s ``rule``), what a model must have (``docs/claims.md``).

``python -m posmech.pipeline.reference --write`` (``make docs``, which also runs
``make config-doc``) rewrites the blocks of ``README.md`` and ``docs/*.md``; ``--check``
exits 1 naming the files that differ from what the declarations give
(``tests/test_docs_generated.py`` fails the same way).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from posmech.core.errors import PosmechError
from posmech.core.families import ANALYSES, DECLARATIONS, Analysis, claims, rule_analyses
from posmech.core.io import REPO
from posmech.models.architecture import SCHEME_WORDS
from posmech.pipeline.applicability import INTERLEAVED_TYPES, REQUIREMENTS, Requirement
from posmech.core.generated import END, changed, fill_blocks
from posmech.core.generated import main as generator_main

#: the files whose marked blocks this module writes
DOCS: tuple[Path, ...] = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")))
#: the command that writes them (named by every staleness message)
COMMAND = "make docs  (python -m posmech.pipeline.reference --write)"
#: the blocks that must each appear once in the docs (besides one ``outputs.…`` per analysis)
BLOCKS = ("families", "analyses", "requirements", "applicability", "claims")
OUTPUTS = "outputs."
#: blocks of :mod:`posmech.pipeline.demo_numbers` (written from a run, not from the declarations)
NUMBERS_PREFIX = "numbers."
PREDICATES = {">=": "≥", "<=": "≤", ">": ">", "<": "<", "==": "="}
CLAIM = re.compile(r"^([PLKCS])(\d+)$")
NONE = "—"


# --------------------------------------------------------------------------- small pieces
def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _names(names: Iterable[str]) -> str:
    """```a`, `b``` or — when there are none."""
    out = [f"`{n}`" for n in names]
    return ", ".join(out) if out else NONE


def claim_key(claim: str) -> tuple[int, int, str]:
    """The order of claims: P, L, K, C, S, then by number."""
    m = CLAIM.match(claim)
    return ("PLKCS".index(m.group(1)), int(m.group(2)), "") if m else (5, 0, claim)


def claim_ranges(ids: Iterable[str]) -> str:
    """``P1, P8–P11, P12, P13``: claim IDs in order, three or more consecutive numbers of a
    family as a range."""
    runs: list[list[str]] = []
    for c in sorted(set(ids), key=claim_key):
        prev = runs[-1][-1] if runs else ""
        if CLAIM.match(c) and CLAIM.match(prev) and claim_key(prev)[:2] == (claim_key(c)[0], claim_key(c)[1] - 1):
            runs[-1].append(c)
        else:
            runs.append([c])
    parts: list[str] = []
    for run in runs:
        parts += run if len(run) < 3 else [f"{run[0]}–{run[-1]}"]
    return ", ".join(parts) if parts else NONE


def upstream(name: str, analyses: Mapping[str, Analysis]) -> list[str]:
    """Every analysis ``name`` reads, directly or through what it reads, nearest first."""
    out: list[str] = []
    todo = list(analyses[name].after)
    while todo:
        a = todo.pop(0)
        if a not in out:
            out.append(a)
            todo += list(analyses[a].after)
    return out


def all_needs(name: str, analyses: Mapping[str, Analysis]) -> list[str]:
    """What analysis ``name`` needs of a model, its own ``needs`` and those of every analysis
    it reads (a model that fails one cannot run it: :func:`posmech.pipeline.applicability.why_not`)."""
    return list(dict.fromkeys(r for a in (name, *upstream(name, analyses)) for r in analyses[a].needs))


# --------------------------------------------------------------------------- the tables
def families_table(analyses: Mapping[str, Analysis]) -> list[str]:
    """``families``: one row per family rule (several analyses, one job per model)."""
    rows = ["| family | analyses, in the order its job runs them | claims they judge |", "|---|---|---|"]
    for rule, names in rule_analyses(dict(analyses)).items():
        if names != (rule,):
            judged = [c for n in names for c in analyses[n].claims]
            rows.append(f"| `{rule}` | {_names(names)} | {claim_ranges(judged)} |")
    return rows


def analyses_table(analyses: Mapping[str, Analysis]) -> list[str]:
    """``analyses``: one row per analysis, with its rule, what it does and its claims."""
    rows = ["| analysis | rule | what it does | claims it judges |", "|---|---|---|---|"]
    for a in analyses.values():
        rule = f"`{a.rule}`" if a.rule != a.name else "its own"
        rows.append(f"| `{a.name}` | {rule} | {_cell(a.does)} | {claim_ranges(a.claims)} |")
    return rows


def met_by(req: Requirement) -> str:
    """What a model must be to meet ``req``, in words, from its tests."""
    parts = []
    if req.schemes is not None:
        parts.append("position scheme " + " or ".join(f"`{s}` ({SCHEME_WORDS.get(s, s)})" for s in req.schemes))
    if req.engine_for is not None:
        parts.append("the posmech engine runs it (`engine_refusal` null, decided from its config by the engine) for "
                     "position schemes " + ", ".join(f"`{s}`" for s in req.engine_for)
                     + " (another scheme: whatever runs it)")
    if req.mlp:
        parts.append("an MLP in each block (`has_mlp`)")
    if req.pre_ln:
        parts.append("a LayerNorm before each block (`post_ln` false)")
    if req.rotary_pairs:
        parts.append("a rotary pair order that is told (`rotary_interleaved` not null), interleaved pairs only on "
                     "a model type the posmech engine rotates so (" + ", ".join(f"`{t}`" for t in INTERLEAVED_TYPES)
                     + ")")
    if req.plain_scores:
        parts.append("scores not soft-capped (`score_softcap` null)")
    return "; ".join(parts) or "any model"


def reason_text(req: Requirement) -> str:
    """``req``'s reason as written, its blanks shown as code: ``{positions}`` (the model's
    position scheme in words), ``{model_type}``, ``{unmet}``."""
    return re.sub(r"\{(\w+)\}", r"`{\1}`", req.reason)


def requirements_table(requirements: Mapping[str, Requirement]) -> list[str]:
    """``requirements``: one row per requirement of :data:`~posmech.pipeline.applicability.REQUIREMENTS`."""
    rows = ["| requirement | met by | reason when not (filled in for the model) |", "|---|---|---|"]
    for name, req in requirements.items():
        rows.append(f"| `{name}` | {_cell(met_by(req))} | \"{_cell(reason_text(req))}\" |")
    return rows


def applicability_table(analyses: Mapping[str, Analysis]) -> list[str]:
    """``applicability``: what each analysis needs of a model, what it reads, and so what it
    needs in all."""
    rows = ["| analysis | needs of a model | reads the outputs of | so it runs on models with |", "|---|---|---|---|"]
    for a in analyses.values():
        every = all_needs(a.name, analyses)
        rows.append(f"| `{a.name}` | {_names(a.needs)} | {_names(a.after)} | "
                    f"{_names(every) if every else 'any model'} |")
    return rows


def outputs_table(analyses: Mapping[str, Analysis], names: list[str]) -> tuple[list[str], list[str]]:
    """``outputs.NAME+…``: one row per file the analyses of ``names`` (rules or analyses)
    write, and those analyses. Raises :class:`PosmechError` on a name that is neither."""
    shown: list[str] = []
    for name in names:
        match = [a.name for a in analyses.values() if name in (a.rule, a.name)]
        if not match:
            raise PosmechError(f"`<!-- generated: {OUTPUTS}{'+'.join(names)} -->`: no analysis or rule {name!r} is "
                               f"declared ({DECLARATIONS.relative_to(REPO)}/<rule>.yaml)")
        shown += [a for a in match if a not in shown]
    rows = ["| file | analysis | output (`rule.name`) | in the report (section; caption) |", "|---|---|---|---|"]
    for name in shown:
        a = analyses[name]
        for key, o in a.outputs.items():
            report = (f"{_cell(o.section or '')}; `workflow/report/{o.caption}.rst`" if o.caption
                      else ("scorecard rows (rule `findings`, the report's scorecard)" if key == "scorecard" else NONE))
            rows.append(f"| `{o.path}` | `{a.name}` | `{a.rule}.{a.key(key)}` | {report} |")
    return rows, shown


def holds_when(a: Analysis, claim: str, thresholds: Mapping[str, Any]) -> str:
    """``min(diagonal_ratio) ≤ findings.p7_max_sharpest_ratio (0.1)``: how a finding holds."""
    c = a.claims[claim]
    quantity = f"{c.aggregate}({c.quantity})" if c.aggregate else c.quantity
    default = f" (default {thresholds[c.threshold]})" if c.threshold in thresholds else ""
    return f"`{quantity}` {PREDICATES[c.predicate]} `findings.{c.threshold}`{default}"


def against_null(a: Analysis, claim: str, thresholds: Mapping[str, Any], structural: Mapping[str, str]) -> str:
    """``beats its twin by ≥ 0.025``, or ``structural``: what a finding needs of its null
    (:func:`posmech.verdicts.findings.against_null`)."""
    if claim in structural:
        return "structural: holds on any model by construction (shown apart)"
    c = a.claims[claim]
    if c.threshold not in thresholds or "null_margin" not in thresholds:
        return "beats its twin by `findings.null_margin` × \\|threshold\\|"
    side = {">=": "above", ">": "above", "<=": "below", "<": "below"}.get(c.predicate, "away from")
    m = float(thresholds["null_margin"]) * abs(float(thresholds[c.threshold]))
    return f"{side} its twin's by ≥ {m:.4g}"


def claims_table(analyses: Mapping[str, Analysis], thresholds: Mapping[str, Any],
                 published: Mapping[str, list[str]], structural: Mapping[str, str] | None = None) -> list[str]:
    """``claims``: one row per claim an analysis judges. ``thresholds``: the ``findings``
    keys' defaults; ``published``: per claim, the analyses named as ``rule`` by its published
    values (``resources/published.yaml``); ``structural``: the findings that hold by
    construction (``resources/findings.yaml``), not read against the twin."""
    rows = ["| claim | its finding is judged by | holds when | and against the null (default margin) | "
            "its published values also from | needs of a model |", "|---|---|---|---|---|---|"]
    judged = claims(dict(analyses))
    for claim in sorted(judged, key=claim_key):
        a, _ = judged[claim]
        rule = f" (rule `{a.rule}`)" if a.rule != a.name else ""
        also = [r for r in published.get(claim, []) if r != a.name]
        every = all_needs(a.name, analyses)
        rows.append(f"| {claim} | `{a.name}`{rule} | {holds_when(a, claim, thresholds)} | "
                    f"{against_null(a, claim, thresholds, structural or {})} | {_names(also)} | "
                    f"{_names(every) if every else 'any model'} |")
    return rows


# --------------------------------------------------------------------------- the docs
class Sources:
    """What the blocks are written from: the analyses, the requirements, the ``findings``
    thresholds' defaults, the rules named by the published values."""

    def __init__(self, analyses: Mapping[str, Analysis] | None = None,
                 requirements: Mapping[str, Requirement] | None = None,
                 thresholds: Mapping[str, Any] | None = None,
                 published: Mapping[str, list[str]] | None = None) -> None:
        self.analyses = ANALYSES if analyses is None else analyses
        self.requirements = REQUIREMENTS if requirements is None else requirements
        if thresholds is None:
            thresholds = default_thresholds(self.analyses)
        self.thresholds = thresholds
        self.published = published_rules() if published is None else published

    def block(self, name: str) -> tuple[list[str], list[str]]:
        """The lines of block ``name`` and the analyses whose files it shows."""
        if name.startswith(OUTPUTS):
            return outputs_table(self.analyses, name.removeprefix(OUTPUTS).split("+"))
        tables: dict[str, Callable[[], list[str]]] = {
            "families": lambda: families_table(self.analyses),
            "analyses": lambda: analyses_table(self.analyses),
            "requirements": lambda: requirements_table(self.requirements),
            "applicability": lambda: applicability_table(self.analyses),
            "claims": lambda: claims_table(self.analyses, self.thresholds, self.published, structural_findings()),
        }
        if name not in tables:
            raise PosmechError(f"`<!-- generated: {name} -->`: no such block (posmech.pipeline.reference: "
                               f"{', '.join(BLOCKS)}, {OUTPUTS}<rule or analysis>[+…])")
        return tables[name](), []


def default_thresholds(analyses: Mapping[str, Analysis]) -> dict[str, Any]:
    """The defaults of the config section ``findings``: the schema's, and those the analyses
    declare (``thresholds``)."""
    from posmech.core.config import load_schema
    from posmech.settings import SCHEMA_PATH

    props = load_schema(SCHEMA_PATH).get("properties", {}).get("findings", {}).get("properties", {})
    out = {k: v["default"] for k, v in props.items() if "default" in v}
    for a in analyses.values():
        out.update({k: v["default"] for k, v in a.thresholds.items() if "default" in v})
    return out


def structural_findings(path: Path = REPO / "resources" / "findings.yaml") -> dict[str, str]:
    """``{claim: why}`` of the findings that hold on any model by construction."""
    import yaml

    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    return {str(e["claim"]): str(e["structural"]) for e in doc.get("findings", []) if e.get("structural")}


def published_rules(path: Path = REPO / "resources" / "published.yaml") -> dict[str, list[str]]:
    """Per claim, the analyses that ``resources/published.yaml`` names as ``rule``."""
    from posmech.verdicts.scorecard import load_published

    out: dict[str, list[str]] = {}
    for e in load_published(path):
        if e.rule and e.rule not in out.setdefault(e.claim, []):
            out[e.claim].append(e.rule)
    return out


def fill(text: str, sources: Sources, where: str = "") -> tuple[str, list[str], list[str]]:
    """``text`` with every marked block written from ``sources``; the names of its blocks and
    the analyses whose files they show."""
    names: list[str] = []
    shown: list[str] = []

    def block(name: str) -> list[str] | None:
        if name.startswith(NUMBERS_PREFIX):  # the demo run's numbers: posmech.pipeline.demo_numbers
            return None
        table, files_of = sources.block(name)
        names.append(name)
        shown.extend(files_of)
        return table

    return fill_blocks(text, where, block), names, shown


def written(sources: Sources | None = None, docs: Iterable[Path] = DOCS) -> dict[Path, str]:
    """Each doc with a marked block and the text the declarations give it. Raises
    :class:`PosmechError` when a block of :data:`BLOCKS` is missing or doubled, or an analysis's
    files are in no ``outputs.…`` block."""
    sources = sources or Sources()
    out: dict[Path, str] = {}
    names: list[str] = []
    shown: list[str] = []
    for path in docs:
        text = path.read_text(encoding="utf-8")
        where = str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)
        new, blocks, files_of = fill(text, sources, where)
        if blocks:
            out[path] = new
        names += blocks
        shown += files_of
    for block in BLOCKS:
        if names.count(block) != 1:
            raise PosmechError(f"the docs hold {names.count(block)} blocks `<!-- generated: {block} -->` (README.md, "
                               "docs/*.md); keep exactly one")
    missing = [a for a in sources.analyses if a not in shown]
    if missing:
        raise PosmechError(f"docs/artifacts.md: no block shows the files of {missing}: add "
                           f"`<!-- generated: {OUTPUTS}<rule> -->` ... `{END}` to the section of their outputs")
    return out


def stale(sources: Sources | None = None) -> list[Path]:
    """The docs whose blocks differ from what the declarations give."""
    return changed(written(sources))


def main(argv: list[str] | None = None) -> int:
    return generator_main(argv, "python -m posmech.pipeline.reference", __doc__, written,
                          "the generated tables of README.md and docs/*.md", "workflow/analyses/*.yaml", COMMAND)


if __name__ == "__main__":
    sys.exit(main())
