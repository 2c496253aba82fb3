"""One name per analysis family across every room (issue 26, docs/workflow.md "Families").

For every family ``F`` of :data:`posmech.core.families.FAMILIES`: ``rule F`` in
``workflow/rules/F.smk`` (included by the Snakefile, its outputs under ``results/{model}/F/``
or the scorecards), the library ``posmech.analyses.F`` (module or package), the figures
``posmech.plots.F``, ``tests/analyses/test_F.py``, the settings ``posmech.settings.F`` (class
``FSettings``), the config section ``F`` of the schema,
its heading in ``config/README.md`` and a heading naming it in ``docs/artifacts.md``. The
posembed rules, rules of their own, share the name ``posembed`` in the same rooms; their
config sections keep the rules' names (``posembed_averaging``, ``posembed_attention``); so
does the rotary rule ``rotary_frequencies`` (rooms ``rotary``, section ``rotary_frequencies``).
The checks read the files as text (:func:`room_problems`), so that a test can show on a
made-up tree that each missing or misnamed room is found."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import yaml

from posmech.core.families import FAMILIES

REPO = Path(__file__).resolve().parents[1]

# name -> (its rules, its config sections): a family is one rule and one section of its name
POSEMBED = ("posembed_averaging", "posembed_attention")
GROUPS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    **{family: ((family,), (family,)) for family in FAMILIES},
    "posembed": (POSEMBED, POSEMBED),
    "rotary": (("rotary_frequencies",), ("rotary_frequencies",)),
}
# library modules that belong to no family (docs/workflow.md, "Families": shared helpers),
# and the figure modules of the machinery and of the rule `dynamics`
SHARED_ANALYSES = {"attention", "readout", "cache"}
OTHER_PLOTS = {"check", "dynamics"}
# tests/analyses files not under one name: the findings of every family on hand-built models
OTHER_TESTS = {"test_findings_handbuilt"}
OUTPUT_DIR = re.compile(r"""["']results/\{model\}/([^/"']+)/""")


def _rule_block(text: str, rule: str) -> str | None:
    """The text of ``rule``'s definition in a workflow file, or None when it has none."""
    m = re.search(rf"^rule {rule}:\n", text, re.M)
    if m is None:
        return None
    end = re.search(r"^\S", text[m.end():], re.M)
    return text[m.end(): m.end() + end.start() if end else len(text)]


def _headings(path: Path) -> list[str]:
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("#")]


def room_problems(repo: Path, name: str, rules: tuple[str, ...], sections: tuple[str, ...]) -> list[str]:
    """What is missing or named otherwise among the rooms of ``name`` in the tree ``repo``."""
    problems = []
    smk = repo / "workflow" / "rules" / f"{name}.smk"
    text = smk.read_text(encoding="utf-8") if smk.exists() else ""
    if not smk.exists():
        problems.append(f"no rule file workflow/rules/{name}.smk")
    elif f'include: "rules/{name}.smk"' not in (repo / "workflow" / "Snakefile").read_text(encoding="utf-8"):
        problems.append(f"workflow/Snakefile does not include rules/{name}.smk")
    for rule in rules:
        block = _rule_block(text, rule)
        if block is None:
            problems.append(f"workflow/rules/{name}.smk does not define `rule {rule}:`")
            continue
        elsewhere = sorted({m for m in OUTPUT_DIR.findall(block)} - {name, "scorecard"})
        if elsewhere:
            problems.append(f"rule {rule} writes under results/{{model}}/{', '.join(elsewhere)}/, not {name}/")
    lib = repo / "src" / "posmech" / "analyses"
    if not ((lib / f"{name}.py").exists() or (lib / name / "__init__.py").exists()):
        problems.append(f"no library src/posmech/analyses/{name}.py or package analyses/{name}/")
    if not (repo / "src" / "posmech" / "plots" / f"{name}.py").exists():
        problems.append(f"no figures src/posmech/plots/{name}.py")
    if not (repo / "tests" / "analyses" / f"test_{name}.py").exists():
        problems.append(f"no tests tests/analyses/test_{name}.py")
    schema = yaml.safe_load((repo / "workflow" / "schemas" / "config.schema.yaml").read_text(encoding="utf-8"))
    readme = _headings(repo / "config" / "README.md")
    for section in sections:
        if section not in schema["properties"]:
            problems.append(f"no config section `{section}` in workflow/schemas/config.schema.yaml")
        if not any(re.match(rf"#+ `{section}`", h) for h in readme):
            problems.append(f"no heading `{section}` in config/README.md")
    settings = repo / "src" / "posmech" / "settings" / f"{name}.py"
    text = settings.read_text(encoding="utf-8") if settings.exists() else ""
    if not settings.exists():
        problems.append(f"no settings src/posmech/settings/{name}.py")
    for section in sections:
        cls = "".join(part.capitalize() for part in section.split("_")) + "Settings"
        base = cls.removesuffix("Settings") + "Fields"  # its keys: posmech.settings.schema_fields
        if settings.exists() and not re.search(rf"^class {cls}\({base}\):", text, re.M):
            problems.append(f"src/posmech/settings/{name}.py does not define `class {cls}({base}):`")
    if not any(f"`{name}`" in h for h in _headings(repo / "docs" / "artifacts.md")):
        problems.append(f"no heading naming `{name}` in docs/artifacts.md")
    return problems


