"""Failure records: what a failed analysis leaves in place of the outputs it could not write.

An analysis that fails on one model (an exception in its job, :mod:`posmech.pipeline.runner`)
must not stop the findings table and the report of the others, nor lose what its job had
already computed. Its job therefore ends normally, and each declared output the analysis did
not write holds a *failure record* instead: :data:`MAGIC`, then one JSON object (``analysis``,
``model``, ``error``, ``log``: the job's log, where the traceback is). Everything that reads
an output asks :func:`failure_of` first:

* an analysis whose input is a failure record does not run; its outputs become failure
  records naming the input (:func:`posmech.pipeline.runner.run`);
* a failed scorecard makes that analysis's findings ``not measurable`` with the error and
  the log's path (:func:`posmech.verdicts.findings.findings_table`), never a silent 0;
* the report leaves a failed figure or table out, and the head table a failed table.

The records do not stay: a later live run deletes them before it plans its jobs
(:func:`remove_failures`), so Snakemake sees those outputs missing and runs their jobs again.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

#: the first bytes of a failure record (no figure, table, HDF5 or JSON file starts so)
MAGIC = b"posmech: failed analysis output\n"


def write_failure(path: str | os.PathLike[str], record: dict[str, Any]) -> None:
    """Write a failure record at ``path`` (its folder made): :data:`MAGIC` then ``record``
    as JSON."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(MAGIC + json.dumps(record, ensure_ascii=False, default=str).encode() + b"\n")


def failure_of(path: str | os.PathLike[str] | None) -> dict[str, Any] | None:
    """The record of ``path`` when it is a failure record, else ``None`` (also for a path
    that is not a readable file)."""
    if path is None:
        return None
    try:
        with open(path, "rb") as fh:
            head = fh.read(len(MAGIC))
            if head != MAGIC:
                return None
            rec = json.loads(fh.read().decode("utf-8", errors="replace") or "{}")
    except (OSError, ValueError, TypeError):
        return None
    return rec if isinstance(rec, dict) else {"error": str(rec)}


def failed_paths(paths: Iterable[Any]) -> dict[str, dict[str, Any]]:
    """``{path: record}`` of the failure records among ``paths`` (entries that are not
    paths, e.g. ``None``, skipped)."""
    out = {}
    for p in paths:
        if isinstance(p, (str, os.PathLike)):
            rec = failure_of(p)
            if rec is not None:
                out[os.fspath(p)] = rec
    return out


def words(rec: dict[str, Any]) -> str:
    """A failure record in words: the analysis, its error and the log to read."""
    return (f"analysis {rec.get('analysis', '?')} failed: {rec.get('error', '?')} "
            f"(log: {rec.get('log') or 'none'})")


def remove_failures(root: str | os.PathLike[str] = "results") -> list[str]:
    """Delete every failure record under ``root`` (files whose first bytes are
    :data:`MAGIC`), so that their jobs run again; the paths deleted."""
    out = []
    for dirpath, _, files in os.walk(root):
        for name in files:
            p = os.path.join(dirpath, name)
            if failure_of(p) is not None:
                os.remove(p)
                out.append(p)
    return sorted(out)
