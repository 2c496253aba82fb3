"""Compare two runs of the workflow exactly: every HDF5 dataset, every parsed CSV.

    python tests/compare_runs.py RUN_A RUN_B [--ignore-attr NAME ...]

RUN_A/RUN_B are working directories of two runs (each with ``results/`` and
``resources/``). Used to show that a change that must not change results does not
(issue 12: a demo run before and after the restructuring). Unlike
``tests/slurm/compare.py`` (a tolerance, for runs on other machines and thread counts),
numbers must be bitwise equal here. Ignored, because they record when, how fast or where
a file was made rather than what it holds: the HDF5 provenance attributes ``created`` and
``git_commit`` (docs/artifacts.md), keys and columns naming wall-clock times or speeds
(``*seconds*``, ``*per_second*``, ``elapsed_s``), and absolute paths of the run directory
(a manifest's ``hf_dir``). Every ignored difference is still counted and listed. PNG
figures are compared byte for byte and listed separately (informational).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pandas as pd

PROVENANCE = {"created", "git_commit"}
TIMING = ("seconds", "per_second", "elapsed_s")


def _timing(key: str) -> bool:
    return any(t in key for t in TIMING)


def _decode(v: Any) -> Any:
    if isinstance(v, bytes):
        v = v.decode()
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, str) and v[:1] in "[{":
        try:
            return json.loads(v)
        except ValueError:
            pass
    return v


def _equal(a: Any, b: Any, roots: tuple[str, str]) -> bool:
    """Exact equality of decoded values; NaN equals NaN; dicts ignore key order and timing
    keys; strings equal once each run's directory is replaced by a placeholder."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if a is pd.NA or b is pd.NA:  # a nullable column's missing value (read_table's Int64 columns)
        return a is b
    if isinstance(a, dict) and isinstance(b, dict):
        keys = {k for k in a.keys() | b.keys() if not _timing(str(k))}
        return all(k in a and k in b and _equal(a[k], b[k], roots) for k in keys)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y, roots) for x, y in zip(a, b))
    if isinstance(a, str) and isinstance(b, str):
        return a.replace(roots[0], "<run>") == b.replace(roots[1], "<run>")
    return type(a) is type(b) and a == b