@pytest.mark.parametrize("name", sorted(GROUPS))
def test_every_room_of_a_family_goes_by_its_name(name):
    rules, sections = GROUPS[name]
    problems = room_problems(REPO, name, rules, sections)
    assert not problems, f"rooms of `{name}`: " + "; ".join(problems)
    importlib.import_module(f"posmech.analyses.{name}")
    importlib.import_module(f"posmech.plots.{name}")
    from posmech.settings import settings_class

    assert all(settings_class(s).section == s for s in sections)


def test_library_and_figure_modules_are_a_family_or_a_shared_helper():
    """No library room outside the families' names (a module left behind by a move, or one
    named after one analysis of a family), except the shared helpers docs/workflow.md names."""

    def modules(folder: Path) -> set[str]:
        return {p.stem for p in folder.glob("*.py") if p.stem != "__init__"} | {
            p.parent.name for p in folder.glob("*/__init__.py")}

    src = REPO / "src" / "posmech"
    stray = modules(src / "analyses") - set(GROUPS) - SHARED_ANALYSES
    assert not stray, f"src/posmech/analyses: {sorted(stray)} name no family (docs/workflow.md, 'Families')"
    stray = modules(src / "plots") - set(GROUPS) - OTHER_PLOTS
    assert not stray, f"src/posmech/plots: {sorted(stray)} name no family (docs/workflow.md, 'Families')"
    assert set(GROUPS) <= modules(src / "analyses") and set(GROUPS) <= modules(src / "plots")
    # the cache's section has settings too; `reference` writes `schema_fields` from the schema
    stray = modules(src / "settings") - set(GROUPS) - {"cache", "reference", "schema_fields"}
    assert not stray, f"src/posmech/settings: {sorted(stray)} name no family (docs/workflow.md, 'Settings')"


def test_every_analysis_test_file_starts_with_a_family_or_helper_name():
    names = sorted(set(GROUPS) | SHARED_ANALYSES, key=len, reverse=True)
    stray = [p.name for p in sorted((REPO / "tests" / "analyses").glob("test_*.py"))
             if p.stem not in OTHER_TESTS and not any(p.stem == f"test_{n}" or p.stem.startswith(f"test_{n}_")
                                                      for n in names)]
    assert not stray, f"tests/analyses: {stray} start with no family's name (test_<family>_<what>.py)"


