"""Diagonal taxonomy of attention heads (P6, P7) and the chosen previous-token heads.

Per head, the mean attention on each diagonal offset ``d`` (key = query − d) of the
attention pattern, over documents at full context, accumulated inside the forward pass
by a hook on ``blocks.L.attn.hook_pattern`` (patterns are reduced to ``[n_heads, n]``
diagonal sums as they are produced and never stored).  A head is a *previous-token
head* (P6) when its largest mean diagonal is offset 1; those heads are ranked by
(second-largest mean diagonal) / (largest) (P7, smaller = sharper).

The chosen-heads table (``results/{model}/taxonomy/heads.csv``) is the contract with the
intervention rules: one row per chosen head, columns :data:`HEADS_COLUMNS`, roles
``sharp`` (exactly one) and ``early`` (zero or more); read it with
:func:`read_chosen_heads`.
"""

from __future__ import annotations

import os
import re
from typing import Any

import pandas as pd

from posmech.errors import PosmechError
from posmech.tables import read_table

HEADS_COLUMNS = ["model", "role", "head", "layer", "head_index", "score", "rule"]
ROLES = ("sharp", "early")
HEAD_RE = re.compile(r"^L(\d+)H(\d+)$")


def head_name(layer: int, head: int) -> str:
    """``L{layer}H{head}``."""
    return f"L{int(layer)}H{int(head)}"


def parse_head(name: str, key: str = "head") -> tuple[int, int]:
    """``'L4H11'`` → ``(4, 11)``; :class:`PosmechError` naming ``key`` otherwise."""
    m = HEAD_RE.match(str(name))
    if not m:
        raise PosmechError(f"{key}: {name!r} is not a head name; write heads as L<layer>H<head>, e.g. L4H11")
    return int(m.group(1)), int(m.group(2))


def read_chosen_heads(path: str | os.PathLike[str]) -> dict[str, list[str]]:
    """The chosen heads of a model from ``heads.csv``: ``{"sharp": ["L4H11"], "early": [...]}``
    (both keys always present; heads in the table's order, i.e. best first)."""
    try:
        df = read_table(path)
    except (OSError, ValueError) as err:
        raise PosmechError(
            f"chosen-heads table {str(path)!r} is missing or unreadable ({err}); rerun rule `diagonal_taxonomy`"
        ) from None
    missing = set(HEADS_COLUMNS) - set(df.columns)
    if missing:
        raise PosmechError(
            f"chosen-heads table {str(path)!r} lacks columns {sorted(missing)}; rerun rule `diagonal_taxonomy`"
        )
    out: dict[str, list[str]] = {r: [] for r in ROLES}
    for role, head in zip(df["role"], df["head"]):
        if role not in out:
            raise PosmechError(f"chosen-heads table {str(path)!r}: unknown role {role!r} (expected sharp or early)")
        parse_head(head, f"{path}: head")
        out[role].append(str(head))
    if len(out["sharp"]) != 1:
        raise PosmechError(f"chosen-heads table {str(path)!r} must have exactly one `sharp` row, has {len(out['sharp'])}")
    return out


def chosen_heads_frame(model: str, rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The heads table from dicts with ``role, head, score, rule`` (layer/head_index derived)."""
    out = []
    for r in rows:
        layer, h = parse_head(r["head"])
        out.append({"model": model, "role": r["role"], "head": r["head"], "layer": layer, "head_index": h,
                    "score": r["score"], "rule": r["rule"]})
    return pd.DataFrame(out, columns=HEADS_COLUMNS)
