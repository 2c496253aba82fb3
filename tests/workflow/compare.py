"""Compare two working directories of the pipeline output by output.

HDF5 files: the same groups and datasets, equal values (NaN equal to NaN), equal
attributes except :data:`RUN_SPECIFIC_ATTRS`; CSV tables: equal after dropping
:data:`RUN_SPECIFIC_COLUMNS`; JSON: equal after dropping :data:`RUN_SPECIFIC_KEYS`; every
other file (PNG, JSONL, safetensors, tokenizer files, …): byte for byte.  Skipped:
``logs/``, ``benchmarks/``, ``.snakemake/`` and :data:`RUN_SPECIFIC_FILES`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pandas as pd

#: HDF5 attributes documented as run-specific (docs/artifacts.md): when, and how fast.
RUN_SPECIFIC_ATTRS = {"created", "forward_seconds", "tokens_per_second"}
#: CSV columns that are timings.
RUN_SPECIFIC_COLUMNS = {"elapsed_s"}
#: JSON keys (also of CSV `# key: value` metadata lines) that are timings.
RUN_SPECIFIC_KEYS = {"train_seconds", "tokens_per_second", "forward_seconds"}
#: Files that record the run itself (timings, dates) rather than results.
RUN_SPECIFIC_FILES = {"results/report/index.html"}
SKIPPED_DIRS = ("logs/", "benchmarks/", ".snakemake/")


def outputs(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")
            if p.is_file() and not p.relative_to(root).as_posix().startswith(SKIPPED_DIRS)}


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if a.dtype.kind == "f":
            return bool(np.array_equal(a, b, equal_nan=True))
        return bool(np.array_equal(a, b))
    return a == b


def _h5_differences(a: Path, b: Path) -> list[str]:
    out: list[str] = []
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        items: dict[str, list[Any]] = {}
        fa.visititems(lambda n, o: items.setdefault(n, [None, None]).__setitem__(0, o))
        fb.visititems(lambda n, o: items.setdefault(n, [None, None]).__setitem__(1, o))
        items[""] = [fa, fb]
        for name, (x, y) in sorted(items.items()):
            if x is None or y is None:
                out.append(f"{name}: only in one file")
                continue
            if isinstance(x, h5py.Dataset) and not _equal(x[()], y[()]):
                out.append(f"{name}: values differ")
            keys = (set(x.attrs) | set(y.attrs)) - RUN_SPECIFIC_ATTRS
            for k in sorted(keys):
                if k not in x.attrs or k not in y.attrs or not _equal(x.attrs[k], y.attrs[k]):
                    out.append(f"{name}@{k} differs")
    return out


def _drop(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _drop(v) for k, v in obj.items() if k not in RUN_SPECIFIC_KEYS}
    if isinstance(obj, list):
        return [_drop(v) for v in obj]
    return obj


def _meta(path: Path) -> list[str]:
    lines = [ln for ln in path.read_text().splitlines() if ln.startswith("#")]
    return [ln for ln in lines if ln[1:].split(":", 1)[0].strip() not in RUN_SPECIFIC_KEYS]


def _is_hdf5(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(8) == b"\x89HDF\r\n\x1a\n"


def differences(a: Path, b: Path) -> list[str]:
    """Every difference between the outputs of working directory ``b`` and the same files
    in ``a`` (``a`` may hold more: files other tests made in it)."""
    fa, fb = outputs(a), outputs(b)
    out = [f"{p}: missing in {a}" for p in sorted(fb - fa)]
    for rel in sorted((fa & fb) - RUN_SPECIFIC_FILES):
        pa, pb = a / rel, b / rel
        if _is_hdf5(pa) and _is_hdf5(pb):
            out += [f"{rel}: {d}" for d in _h5_differences(pa, pb)]
        elif rel.endswith(".csv"):
            ta = pd.read_csv(pa, comment="#")
            tb = pd.read_csv(pb, comment="#")
            cols = [c for c in ta.columns if c not in RUN_SPECIFIC_COLUMNS]
            if _meta(pa) != _meta(pb):
                out.append(f"{rel}: metadata lines differ")
            if list(ta.columns) != list(tb.columns) or not ta[cols].equals(tb[cols]):
                out.append(f"{rel}: table differs")
        elif rel.endswith(".json"):
            if _drop(json.loads(pa.read_text())) != _drop(json.loads(pb.read_text())):
                out.append(f"{rel}: JSON differs")
        elif pa.read_bytes() != pb.read_bytes():
            out.append(f"{rel}: bytes differ")
    return out
