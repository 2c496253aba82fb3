"""Scripts only read inputs, call the library and write outputs (issue 26).

A script under ``scripts/`` may not build the rows of a table or a scorecard itself, nor run
the model with hooks of its own: that code is out of the unit tests' reach.  What it may do:
unpack ``snakemake``, call library functions, write what they return, and write table
metadata (a dict with a ``claim`` key assigned to a name and handed to ``write_table``).

What fails, found in each script's syntax tree (:func:`problems`):

* a dict literal with a ``"quantity"`` key (a scorecard row);
* a dict literal with a ``"claim"`` key that is a row: an element of a list, of a
  comprehension or generator, or an argument of ``.append`` / ``.extend`` / ``DataFrame``;
* a ``"claim"`` column put into a table (``df.insert(i, "claim", …)``, ``df["claim"] = …``);
* ``scorecard_rows(x)`` where ``x`` is not one library call, or a name bound once from one
  library call and never appended to;
* a hook: ``run_with_hooks``, ``run_with_cache``, ``.hooks(…)``, ``add_hook``,
  ``register_forward_hook`` (and its pre / backward variants), ``fwd_hooks=``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
HOOK_CALLS = {"run_with_hooks", "run_with_cache", "hooks", "add_hook", "register_forward_hook",
              "register_forward_pre_hook", "register_full_backward_hook", "register_backward_hook"}
HOOK_KEYWORDS = {"fwd_hooks", "bwd_hooks"}
ROW_SINKS = {"append", "extend", "DataFrame"}


def _keys(d: ast.Dict) -> set[str]:
    return {k.value for k in d.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}


def _name(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _is_row(d: ast.Dict, parents: dict[ast.AST, ast.AST]) -> bool:
    """Whether the dict literal ``d`` sits where a row goes (see the module docstring)."""
    node = d
    while node in parents:
        up = parents[node]
        if isinstance(up, (ast.List, ast.ListComp, ast.GeneratorExp, ast.SetComp)):
            return True
        if isinstance(up, ast.Call) and node in up.args and _name(up.func) in ROW_SINKS:
            return True
        if isinstance(up, (ast.Dict, ast.keyword)) or isinstance(up, ast.stmt):
            return False  # a value inside another dict, a keyword argument, a statement: not a row
        node = up
    return False


def _scorecard_argument_problem(arg: ast.expr, func: ast.AST) -> str | None:
    """Why ``scorecard_rows(arg)`` in function ``func`` is not one library call's rows."""
    if isinstance(arg, ast.Call):
        return None
    if not isinstance(arg, ast.Name):
        return f"scorecard_rows({ast.unparse(arg)}) builds rows in the script"
    binds = [n for n in ast.walk(func) if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign))
             and any(isinstance(t, ast.Name) and t.id == arg.id
                     for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))]
    grows = [n for n in ast.walk(func) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and isinstance(n.func.value, ast.Name) and n.func.value.id == arg.id
             and n.func.attr in {"append", "extend", "insert"}]
    if len(binds) != 1 or not isinstance(binds[0], ast.Assign) or not isinstance(binds[0].value, ast.Call) or grows:
        return f"scorecard_rows({arg.id}): {arg.id} is not the rows of one library call"
    return None


def problems(source: str) -> list[str]:
    """What a script's ``source`` does that belongs in the library, one line each (line number first)."""
    tree = ast.parse(source)
    parents = _parents(tree)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            keys = _keys(node)
            if "quantity" in keys:
                out.append(f"line {node.lineno}: a scorecard row built in the script")
            elif "claim" in keys and _is_row(node, parents):
                out.append(f"line {node.lineno}: a table row with a claim built in the script")
        elif isinstance(node, ast.Call):
            name = _name(node.func)
            if name in HOOK_CALLS:
                out.append(f"line {node.lineno}: hooks the model itself ({name})")
            if any(k.arg in HOOK_KEYWORDS for k in node.keywords):
                out.append(f"line {node.lineno}: hooks the model itself (fwd_hooks=)")
            if name == "insert" and any(isinstance(a, ast.Constant) and a.value == "claim" for a in node.args):
                out.append(f"line {node.lineno}: a claim column put into a table in the script")
            if name == "scorecard_rows" and node.args:
                func = node
                while func in parents and not isinstance(func, (ast.FunctionDef, ast.Module)):
                    func = parents[func]
                why = _scorecard_argument_problem(node.args[0], func)
                if why:
                    out.append(f"line {node.lineno}: {why}")
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant) and t.slice.value == "claim":
                    out.append(f"line {node.lineno}: a claim column put into a table in the script")
    return sorted(set(out), key=lambda s: int(s.split(":")[0].split()[1]))


@pytest.mark.parametrize("script", sorted(SCRIPTS.glob("*.py")), ids=lambda p: p.name)
def test_script_only_calls_the_library(script):
    found = problems(script.read_text(encoding="utf-8"))
    assert not found, (f"{script.name} does work that belongs in src/posmech (a library function, unit-tested, "
                       "that the script calls):\n" + "\n".join(found))


THICK = {
    "scorecard row": 'card = [{"claim": "X1", "model": m, "quantity": "q", "value": 1}]',
    "rows appended": 'rows.append({"claim": "X1", "model": m, "n": n})',
    "rows in a comprehension": 'df = pd.DataFrame([{"claim": "X1", **r} for r in rows])',
    "claim column": 'df.insert(0, "claim", "X1")',
    "claim column assigned": 'df["claim"] = "X1"',
    "inline scorecard list": "write_table(scorecard_rows([*a(), b()]), path)",
    "scorecard list grown": "rows = lib.a_scorecard()\nrows.append(lib.row())\nwrite_table(scorecard_rows(rows), p)",
    "run_with_hooks": 'bridge.run_with_hooks(x, fwd_hooks=[("blocks.0.mlp.hook_pre", grab)])',
    "torch hook": "m.transformer.h[0].mlp.register_forward_hook(grab)",
    "hooks context": "with bridge.hooks(fwd_hooks=hooks):\n    bridge(x)",
}

THIN = {
    "table metadata": 'meta = {"claim": "X1", "model": m, "corpus": c}\nwrite_table(df, path, meta)',
    "metadata subset": 'write_table(t, p, {k: meta[k] for k in ("claim", "model")})',
    "library scorecard": "card = lib.x_scorecard(df, m)\nwrite_table(scorecard_rows(card), path)",
    "library scorecard inline": "write_table(scorecard_rows(lib.x_scorecard(df, m)), path)",
    "not-measurable columns": 'write_not_measurable("X1", m, why, Q, {p: ["claim", "model"]}, f, s)',
}


@pytest.mark.parametrize("what", THICK)
def test_the_check_finds_work_that_belongs_in_the_library(what):
    assert problems(f"def main(smk, log):\n{_indent(THICK[what])}\n"), what


@pytest.mark.parametrize("what", THIN)
def test_the_check_passes_a_thin_script(what):
    assert problems(f"def main(smk, log):\n{_indent(THIN[what])}\n") == []


def _indent(code: str) -> str:
    return "\n".join("    " + line for line in code.splitlines())
