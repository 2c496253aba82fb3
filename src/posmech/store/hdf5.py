"""The one place that knows the artifact schema of posmech's HDF5 files.

Every HDF5 file the pipeline writes:

* is written to a temporary sibling (``<name>.partial``) and renamed when complete;
* carries on its root the attributes ``schema_version``, ``kind``, ``complete`` (the
  completion marker, set last), ``rule`` (which rule writes it), provenance
  (``created``, ``git_commit``, package versions) and what the writer adds;
* is opened by readers through :func:`open_artifact`, which refuses a file whose
  ``schema_version`` or completion marker is wrong with a message naming the file and
  the rule to rerun.

``docs/artifacts.md`` documents every dataset and attribute.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from posmech.core.errors import PosmechError
from posmech.core.families import rule_of
from posmech.core.io import atomic_path

SCHEMA_VERSION = 1
STR = h5py.string_dtype(encoding="utf-8")


@functools.lru_cache(maxsize=1)
def git_commit() -> str:
    """The project's git commit (``+dirty`` when the work tree has changes), or ``unknown``.

    Asked once per process: the code that runs is the code imported at start, whatever
    happens to the work tree later."""
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=here, capture_output=True,
            text=True, timeout=5,
        ).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


@functools.lru_cache(maxsize=1)
def _package_versions() -> tuple[tuple[str, str], ...]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("posmech", "torch", "transformer_lens", "transformers", "h5py", "numpy"):
        try:
            out[pkg] = version(pkg.replace("_", "-"))
        except PackageNotFoundError:
            out[pkg] = "not installed"
    return tuple(out.items())


def package_versions() -> dict[str, str]:
    """Installed versions of the packages whose behaviour the artifacts depend on."""
    return dict(_package_versions())


def provenance() -> dict[str, Any]:
    """Attributes every artifact carries: creation time, git commit, package versions."""
    attrs: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
    }
    for pkg, v in package_versions().items():
        attrs[f"version_{pkg}"] = v
    return attrs


def set_attrs(obj: h5py.HLObject, attrs: dict[str, Any]) -> None:
    """Set attributes; dicts/lists of non-numbers are stored as JSON strings."""
    for k, v in attrs.items():
        if v is None:
            v = "null"
        elif isinstance(v, dict) or (isinstance(v, (list, tuple)) and v and not isinstance(v[0], (int, float))):
            v = json.dumps(v, sort_keys=True, default=str)
        obj.attrs[k] = v


# ------------------------------------------------------------------ checksums
# Every dataset of a file the pipeline writes carries HDF5's fletcher32 checksum filter
# (per chunk), so flipped bytes are detected when the data is read (h5py raises
# ``OSError: ... fletcher32 checksum``) instead of silently changing results.  The files
# being written are registered in _CHECKSUMMED; for them ``create_dataset`` defaults to
# ``fletcher32=True`` (h5py has no file-level default filter).  Not protected: scalar
# datasets and variable-length strings (HDF5 cannot filter them), and attributes and the
# file's structure (HDF5's own metadata checksums cover the superblock and object headers).
_CHECKSUMMED: set[str] = set()
_create_dataset = h5py.Group.create_dataset


def _checksummable(shape: Any, dtype: Any, data: Any) -> bool:
    if data is not None:
        arr = np.asarray(data) if not isinstance(data, (h5py.Dataset, np.ndarray)) else data
        shape = arr.shape if shape is None else shape
        dtype = arr.dtype if dtype is None else dtype
    if shape is None or shape == () or int(np.prod(shape)) == 0:
        return False
    dt = np.dtype(dtype) if dtype is not None else None
    return dt is not None and dt.kind not in "OUS" and h5py.check_vlen_dtype(dt) is None


def _create_dataset_checksummed(self: h5py.Group, name: Any, shape: Any = None, dtype: Any = None,
                                data: Any = None, **kw: Any) -> h5py.Dataset:
    if "fletcher32" not in kw and "dcpl" not in kw and self.file.filename in _CHECKSUMMED:
        try:
            if _checksummable(shape, dtype, data):
                kw["fletcher32"] = True
        except (TypeError, ValueError):
            pass
    return _create_dataset(self, name, shape, dtype, data, **kw)


h5py.Group.create_dataset = _create_dataset_checksummed


@contextlib.contextmanager
def checksummed(f: h5py.File) -> Iterator[h5py.File]:
    """Within the block, datasets created in ``f`` get the fletcher32 checksum filter
    (unless the call says otherwise); see :func:`preallocated_dataset` for the
    preallocated ones."""
    _CHECKSUMMED.add(f.filename)
    try:
        yield f
    finally:
        _CHECKSUMMED.discard(f.filename)


@contextlib.contextmanager
def artifact_writer(path: str | os.PathLike[str], kind: str, rule: str, attrs: dict[str, Any] | None = None) -> Iterator[h5py.File]:
    """Open a new artifact for writing at a temporary name; on success set the completion
    marker and rename it onto ``path``.  On error the partial file is removed and
    whatever was at ``path`` before stays untouched."""
    if KIND_RULES.get(kind, rule) != rule:
        raise PosmechError(f"internal: artifact kind {kind!r} is written by rule `{KIND_RULES[kind]}`, not `{rule}` "
                           "(posmech.store.hdf5.KIND_RULES)")
    with atomic_path(path) as tmp:
        with h5py.File(tmp, "w") as f, checksummed(f):
            set_attrs(f, {**provenance(), "kind": kind, "rule": rule, "complete": False, **(attrs or {})})
            yield f
            f.attrs["complete"] = True


def open_hdf5(path: str | os.PathLike[str]) -> h5py.File:
    """Open any HDF5 file read-only (complete or not); a missing, corrupt or truncated
    file raises :class:`PosmechError` naming it."""
    p = Path(path)
    if not p.exists():
        raise PosmechError(f"artifact {str(p)!r} does not exist; run the workflow target that makes it")
    try:
        return h5py.File(p, "r")
    except OSError as err:
        raise PosmechError(
            f"artifact {str(p)!r} is not a readable HDF5 file ({err}); it is corrupt or truncated: "
            "delete it and rerun the rule that writes it"
        ) from None


#: the rule that writes each kind of artifact (a file of the wrong kind names the rule that
#: writes the kind expected, not the one that wrote the file; tests check the writers agree)
KIND_RULES = {
    "tokens": "tokenize",
    "activations": "cache_activations",
    "kernels": "positional_kernels",
    "extended_embeddings": "extended_positional_embeddings",
    "extended_token_embeddings": "extended_token_embeddings",
    "attention_statistics": "attention_statistics",
    "layer0_decomposition": "layer0_decomposition",
    "score_anatomy": "score_anatomy",
    "score_profiles": "score_taxa",
    "posembed_attention": "posembed_attention",
}


def open_artifact(path: str | os.PathLike[str], kind: str | None = None) -> h5py.File:
    """Open a pipeline artifact read-only after checking it is whole.

    Raises :class:`PosmechError` naming the file and the rule to rerun when the file is
    missing, not HDF5, of another schema version or kind, or lacks the completion marker.
    """
    p = Path(path)
    f = open_hdf5(p)
    rule = f.attrs.get("rule", "the rule that writes it")
    problem = None
    if f.attrs.get("schema_version") != SCHEMA_VERSION:
        v = f.attrs.get("schema_version")
        problem = f"schema_version {v.item() if isinstance(v, np.generic) else v!r}, expected {SCHEMA_VERSION}"
    elif not bool(f.attrs.get("complete", False)):
        problem = "no completion marker (the writer did not finish)"
    elif kind is not None and f.attrs.get("kind") != kind:
        writer = KIND_RULES.get(kind, "the rule that writes it")
        problem = (f"kind {f.attrs.get('kind')!r} (written by rule `{rule}`), expected {kind!r}, which rule "
                   f"`{writer}` writes: the file was replaced by another artifact")
        rule = writer
    if problem:
        f.close()
        raise PosmechError(
            f"artifact {str(p)!r} is not usable: {problem}. Rerun {_rerun(rule)} "
            f"(e.g. `snakemake --forcerun {rule_of(str(rule))}`)"
        )
    return f


def _rerun(analysis: str) -> str:
    """``rule `x``` or, for an analysis of a family (posmech.core.families), ``rule `family`
    (analysis `x`)``."""
    rule = rule_of(str(analysis))
    return f"rule `{rule}`" + (f" (analysis `{analysis}`)" if rule != analysis else "")


def require_datasets(f: h5py.File, path: str | os.PathLike[str], names: list[str]) -> None:
    """Every one of ``names`` is a dataset of ``f``; otherwise a :class:`PosmechError` naming
    the file, what is missing and the rule to rerun (a file edited or damaged after it
    was written: its completion marker alone cannot tell)."""
    missing = [n for n in names if not isinstance(f.get(n), h5py.Dataset)]
    if missing:
        rule = f.attrs.get("rule", "the rule that writes it")
        raise PosmechError(
            f"artifact {str(path)!r} lacks dataset(s) {', '.join(missing)} although it is marked complete "
            f"(edited or damaged after it was written): rerun {_rerun(rule)} "
            f"(`snakemake --forcerun {rule_of(str(rule))}`)"
        )


def attr_json(f: h5py.HLObject, key: str) -> Any:
    """Read an attribute written by :func:`set_attrs` (decoding JSON strings)."""
    v = f.attrs[key]
    if isinstance(v, (bytes, str)):
        s = v.decode() if isinstance(v, bytes) else v
        try:
            return json.loads(s)
        except ValueError:
            return s
    return v.tolist() if isinstance(v, np.ndarray) else v


def describe(f: h5py.Group, descriptions: dict[str, str]) -> None:
    """Set the ``description`` attribute (shape and meaning, one sentence) of datasets of
    ``f``, by path; a name that is not a dataset of ``f`` is an error (a stale text)."""
    for name, text in descriptions.items():
        obj = f.get(name)
        if not isinstance(obj, h5py.Dataset):
            raise PosmechError(f"describe: {f.file.filename!r} has no dataset {name!r} to describe")
        obj.attrs["description"] = text


def undescribed(f: h5py.Group) -> list[str]:
    """Paths of the datasets below ``f`` without a non-empty ``description`` attribute."""
    out: list[str] = []

    def visit(name: str, obj: Any) -> None:
        if isinstance(obj, h5py.Dataset) and not str(obj.attrs.get("description", "")).strip():
            out.append(name)

    f.visititems(visit)
    return out


def preallocated_dataset(
    group: h5py.Group, name: str, shape: tuple[int, ...], dtype: Any, chunks: tuple[int, ...] | None,
    fillvalue: Any = None, write_fill: bool = True, checksum: bool = True,
) -> h5py.Dataset:
    """Create a dataset whose storage is allocated at creation (``H5D_ALLOC_TIME_EARLY``).

    Later writes then only change raw data in place, never the file's structure, so a
    writer killed mid-write (even ``kill -9``) leaves a file that still opens; used by
    resumable writers.  ``chunks=None``: contiguous.  No compression (use
    :func:`copy_compressed` afterwards).  ``write_fill=False``: the fill value is recorded
    but not written (for data the writer overwrites entirely before the file is complete;
    unwritten storage then reads as zeros), which saves writing the dataset twice.
    ``checksum``: chunked datasets carry the fletcher32 filter (contiguous ones cannot)."""
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
    if chunks is not None and checksum:
        dcpl.set_fletcher32()
    if not write_fill:
        dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
    return group.create_dataset(name, shape=shape, dtype=dtype, chunks=chunks, fillvalue=fillvalue, dcpl=dcpl)


def copy_compressed(src: str | os.PathLike[str], dst: str | os.PathLike[str], compression: str,
                    level: int | None = None, block_bytes: int = 64 << 20) -> None:
    """Copy every group, dataset and attribute of ``src`` into a new file ``dst``,
    compressing chunked datasets with ``compression`` (``gzip`` with ``level``, or
    ``lzf``), streaming blocks of about ``block_bytes`` along the first two axes."""
    opts = {"compression": compression}
    if compression == "gzip" and level is not None:
        opts["compression_opts"] = level
    with h5py.File(src, "r") as fs, h5py.File(dst, "w") as fd:
        for k, v in fs.attrs.items():
            fd.attrs[k] = v

        def visit(name: str, obj: Any) -> None:
            if isinstance(obj, h5py.Group):
                g = fd.require_group(name)
            else:
                kw = dict(opts, chunks=obj.chunks, fletcher32=obj.fletcher32) if obj.chunks else {}
                g = fd.create_dataset(name, shape=obj.shape, dtype=obj.dtype, fillvalue=obj.fillvalue, **kw)
                if obj.ndim == 0:
                    g[()] = obj[()]
                elif obj.size and obj.ndim == 1:
                    step = max(1, block_bytes // obj.dtype.itemsize)
                    for i in range(0, obj.shape[0], step):
                        g[i : i + step] = obj[i : i + step]
                elif obj.size:
                    step = max(1, block_bytes // (obj.dtype.itemsize * int(np.prod(obj.shape[2:]))))
                    for i in range(obj.shape[0]):
                        for j in range(0, obj.shape[1], step):
                            g[i, j : j + step] = obj[i, j : j + step]
            for k, v in obj.attrs.items():
                g.attrs[k] = v

        fs.visititems(visit)
