"""docs/examples.md: every ``python`` block runs, in order, in the CI-sized run's working
directory, and prints what it says it prints."""

from __future__ import annotations

import contextlib
import io
import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.workflow


def blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def test_examples_run_on_the_ci_sized_run(ci_run):
    code = blocks((REPO / "docs" / "examples.md").read_text(encoding="utf-8"))
    assert len(code) == 4
    out = io.StringIO()
    here = os.getcwd()
    os.chdir(ci_run)
    try:
        namespace: dict = {}
        for block in code:
            with contextlib.redirect_stdout(out):
                exec(compile(block, "docs/examples.md", "exec"), namespace)  # noqa: S102
    finally:
        os.chdir(here)
    text = out.getvalue()
    assert re.search(r"document 0 before layer 1: \(\d+, 32\) float16", text)
    assert re.search(r"L1H0 at query \d+: 1\.000 in total", text)  # a kernel row is a distribution
    assert "Int64 rank" in text and "other model" in text
    named = namespace["named"]
    assert len(named) and named["head_name"].str.fullmatch(r"L\d+H\d+").all()
    assert named["previous_token"].notna().any()  # the head sets' heads are found in the head table
    assert set(namespace["findings"]["verdict"]) <= {"holds", "fails", "not measurable"}
