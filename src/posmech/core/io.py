"""Small I/O helpers: write to a temporary name in the same directory, rename when done."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

#: the repository's root (the package is installed editable from its src/): where
#: resources/, workflow/ and config/ are
REPO = Path(__file__).resolve().parents[3]


@contextlib.contextmanager
def atomic_path(final: str | os.PathLike[str], suffix: str = ".partial") -> Iterator[Path]:
    """Yield a temporary sibling path of ``final``; rename it onto ``final`` only if the
    block finishes without an exception, otherwise remove it.  Works for files and
    directories.  Nothing already at ``final`` is touched unless the block succeeds."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(final.name + suffix)
    _remove(tmp)
    try:
        yield tmp
    except BaseException:
        _remove(tmp)
        raise
    if final.is_dir() and tmp.is_dir():
        shutil.rmtree(final)
    os.replace(tmp, final)


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    elif p.exists() or p.is_symlink():
        p.unlink()


def write_jsonl(path: str | os.PathLike[str], records: Iterable[dict[str, Any]]) -> int:
    """Write ``records`` as JSON lines atomically; return how many were written."""
    n = 0
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for rec in records:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
            n += 1
    return n


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def write_json(path: str | os.PathLike[str], obj: Any) -> None:
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True, default=str)
        f.write("\n")


def file_sha256(path: str | os.PathLike[str]) -> str:
    """sha256 of a file's bytes: how table metadata names an input shipped with the
    repository. Its path is not recorded, because it depends on the working directory
    (``--directory``, a Slurm run, a moved project), and two runs of the same inputs
    must write the same metadata."""
    import hashlib

    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
