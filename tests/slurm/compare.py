"""Compare the ``results/`` trees of two runs of the workflow (e.g. Slurm vs local).

Provenance that legitimately differs between runs is ignored: HDF5 ``created``,
``git_commit`` and resume ``fingerprint`` (it hashes creation times) attributes, and
fields naming wall-clock times or speeds.  Numbers are compared with
a tight tolerance (a job may run with a different number of BLAS threads, which reorders
floating-point sums); everything else must be identical.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pandas as pd

RTOL, ATOL = 1e-5, 1e-6
#: Attributes/keys/columns that record when or how long, not what.
VOLATILE = ("created", "git_commit", "fingerprint", "time", "second", "elapsed", "duration", "wall")
#: Keys holding a hash of what is compared itself (a table sidecar's ``sha256`` of its CSV's
#: bytes, posmech.store.tables): two close tables have different hashes.
DERIVED = ("sha256",)


def _volatile(key: str) -> bool:
    k = key.lower()
    return any(v in k for v in VOLATILE) or k in DERIVED


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, (float, int, np.floating, np.integer)) and isinstance(b, (float, int, np.floating, np.integer)):
        if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
            return True
        return math.isclose(float(a), float(b), rel_tol=RTOL, abs_tol=ATOL)
    if isinstance(a, dict) and isinstance(b, dict):
        keys = {k for k in a.keys() | b.keys() if not _volatile(str(k))}
        return all(k in a and k in b and _close(a[k], b[k]) for k in keys)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, str) and isinstance(b, str) and a != b:
        try:  # a number in a column of mixed type (a scorecard's `value`) is read as text
            return _close(float(a), float(b))
        except ValueError:
            pass
    if isinstance(a, str) and isinstance(b, str) and a[:1] in "[{" and b[:1] in "[{":
        try:
            return _close(json.loads(a), json.loads(b))
        except ValueError:
            pass
    return a == b


def _arrays_equal(a: np.ndarray, b: np.ndarray) -> bool:
    if a.shape != b.shape or a.dtype.kind != b.dtype.kind:
        return False
    if a.dtype.kind in "fc":
        return bool(np.allclose(a, b, rtol=RTOL, atol=ATOL, equal_nan=True))
    return bool(np.array_equal(a, b))


def _attrs(obj: h5py.HLObject) -> dict[str, Any]:
    out = {}
    for k, v in obj.attrs.items():
        if _volatile(k):
            continue
        out[k] = v.decode() if isinstance(v, bytes) else (v.tolist() if isinstance(v, np.ndarray) else v)
    return out


def compare_h5(a: Path, b: Path) -> list[str]:
    problems: list[str] = []
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        names_a: list[str] = []
        names_b: list[str] = []
        fa.visit(names_a.append)
        fb.visit(names_b.append)
        if sorted(names_a) != sorted(names_b):
            return [f"{a.name}: different objects {sorted(set(names_a) ^ set(names_b))[:5]}"]
        for name in ["/", *names_a]:
            oa, ob = fa[name], fb[name]
            if not _close(_attrs(oa), _attrs(ob)):
                problems.append(f"{a.name}:{name}: attributes differ")
            if isinstance(oa, h5py.Dataset) and not _arrays_equal(oa[()] if oa.shape == () else oa[...],
                                                                  ob[()] if ob.shape == () else ob[...]):
                problems.append(f"{a.name}:{name}: data differ")
    return problems


def compare_csv(a: Path, b: Path) -> list[str]:
    from posmech.store.tables import read_table

    da, db = read_table(a), read_table(b)
    if list(da.columns) != list(db.columns) or len(da) != len(db):
        return [f"{a.name}: columns/rows differ"]
    problems = [] if _close(da.attrs, db.attrs) else [f"{a.name}: metadata lines differ"]
    for col in da.columns:
        if _volatile(col):
            continue
        ca, cb = da[col], db[col]
        how = ""
        if ca.dtype.kind in "fi" and cb.dtype.kind in "fi":
            x, y = ca.to_numpy(float, na_value=np.nan), cb.to_numpy(float, na_value=np.nan)  # Int64 gaps: NaN
            ok = np.allclose(x, y, rtol=RTOL, atol=ATOL, equal_nan=True)
            if not ok:
                d = np.abs(x - y)
                i = int(np.nanargmax(np.where(np.isnan(d), -1.0, d)))
                how = f" (largest: {x[i]!r} vs {y[i]!r})"
        else:
            ok = all(_close(x, y) or (pd.isna(x) and pd.isna(y)) for x, y in zip(ca, cb))
        if not ok:
            problems.append(f"{a.name}: column {col!r} differs{how}")
    return problems


def compare_png(a: Path, b: Path) -> list[str]:
    import matplotlib.image as mpimg

    ia, ib = mpimg.imread(a), mpimg.imread(b)
    if ia.shape != ib.shape:
        return [f"{a.name}: image sizes differ {ia.shape} vs {ib.shape}"]
    # the same data plotted twice: at most a few anti-aliased pixels may move
    if float(np.mean(np.abs(ia.astype(float) - ib.astype(float)) > 0.1)) > 0.002:
        return [f"{a.name}: images differ"]
    return []


def _is_hdf5(path: Path) -> bool:
    """HDF5 by its signature, whatever the name (e.g. the kept cache ``.kept/bible.h5.<fingerprint>``)."""
    with open(path, "rb") as f:
        return f.read(8) == b"\x89HDF\r\n\x1a\n"


def compare_file(a: Path, b: Path) -> list[str]:
    suffix = a.suffix.lower()
    if suffix in (".h5", ".hdf5") or _is_hdf5(a):
        return compare_h5(a, b)
    if suffix == ".csv":
        return compare_csv(a, b)
    if suffix == ".json":
        return [] if _close(json.loads(a.read_text()), json.loads(b.read_text())) else [f"{a.name}: differs"]
    if suffix == ".png":
        return compare_png(a, b)
    if suffix in (".html", ".rst", ".txt", ".log"):
        return []  # rendered text embeds paths and times; its numbers are in the tables
    return [] if a.read_bytes() == b.read_bytes() else [f"{a.name}: bytes differ"]


#: Files that tests add to a run's tree (not workflow outputs): the report test saves its
#: Chromium screenshots (the page unopened, and every section open) next to the report of the
#: shared ``ci_run``.
TEST_ARTIFACTS = frozenset({"results/report/screenshot.png", "results/report/screenshot-unfolded.png"})


def compare_results(a_root: Path, b_root: Path, sub: str = "results") -> list[str]:
    """Differences between ``a_root/sub`` and ``b_root/sub`` (empty: equal), ignoring
    :data:`TEST_ARTIFACTS`."""

    def files(root: Path) -> set[Path]:
        return {
            p.relative_to(root)
            for p in (root / sub).rglob("*")
            if p.is_file() and str(p.relative_to(root)) not in TEST_ARTIFACTS
            and p.name != "weights.verified.json"  # the weights' hash cache (file stats), not a result
            # a kept cache's sha256 (of bytes holding its creation time): its HDF5 file is compared
            and not (p.parent.name == ".kept" and p.suffix == ".sha256")
        }

    fa, fb = files(a_root), files(b_root)
    problems = [f"only in one run: {sorted(map(str, fa ^ fb))[:10]}"] if fa != fb else []
    for rel in sorted(fa & fb):
        problems += [f"{rel}: {p}" for p in compare_file(a_root / rel, b_root / rel)]
    return problems
