"""The package's layering (issue 26, "each room does one job"), read from the source with
``ast``: every ``import`` counts, a lazy one inside a function included (it is still a
dependency; it only moves the failure to run time).

* ``posmech.data`` holds data (corpora, token sets, prompt files): it imports nothing from
  ``posmech.analyses`` or ``posmech.models`` (forward passes live in the forward engine or
  the family's library, e.g. ``posmech.analyses.readout.target_probabilities``).
* No import cycle among the package's modules (``posmech.core.config`` <-> ``posmech.models.loading``
  was one: ``model_kind`` reads a config entry, so it lives in ``posmech.core.config``).
* The activation cache is an analysis stage: ``posmech.analyses.cache``, not the top level.

* **Floors** (issue 48), bottom to top, :data:`FLOORS`: ``core`` (errors, the config file,
  small I/O, progress, job accounting, the analysis registry), ``store`` (HDF5 artifacts,
  tables), ``settings``, ``data``, ``models`` (the forward engine and the score functions of
  every position scheme), ``analyses``, ``verdicts`` (findings, the published-value
  scorecard, self-check, dynamics, head roles), ``plots``, ``report``, ``pipeline``
  (study, scheduling, runner, cluster, preflight), ``cli``. A module imports only from its
  own floor or those below: zero upward imports, deferred ones included. Every module of
  the package lives on a floor (the top level holds ``__init__``, ``__main__`` and ``cli``).
* No module of the package imports a script of ``scripts/`` (a job's script hands the runner
  its loader, :func:`importlib.import_module`).

The checks run on a hand-built package too, so each is seen to fail on what it forbids.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"

#: the package's floors, bottom to top: a module may import its own floor and those below
FLOORS = ("core", "store", "settings", "data", "models", "analyses", "verdicts", "plots", "report", "pipeline",
          "cli")


def module_files(root: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file of ``root/package``."""
    out = {}
    for f in sorted((root / package).rglob("*.py")):
        parts = list(f.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = f
    return out


def imports_of(name: str, path: Path, modules: set[str]) -> set[str]:
    """The package modules that module ``name`` (at ``path``) imports anywhere in its body:
    ``import a.b``, ``from a.b import c`` (``a.b.c`` when that is a module, else ``a.b``) and
    relative imports, at top level or inside functions."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in modules:  # `import posmech.models.lens.x` -> the deepest module named
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    files = module_files(root, package)
    return {name: imports_of(name, path, set(files)) for name, path in files.items()}


def upward_imports(graph: dict[str, set[str]], lower: str, upper: tuple[str, ...]) -> list[tuple[str, str]]:
    """``(importer, imported)`` pairs where a module under ``lower`` imports one under ``upper``."""
    def under(m: str, p: str) -> bool:
        return m == p or m.startswith(p + ".")

    return sorted((a, b) for a, deps in graph.items() if under(a, lower)
                  for b in deps if any(under(b, u) for u in upper))


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted:
    every import cycle lies inside one.  A module's import of its own parent package
    (``posmech.plots.check`` reading ``posmech.plots.DPI``) is not an edge: Python loads the
    parent before any submodule whatever the code says, so that edge is implied by the
    layout, not chosen."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(d for d in graph[v] if not v.startswith(d + ".")):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


@pytest.fixture(scope="module")
def graph():
    return import_graph(SRC, "posmech")


def test_the_graph_sees_top_level_and_lazy_imports(graph):
    """The reader is not blind: known edges of the real package, a top-level one and one
    written inside a function, are in the graph."""
    assert "posmech.core.config" in graph["posmech.models.loading"]  # top level: local_path
    assert "posmech.models.lens" in graph["posmech.models.loading"]  # inside load_model
    assert "posmech.analyses.readout" in graph["posmech.analyses.posembed"]  # inside posembed_averaging


def test_data_imports_no_analysis_or_model_code(graph):
    assert upward_imports(graph, "posmech.data", ("posmech.analyses", "posmech.models")) == []


def test_the_package_has_no_import_cycle(graph):
    assert cycles(graph) == []
    assert "posmech.models.loading" not in graph["posmech.core.config"]


def test_the_cache_is_an_analysis_stage():
    files = module_files(SRC, "posmech")
    assert "posmech.analyses.cache" in files and "posmech.cache" not in files


def _package(tmp_path: Path, files: dict[str, str]) -> dict[str, set[str]]:
    for rel, text in files.items():
        p = tmp_path / "pkg" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return import_graph(tmp_path, "pkg")


def test_the_checks_fail_on_an_upward_import_and_a_lazy_cycle(tmp_path):
    """A hand-built package with what the rules forbid: ``data/prompts.py`` importing a
    forward helper (inside a function) and ``config.py`` <-> ``models/loading.py``, one side
    lazily, as it was before issue 26."""
    g = _package(tmp_path, {
        "__init__.py": "",
        "config.py": "def kinds():\n    from pkg.models.loading import model_kind\n    return model_kind\n",
        "data/__init__.py": "",
        "data/prompts.py": "def probs():\n    from pkg.analyses.readout import logits_at\n",
        "data/tokens.py": "from pkg import config\nfrom . import prompts\n",
        "analyses/__init__.py": "",
        "analyses/readout.py": "from ..models import loading\n",
        "models/__init__.py": "",
        "models/loading.py": "from pkg.config import is_local\n",
    })
    assert g["pkg.data.tokens"] == {"pkg.config", "pkg.data.prompts"}
    assert g["pkg.analyses.readout"] == {"pkg.models.loading"}
    assert upward_imports(g, "pkg.data", ("pkg.analyses", "pkg.models")) == [
        ("pkg.data.prompts", "pkg.analyses.readout")]
    assert cycles(g) == [["pkg.config", "pkg.models.loading"]]


def floor_of(module: str, package: str = "posmech", floors: tuple[str, ...] = FLOORS) -> int | None:
    """The index in ``floors`` of the floor ``module`` lives on (``None``: on none)."""
    rest = module.split(".")[1:]
    return floors.index(rest[0]) if rest and rest[0] in floors else None


def floor_violations(graph: dict[str, set[str]], package: str = "posmech",
                     floors: tuple[str, ...] = FLOORS) -> list[str]:
    """``importer -> imported`` for every import that runs up the floors, and every module
    on no floor (but the package itself and ``__main__``)."""
    out = []
    for a, deps in sorted(graph.items()):
        fa = floor_of(a, package, floors)
        if fa is None:
            if a not in (package, f"{package}.__main__"):
                out.append(f"{a}: on no floor")
            continue
        out += [f"{a} -> {b}" for b in sorted(deps)
                if (fb := floor_of(b, package, floors)) is not None and fb > fa]
    return out


def test_no_import_runs_up_the_floors(graph):
    assert floor_violations(graph) == []


def test_the_top_level_holds_only_the_floors_and_the_entry_points():
    top = sorted(p.name for p in (SRC / "posmech").iterdir() if not p.name.startswith((".", "_")) or p.name == "__init__.py")
    allowed = {f for f in FLOORS if f != "cli"} | {"cli.py", "__init__.py", "py.typed"}
    assert [t for t in top if t not in allowed] == []


def script_loads(root: Path, package: str, scripts: Path) -> list[str]:
    """Modules of ``root/package`` that import a script of ``scripts`` by name: an ``import``
    of a script's module name, or a call ``import_module(...)`` whose argument is not a
    string that starts with the package's name."""
    names = {p.stem for p in scripts.glob("*.py")}
    out = []
    for name, path in module_files(root, package).items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import) and any(a.name.split(".")[0] in names for a in node.names):
                out.append(name)
            elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] in names:
                out.append(name)
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module":
                arg = node.args[0] if node.args else None
                text = arg.value if isinstance(arg, ast.Constant) else (
                    arg.values[0].value if isinstance(arg, ast.JoinedStr) and arg.values
                    and isinstance(arg.values[0], ast.Constant) else "")
                if not str(text).startswith(package + "."):
                    out.append(name)
    return sorted(set(out))


def test_no_module_imports_a_script():
    assert script_loads(SRC, "posmech", SCRIPTS) == []


def test_the_floor_checks_fail_on_an_upward_import_and_a_script_load(tmp_path):
    g = _package(tmp_path, {
        "__init__.py": "",
        "core/__init__.py": "",
        "core/io.py": "def f():\n    from pkg.analyses import readout\n",
        "analyses/__init__.py": "",
        "analyses/readout.py": "from pkg.core import io\n",
        "stray.py": "",
        "pipeline/__init__.py": "",
        "pipeline/runner.py": "import importlib\ndef load(n):\n    return importlib.import_module(n).main\n",
    })
    floors = ("core", "analyses", "pipeline")
    assert floor_violations(g, "pkg", floors) == ["pkg.core.io -> pkg.analyses.readout", "pkg.stray: on no floor"]
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "readout_rule.py").write_text("")
    assert script_loads(tmp_path, "pkg", scripts) == ["pkg.pipeline.runner"]
