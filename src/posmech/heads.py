"""The heads a run found, by role: one table per model from the tables the rules wrote.

:func:`heads_table` reads, under ``results/{model}/`` (whichever exist):

* ``taxonomy/heads.csv`` (P6/P7): the ``sharp`` and ``early`` previous-token heads;
* ``attn_only/head_roles.csv`` (L1): the ``previous``, ``look_back_two`` and
  ``induction`` heads of the attention-only rules;
* ``anatomy/taxa.csv`` (P13): each head's score taxon;
* ``kernels/etc.csv`` (K4): each head's kernel type at the largest query position measured;
* ``contextual/head_classes.csv`` (K7): each layer-0 head's class.

and returns one row per head (``head``, ``layer``, ``head_index``, ``roles``: the roles
with their claim and score, e.g. ``sharp (P7 ratio 0.031); previous (L1 score 0.93)`` — P7's
ratio is second / largest mean diagonal, lower is sharper; L1's score is the criterion of
``head_roles.csv``, e.g. the mean attention at offset −1 — then the columns ``taxon``,
``kernel_type``, ``layer0_class``; empty where a rule did not run).
Shown by ``python -m posmech heads results/MODEL`` (:mod:`posmech.cli`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from posmech.analyses.attention import parse_head
from posmech.errors import PosmechError

#: (relative path, claim, what its ``score`` is): the role tables (``role, head, score``)
ROLE_TABLES = (("taxonomy/heads.csv", "P7", "ratio"), ("attn_only/head_roles.csv", "L1", "score"))
#: (relative path, claim, head column, value column, output column): per-head labels
LABEL_TABLES = (
    ("anatomy/taxa.csv", "P13", "head", "taxon", "taxon"),
    ("kernels/etc.csv", "K4", "head_name", "kernel_type", "kernel_type"),
    ("contextual/head_classes.csv", "K7", "head_name", "head_class", "layer0_class"),
)
COLUMNS = ["head", "layer", "head_index", "roles", "taxon", "kernel_type", "layer0_class"]


def heads_table(model_dir: str | Path) -> pd.DataFrame:
    """One row per head named by any of the tables above under ``model_dir``
    (``results/{model}``), sorted by layer and head; columns :data:`COLUMNS`."""
    d = Path(model_dir)
    if not d.is_dir():
        raise PosmechError(f"{str(d)!r} is not a directory: give a model's results folder, e.g. results/demo")
    roles: dict[str, list[str]] = {}
    labels: dict[str, dict[str, Any]] = {}
    found = []
    for rel, claim, what in ROLE_TABLES:
        path = d / rel
        if not path.is_file():
            continue
        found.append(rel)
        for r in pd.read_csv(path).to_dict("records"):
            roles.setdefault(str(r["head"]), []).append(f"{r['role']} ({claim} {what} {float(r['score']):.3g})")
    for rel, _claim, head_col, value_col, out in LABEL_TABLES:
        path = d / rel
        if not path.is_file():
            continue
        found.append(rel)
        df = pd.read_csv(path)
        if "n" in df and rel.startswith("kernels/"):
            df = df[df["n"] == df["n"].max()]
        for r in df.to_dict("records"):
            labels.setdefault(str(r[head_col]), {})[out] = r[value_col]
    if not found:
        wanted = ", ".join(rel for rel, *_ in (*ROLE_TABLES, *LABEL_TABLES))
        raise PosmechError(f"no head table under {str(d)!r} (looked for {wanted}); run the pipeline for this "
                           "model first, or give the folder results/<model>")
    rows = []
    for head in set(roles) | set(labels):
        layer, h = parse_head(head)
        rows.append({"head": head, "layer": layer, "head_index": h, "roles": "; ".join(roles.get(head, [])),
                     **{c: labels.get(head, {}).get(c, "") for c in ("taxon", "kernel_type", "layer0_class")}})
    out = pd.DataFrame(rows, columns=COLUMNS).sort_values(["layer", "head_index"]).reset_index(drop=True)
    out.attrs["sources"] = found
    return out
