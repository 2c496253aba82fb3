"""The tolerances' own rules (tests/tolerances.py): every test that uses a float32 tolerance is
in the set ``make test`` runs a second time with other CPU kernels, that second run really
takes other kernels, and a float32 test writes no tolerance tighter than float32 allows."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import tolerances

TESTS = Path(__file__).resolve().parent
FLOAT32_NAMES = {"FLOAT32_FORWARD_ABS", "FLOAT32_FORWARD_REL", "float32_logit_tol"}
TOLERANCE_KEYWORDS = {"rtol", "atol", "rel", "abs"}


def _marked_float32(fn: ast.FunctionDef) -> bool:
    for d in fn.decorator_list:
        if isinstance(d, ast.Attribute) and d.attr == "float32" and ast.unparse(d) == "pytest.mark.float32":
            return True
    return False


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _test_functions():
    """``(path, test function, names it uses through module-level helpers too)`` of every
    unit-test module; the workflow tests read the DAG's outputs and are not run twice."""
    for path in sorted(TESTS.rglob("test_*.py")):
        if "workflow" in path.relative_to(TESTS).parts:
            continue
        tree = ast.parse(path.read_text())
        defs = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
        helpers = {f.name: _names(f) for f in defs if not f.name.startswith("test_")}
        for fn in defs:
            if fn.name.startswith("test_"):
                used = _names(fn)
                for h in used & helpers.keys():
                    used |= helpers[h]
                yield path, fn, used


def test_every_test_with_a_float32_tolerance_is_marked_float32():
    unmarked = [f"{p.relative_to(TESTS.parent)}::{fn.name}" for p, fn, used in _test_functions()
                if used & FLOAT32_NAMES and not _marked_float32(fn)]
    assert not unmarked, "uses a float32 tolerance but is not @pytest.mark.float32 (not run twice):\n" + "\n".join(
        unmarked)


def test_float32_tests_write_no_tolerance_tighter_than_float32():
    """A literal tolerance below FLOAT32_FORWARD_ABS in a float32 test is either a float32
    tolerance too tight for another kernel or a float64 one that should say so (FLOAT64_*)."""
    tight = []
    for p, fn, _ in _test_functions():
        if not _marked_float32(fn):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.keyword) and node.arg in TOLERANCE_KEYWORDS:
                v = node.value
                if isinstance(v, ast.Constant) and isinstance(v.value, float) and 0 < v.value < (
                        tolerances.FLOAT32_FORWARD_ABS):
                    tight.append(f"{p.relative_to(TESTS.parent)}:{node.value.lineno} {fn.name}: {node.arg}={v.value}")
    assert not tight, "\n".join(tight)


@pytest.mark.float32
def test_the_float32_run_takes_the_kernels_it_asks_for():
    """``make test``'s second run of the float32 tests sets ``ATEN_CPU_CAPABILITY`` and
    ``OMP_NUM_THREADS``: a torch that ignored them (a renamed variable, a build without that
    dispatch) would run the same kernels twice and check nothing.  A fresh interpreter, as
    this process's thread count may have been changed by a test."""
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability(), "
                          "torch.get_num_threads())"], capture_output=True, text=True, check=True).stdout.split()
    capability, threads = out[0], int(out[1])
    if os.environ.get("ATEN_CPU_CAPABILITY"):
        assert capability.lower() == os.environ["ATEN_CPU_CAPABILITY"].lower()
    if os.environ.get("OMP_NUM_THREADS"):
        assert threads == int(os.environ["OMP_NUM_THREADS"])


def test_the_logit_tolerance_is_the_forward_one_at_logits_of_ten():
    assert tolerances.float32_logit_tol([0.5, -2.0]) == tolerances.FLOAT32_FORWARD_REL
    assert tolerances.float32_logit_tol([10.0]) == pytest.approx(tolerances.FLOAT32_FORWARD_REL, rel=0.1)
    assert tolerances.float32_logit_tol([-40.0, 3.0]) == pytest.approx(8 * tolerances.FLOAT32_EPS * 40)