def _is_hdf5(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(8) == b"\x89HDF\r\n\x1a\n"


class Report:
    def __init__(self) -> None:
        self.counts = {"hdf5 files": 0, "datasets": 0, "csv files": 0, "json files": 0, "other files": 0, "png files": 0}
        self.differences: list[str] = []
        self.ignored: list[str] = []
        self.png_differ: list[str] = []


def compare_h5(a: Path, b: Path, rel: str, rep: Report, roots: tuple[str, str], ignore: set[str]) -> None:
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        na: list[str] = []
        nb: list[str] = []
        fa.visit(na.append)
        fb.visit(nb.append)
        if sorted(na) != sorted(nb):
            rep.differences.append(f"{rel}: objects differ: {sorted(set(na) ^ set(nb))[:8]}")
            return
        for name in ["/", *na]:
            oa, ob = fa[name], fb[name]
            for k in sorted(set(oa.attrs) | set(ob.attrs)):
                va = _decode(oa.attrs[k]) if k in oa.attrs else "<absent>"
                vb = _decode(ob.attrs[k]) if k in ob.attrs else "<absent>"
                if _equal(va, vb, roots):
                    continue
                where = f"{rel}:{name} attribute {k!r}"
                if k in PROVENANCE or k in ignore or _timing(k):
                    rep.ignored.append(where)
                else:
                    rep.differences.append(f"{where}: {str(va)[:80]} != {str(vb)[:80]}")
            if isinstance(oa, h5py.Dataset):
                rep.counts["datasets"] += 1
                da, db = oa[()], ob[()]
                if oa.dtype != ob.dtype or oa.shape != ob.shape:
                    rep.differences.append(f"{rel}:{name}: dtype/shape {oa.dtype}{oa.shape} != {ob.dtype}{ob.shape}")
                elif not np.array_equal(np.asarray(da), np.asarray(db), equal_nan=oa.dtype.kind in "fc"):
                    rep.differences.append(f"{rel}:{name}: values differ")


def compare_csv(a: Path, b: Path, rel: str, rep: Report, roots: tuple[str, str]) -> None:
    from posmech.store.tables import read_table

    da, db = read_table(a), read_table(b)
    if not _equal(dict(da.attrs), dict(db.attrs), roots):
        rep.differences.append(f"{rel}: metadata ({a.stem}.meta.json) differs")
    if list(da.columns) != list(db.columns) or len(da) != len(db):
        rep.differences.append(f"{rel}: columns/rows differ")
        return
    for col in da.columns:
        ca, cb = da[col], db[col]
        same = ca.dtype == cb.dtype and all(
            _equal(_decode(x), _decode(y), roots) or (pd.isna(x) is True and pd.isna(y) is True)
            for x, y in zip(ca.tolist(), cb.tolist())
        )
        if not same:
            (rep.ignored if _timing(col) else rep.differences).append(f"{rel}: column {col!r} differs")


def compare_runs(a_root: Path, b_root: Path, ignore: set[str]) -> Report:
    rep = Report()
    roots = (str(a_root.resolve()), str(b_root.resolve()))

    def files(root: Path) -> set[str]:
        # not results: weights.verified.json, the hash cache of the weights (file stats, inodes);
        # a kept cache's .sha256, the hash of its bytes (which hold its creation time), whose
        # HDF5 file is compared by content
        return {str(p.relative_to(root)) for sub in ("results", "resources/models", "resources/corpora")
                if (root / sub).is_dir() for p in (root / sub).rglob("*")
                if p.is_file() and p.name != "weights.verified.json"
                and not (p.parent.name == ".kept" and p.suffix == ".sha256")}

    fa, fb = files(a_root), files(b_root)
    if fa != fb:
        rep.differences.append(f"files in one run only: {sorted(fa ^ fb)[:20]}")
    for rel in sorted(fa & fb):
        a, b = a_root / rel, b_root / rel
        suffix = a.suffix.lower()
        if suffix == ".h5" or _is_hdf5(a):  # also the activation cache's kept copies (.kept/<name>.<fingerprint>)
            rep.counts["hdf5 files"] += 1
            compare_h5(a, b, rel, rep, roots, ignore)
        elif suffix == ".csv":
            rep.counts["csv files"] += 1
            compare_csv(a, b, rel, rep, roots)
        elif suffix == ".json":
            rep.counts["json files"] += 1
            ja, jb = json.loads(a.read_text()), json.loads(b.read_text())
            if rel.endswith(".meta.json"):  # a table's sha256: its CSV, compared by content above
                for j in (ja, jb):
                    j.pop("sha256", None)
            if not _equal(ja, jb, roots):
                rep.differences.append(f"{rel}: JSON differs")
        elif suffix == ".png":
            rep.counts["png files"] += 1
            if a.read_bytes() != b.read_bytes():
                rep.png_differ.append(rel)
        elif suffix in (".html",):
            continue  # rendered from the tables and the config; embeds times
        else:
            rep.counts["other files"] += 1
            if a.read_bytes() != b.read_bytes():
                rep.differences.append(f"{rel}: bytes differ")
    return rep


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_a", type=Path)
    ap.add_argument("run_b", type=Path)
    ap.add_argument("--ignore-attr", action="append", default=[],
                    help="an HDF5 attribute expected to differ (listed as ignored, not as a difference)")
    args = ap.parse_args(argv)
    rep = compare_runs(args.run_a, args.run_b, set(args.ignore_attr))
    print("compared:", ", ".join(f"{v} {k}" for k, v in rep.counts.items()))
    print(f"ignored differences ({len(rep.ignored)}):", *sorted(set(rep.ignored)), sep="\n  ")
    print(f"PNG files not byte-identical ({len(rep.png_differ)}):", *rep.png_differ, sep="\n  ")
    print(f"DIFFERENCES ({len(rep.differences)}):", *rep.differences, sep="\n  ")
    return 1 if rep.differences else 0


if __name__ == "__main__":
    sys.exit(main())
