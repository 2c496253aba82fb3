"""tests/compare_runs.py: two runs are equal only when every dataset and parsed CSV is."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import h5py
import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).parent))
from compare_runs import compare_runs  # noqa: E402

from posmech.store.tables import write_table  # noqa: E402


def _run(root: Path, value: float = 0.5, created: str = "2026-01-01", seconds: float = 1.0) -> Path:
    (root / "results/m").mkdir(parents=True)
    with h5py.File(root / "results/m/a.h5", "w") as f:
        f.attrs["created"] = created
        f.attrs["params"] = json.dumps({"k": 3, "forward_seconds": seconds})
        f["x"] = np.array([1.0, np.nan, value])
    write_table(pd.DataFrame({"head_name": ["L0H1"], "value": [value], "elapsed_s": [seconds]}),
                root / "results/m/t.csv", {"hf_dir": str(root / "hf"), "k": 3})
    return root


def test_equal_runs_differ_only_in_provenance_timing_and_paths(tmp_path):
    a = _run(tmp_path / "a")
    b = _run(tmp_path / "b", created="2026-02-02", seconds=9.0)
    rep = compare_runs(a, b, set())
    assert rep.differences == []
    assert rep.counts["datasets"] == 1 and rep.counts["csv files"] == 1
    assert any("created" in i for i in rep.ignored) and any("elapsed_s" in i for i in rep.ignored)


def test_one_changed_number_is_a_difference(tmp_path):
    a = _run(tmp_path / "a")
    b = _run(tmp_path / "b", value=0.5 + 1e-12)
    diffs = compare_runs(a, b, set()).differences
    assert any("results/m/a.h5:x: values differ" in d for d in diffs)
    assert any("column 'value' differs" in d for d in diffs)


def test_nullable_integer_columns_compare(tmp_path):
    """read_table gives a rank with gaps as Int64 (pd.NA for the gaps): equal runs compare
    equal, a changed rank is a difference."""
    import pandas as pd

    from posmech.store.tables import write_table
    from tests.compare_runs import Report, compare_csv

    runs = []
    for name, ranks in (("a", [1, None, 3]), ("b", [1, None, 3]), ("c", [1, None, 2])):
        path = tmp_path / name / "t.csv"
        path.parent.mkdir()
        write_table(pd.DataFrame({"rank": pd.array(ranks, dtype="Int64")}), path, {"k": 1})
        runs.append(path)
    same, changed = Report(), Report()
    compare_csv(runs[0], runs[1], "t.csv", same, ("/a", "/b"))
    compare_csv(runs[0], runs[2], "t.csv", changed, ("/a", "/c"))
    assert same.differences == [] and changed.differences == ["t.csv: column 'rank' differs"]
