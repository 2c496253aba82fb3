"""Tidy CSV tables with metadata, and the scorecard rows every analysis emits.

Tables are tidy (one row per observation) with a ``claim`` and a ``model`` column.
Table-level metadata (e.g. the centring used, a rank correlation) is written as leading
``# key: <json>`` comment lines; :func:`read_table` returns it in ``df.attrs``
(pandas users: ``pd.read_csv(path, comment="#")``).

Scorecard rows (``results/{model}/scorecard/{rule}.csv``) are what the report compares
with ``resources/published.yaml``: columns ``claim, model, quantity, value, detail,
artifact`` where ``value`` is a number, or JSON (a list for head sets such as
``["L0H3", "L0H4"]``), ``detail`` free text and ``artifact`` the path of the figure or
table that shows it.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pandas as pd

from posmech.io import atomic_path

SCORECARD_COLUMNS = ["claim", "model", "quantity", "value", "detail", "artifact"]


def write_table(df: pd.DataFrame, path: str | os.PathLike[str], meta: dict[str, Any] | None = None) -> None:
    """Write ``df`` as CSV atomically, preceded by ``# key: json`` metadata lines."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="") as f:
        for k, v in (meta or {}).items():
            f.write(f"# {k}: {json.dumps(v, default=str)}\n")
        df.to_csv(f, index=False)


def read_table(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Read a table written by :func:`write_table`; metadata in ``df.attrs``."""
    meta: dict[str, Any] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.startswith("# "):
                break
            k, _, v = line[2:].partition(": ")
            meta[k] = json.loads(v)
    df = pd.read_csv(path, comment=None, skiprows=len(meta))
    df.attrs.update(meta)
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