def _made_up_tree(root: Path) -> Path:
    """A tree holding every room of the family ``fam`` (rule writing to results/{model}/fam/)."""
    files = {
        "workflow/Snakefile": 'include: "rules/common.smk"\ninclude: "rules/fam.smk"\n',
        "workflow/rules/fam.smk": ('rule fam:\n    output:\n        a__table="results/{model}/fam/a.csv",\n'
                                   '        a__scorecard="results/{model}/scorecard/a.csv",\n\n\n'
                                   "collect(rules.fam, model=[])\n"),
        "src/posmech/analyses/fam.py": "",
        "src/posmech/plots/fam.py": "",
        "tests/analyses/test_fam.py": "",
        "src/posmech/settings/fam.py": "class FamSettings(FamFields):\n    pass\n",
        "workflow/schemas/config.schema.yaml": "properties:\n  fam:\n    type: object\n",
        "config/README.md": "# Configuration\n\n## `fam` — the family fam\n",
        "docs/artifacts.md": "# Artifacts\n\n## Fam — `results/{model}/fam/` (family `fam`)\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    return root


BREAKS = {  # a room broken -> the words of the problem found
    "rule file": (lambda r: (r / "workflow/rules/fam.smk").rename(r / "workflow/rules/other.smk"),
                  "no rule file workflow/rules/fam.smk"),
    "include": (lambda r: (r / "workflow/Snakefile").write_text('include: "rules/common.smk"\n'),
                "does not include rules/fam.smk"),
    "rule name": (lambda r: _replace(r / "workflow/rules/fam.smk", "rule fam:", "rule fam_stage:"),
                  "does not define `rule fam:`"),
    "output folder": (lambda r: _replace(r / "workflow/rules/fam.smk", "{model}/fam/", "{model}/other/"),
                      "rule fam writes under results/{model}/other/"),
    "library": (lambda r: (r / "src/posmech/analyses/fam.py").rename(r / "src/posmech/analyses/fam_lib.py"),
                "no library src/posmech/analyses/fam.py"),
    "figures": (lambda r: (r / "src/posmech/plots/fam.py").unlink(), "no figures src/posmech/plots/fam.py"),
    "tests": (lambda r: (r / "tests/analyses/test_fam.py").unlink(), "no tests tests/analyses/test_fam.py"),
    "settings": (lambda r: (r / "src/posmech/settings/fam.py").unlink(), "no settings src/posmech/settings/fam.py"),
    "settings class": (lambda r: _replace(r / "src/posmech/settings/fam.py", "class FamSettings", "class Fam"),
                       "does not define `class FamSettings(FamFields):`"),
    "schema": (lambda r: _replace(r / "workflow/schemas/config.schema.yaml", "fam:", "fam_section:"),
               "no config section `fam`"),
    "config README": (lambda r: _replace(r / "config/README.md", "## `fam`", "## fam"),
                      "no heading `fam` in config/README.md"),
    "artifacts": (lambda r: _replace(r / "docs/artifacts.md", "(family `fam`)", "(claims)"),
                  "no heading naming `fam` in docs/artifacts.md"),
}


def _replace(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text
    path.write_text(text.replace(old, new), encoding="utf-8")


def test_a_complete_made_up_family_has_no_problem_and_its_package_counts(tmp_path):
    tree = _made_up_tree(tmp_path)
    assert room_problems(tree, "fam", ("fam",), ("fam",)) == []
    (tree / "src/posmech/analyses/fam.py").unlink()
    (tree / "src/posmech/analyses/fam").mkdir()
    (tree / "src/posmech/analyses/fam/__init__.py").write_text("")
    assert room_problems(tree, "fam", ("fam",), ("fam",)) == []


@pytest.mark.parametrize("room", sorted(BREAKS))
def test_each_missing_or_misnamed_room_is_found(tmp_path, room):
    tree = _made_up_tree(tmp_path)
    brk, words = BREAKS[room]
    brk(tree)
    problems = room_problems(tree, "fam", ("fam",), ("fam",))
    assert any(words in p for p in problems), problems
