"""Tidy CSV tables with metadata, and the scorecard rows every analysis emits.

Tables are tidy (one row per observation) with a ``claim`` and a ``model`` column; every
CSV is plain (``pandas.read_csv(path)`` reads it, no comment lines).  Table-level metadata
(e.g. the centring used, a rank correlation) goes to a JSON sidecar next to it,
``NAME.meta.json`` for ``NAME.csv`` (:func:`meta_path`); :func:`read_table` returns it in
``df.attrs``.

Column types plain ``pandas.read_csv`` cannot see are recorded in the sidecar under
:data:`COLUMN_TYPES` and restored by :func:`read_table`: ``"str"`` for a text column whose
values look like numbers (e.g. ``"000"``), ``"Int64"`` for an integer column with missing
values (plain pandas reads it as float; :func:`read_table` as pandas' nullable integer).

Scorecard rows (``results/{model}/scorecard/{rule}.csv``) are what the report compares
with ``resources/published.yaml``: columns ``claim, model, quantity, value, detail,
artifact`` where ``value`` is a number, or JSON (a list for head sets such as
``["L0H3", "L0H4"]``), ``detail`` free text and ``artifact`` the path of the figure or
table that shows it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pandas as pd

from posmech.core.errors import PosmechError
from posmech.core.io import atomic_path, write_json

META_SUFFIX = ".meta.json"
COLUMN_TYPES = "column_types"
#: the sidecar key holding the sha256 of the CSV's bytes as written (:func:`write_table`):
#: :func:`read_table` refuses a table whose bytes differ (edited or damaged after it was written)
SHA256 = "sha256"
SCORECARD_COLUMNS = ["claim", "model", "quantity", "value", "detail", "artifact"]


def meta_path(path: str | os.PathLike[str]) -> Path:
    """The metadata sidecar of a table: ``dir/NAME.meta.json`` for ``dir/NAME.csv``."""
    p = Path(path)
    return p.with_name(p.stem + META_SUFFIX)


def write_table(df: pd.DataFrame, path: str | os.PathLike[str], meta: dict[str, Any] | None = None) -> None:
    """Write ``df`` as a plain CSV atomically, and its JSON sidecar (:func:`meta_path`):
    ``meta`` (when given), the column types plain pandas would misread (:data:`COLUMN_TYPES`)
    and the sha256 of the CSV's bytes (:data:`SHA256`, the integrity record
    :func:`read_table` checks)."""
    side = meta_path(path)
    types = column_types(df)
    meta = {**(meta or {}), **({COLUMN_TYPES: types} if types else {})}
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8", newline="") as f:
            df.to_csv(f, index=False)
        write_json(side, {**meta, SHA256: file_sha256(tmp)})


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The sha256 of a file's bytes (hex)."""
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def check_integrity(path: str | os.PathLike[str], meta: dict[str, Any]) -> None:
    """Refuse the table at ``path`` when its bytes differ from the sha256 its sidecar recorded
    when it was written (an edit, a truncation, a damaged disk): the error names the file and
    how to regenerate it. A table written before the record existed (no :data:`SHA256`) passes."""
    want = meta.get(SHA256)
    if want is not None and file_sha256(path) != want:
        raise PosmechError(
            f"table {str(path)!r} was changed after it was written (its bytes differ from the sha256 in "
            f"{meta_path(path).name}); verdicts are not computed from an edited table. Regenerate it: "
            f"`snakemake -f {path}` (or delete it and rerun). To study an edited copy, save it under another name "
            "(docs/artifacts.md, \"CSV tables\")")


def _numeric_text(v: Any) -> bool:
    if not isinstance(v, str):
        return False
    try:
        float(v)
    except ValueError:
        return False
    return True


def column_types(df: pd.DataFrame) -> dict[str, str]:
    """The columns of ``df`` whose type plain ``pandas.read_csv`` would not read back:
    ``{"col": "str"}`` for text that looks numeric, ``{"col": "Int64"}`` for integers with
    missing values."""
    out = {}
    for c in df.columns:
        s = df[c]
        if str(s.dtype) == "Int64" and s.isna().any():
            out[str(c)] = "Int64"
        elif (s.dtype == object or pd.api.types.is_string_dtype(s)) and any(_numeric_text(v) for v in s.dropna()):
            out[str(c)] = "str"
    return out


def read_meta(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The metadata of the table at ``path`` (``{}`` when it has no sidecar)."""
    side = meta_path(path)
    if not side.exists():
        return {}
    try:
        meta = json.loads(side.read_text(encoding="utf-8"))
    except ValueError as err:
        raise PosmechError(
            f"table metadata {str(side)!r} is not valid JSON ({err}); rerun the rule that writes {str(path)!r}"
        ) from None
    if not isinstance(meta, dict):
        raise PosmechError(f"table metadata {str(side)!r} must hold a JSON object; rerun the rule that writes it")
    return meta


def read_table(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Read a table written by :func:`write_table` with its column types (:data:`COLUMN_TYPES`
    in the sidecar), after checking its bytes against the sidecar's sha256
    (:func:`check_integrity`); the rest of its metadata in ``df.attrs``."""
    meta = read_meta(path)
    check_integrity(path, meta)
    meta.pop(SHA256, None)
    types = meta.pop(COLUMN_TYPES, {})
    df = pd.read_csv(path, dtype={c: str for c, t in types.items() if t == "str"})
    for c, t in types.items():
        if t != "str" and c in df:
            df[c] = df[c].astype(t)
    df.attrs.update(meta)
    return df


def changed_tables(root: str | os.PathLike[str]) -> list[str]:
    """Every table under ``root`` whose bytes differ from the sha256 its sidecar recorded
    (:func:`check_integrity`), as paths: what a run must not read."""
    out = []
    for side in sorted(Path(root).rglob("*" + META_SUFFIX)):
        table = side.with_name(side.name[: -len(META_SUFFIX)] + ".csv")
        if not table.is_file():
            continue
        try:
            check_integrity(table, read_meta(table))
        except PosmechError:
            out.append(str(table))
    return out


def claim_columns(df: pd.DataFrame, claim: str | pd.Series, model: str) -> pd.DataFrame:
    """Put the columns ``claim`` (one claim for every row, or a claim per row) and ``model`` in
    front of an analysis's table ``df``, in place (the frame the library returned goes on to
    the figure and the scorecard with them); returns ``df``."""
    df.insert(0, "model", model)
    df.insert(0, "claim", claim)
    return df


def scorecard_rows(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """A scorecard frame from dicts with keys ``claim, model, quantity, value`` (and
    optionally ``detail``, ``artifact``); list/dict values are JSON-encoded."""
    out = []
    for r in rows:
        v = r["value"]
        out.append(
            {
                "claim": r["claim"],
                "model": r["model"],
                "quantity": r["quantity"],
                "value": json.dumps(v) if isinstance(v, (list, dict)) else v,
                "detail": r.get("detail", ""),
                "artifact": r.get("artifact", ""),
            }
        )
    return pd.DataFrame(out, columns=SCORECARD_COLUMNS)


def not_measurable_rows(claim: str, model: str, why: str, quantities: list[str] | tuple[str, ...],
                        artifact: str) -> pd.DataFrame:
    """The scorecard rows of a claim the model lacks the object of: one per quantity, without a
    value, with ``why`` (in words) as the detail — the findings read them as not measurable."""
    return scorecard_rows([{"claim": claim, "model": model, "quantity": q, "value": None, "detail": why,
                            "artifact": artifact} for q in quantities])
