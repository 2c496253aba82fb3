"""One table of head roles per model: ``results/{model}/head_table.csv`` (rule ``head_table``).

One row per layer × head with every role the analyses assign, its score and whether it
passes the role's threshold; a role no head passes is filled by none (never by the best of
the rest).  Each input is optional (``None``: the model is not in that analysis's config
section and the columns are left empty):

* ``taxonomy`` (``taxonomy/taxonomy.csv``, P6/P7): ``previous_token`` (largest mean diagonal at
  offset −1), ``diagonal_ratio`` (second / largest mean diagonal), ``p7_rank``;
* ``taxa`` (``anatomy/taxa.csv``, P13): ``score_taxon``;
* ``etc`` (``kernels/etc.csv``, K3/K4) at query position ``n``: ``kernel_type``, ``etc``;
* ``classes`` (``contextual/head_classes.csv``, K7, layer 0 only): ``k7_class``;
* ``roles`` / ``masses`` (``attn_only/head_roles.csv`` and ``random_token_masses.csv``, L1/L4/L5):
  ``l_previous_mass``, ``l_offset2_mass``, ``l_induction_score`` and ``l_role`` (the role this
  head fills, ``""`` for none; a role below ``attn_only.role_min_score`` is filled by no head).

``layer``, ``head`` (int) and ``head_name`` (``L1H0``) name the head, as in every per-head table.
"""

from __future__ import annotations

import pandas as pd

from posmech.analyses.attention import head_name, parse_head
from posmech.errors import PosmechError

HEAD_COLUMNS = ["model", "layer", "head", "head_name", "previous_token", "diagonal_ratio", "p7_rank", "score_taxon",
                "kernel_type", "etc", "k7_class", "l_previous_mass", "l_offset2_mass", "l_induction_score", "l_role"]


def _by_name(df: pd.DataFrame, name_col: str, source: str) -> pd.DataFrame:
    if name_col not in df:
        raise PosmechError(f"{source} lacks the column {name_col!r}; rerun the rule that writes it")
    return df.set_index(df[name_col].astype(str))


def head_table(model: str, taxonomy: pd.DataFrame | None = None, taxa: pd.DataFrame | None = None,
               etc: pd.DataFrame | None = None, n: int | None = None, classes: pd.DataFrame | None = None,
               roles: pd.DataFrame | None = None, masses: pd.DataFrame | None = None) -> pd.DataFrame:
    """The head-roles table of one model (columns :data:`HEAD_COLUMNS`), from the per-analysis
    tables it has; the heads are those any table names (every table names every head)."""
    names: set[str] = set()
    if taxonomy is not None:
        names |= set(taxonomy["head_name"].astype(str))
    if taxa is not None:
        names |= set(taxa["head_name"].astype(str))
    if etc is not None:
        names |= set(etc["head_name"].astype(str))
    if classes is not None:
        names |= set(classes["head_name"].astype(str))
    if masses is not None:
        names |= set(masses["head_name"].astype(str))
    if not names:
        raise PosmechError(f"model {model!r}: no per-head table to build heads.csv from")
    rows = []
    tx = _by_name(taxonomy, "head_name", "taxonomy.csv") if taxonomy is not None else None
    ta = _by_name(taxa, "head_name", "taxa.csv") if taxa is not None else None
    if etc is not None:
        if n is None or not (etc["n"] == n).any():
            raise PosmechError(f"etc.csv has no row at n={n} (kernels.etc_heatmap_position)")
        et = _by_name(etc[etc["n"] == n], "head_name", "etc.csv")
    kc = _by_name(classes, "head_name", "head_classes.csv") if classes is not None else None
    role_of = ({str(h): str(r) for r, h in zip(roles["role"], roles["head_name"]) if str(h) != "none"}
               if roles is not None else {})
    ms = ({(str(h), str(k)): float(v) for h, k, v in zip(masses["head_name"], masses["mass"], masses["value"])}
          if masses is not None else {})
    for name in sorted(names, key=parse_head):
        layer, h = parse_head(name)
        r = {"model": model, "layer": layer, "head": h, "head_name": head_name(layer, h)}
        if tx is not None and name in tx.index:
            t = tx.loc[name]
            r.update(previous_token=bool(t["is_previous_token"]), diagonal_ratio=float(t["ratio"]),
                     p7_rank=t["rank"])
        if ta is not None and name in ta.index:
            r["score_taxon"] = str(ta.loc[name, "taxon"])
        if etc is not None and name in et.index:
            r.update(kernel_type=str(et.loc[name, "kernel_type"]), etc=float(et.loc[name, "etc_mean"]))
        if kc is not None and name in kc.index:
            r["k7_class"] = str(kc.loc[name, "head_class"])
        if masses is not None:
            r.update(l_previous_mass=ms.get((name, "previous")), l_offset2_mass=ms.get((name, "offset_2")),
                     l_induction_score=ms.get((name, "induction_score")), l_role=role_of.get(name, ""))
        rows.append(r)
    return pd.DataFrame(rows, columns=HEAD_COLUMNS)


#: ``head_name`` of a row that names no head (e.g. a role no head fills); its ``layer`` and
#: ``head`` are empty
NO_HEAD = "none"


def head_column_problems(df: pd.DataFrame) -> list[str]:
    """What breaks the per-head column contract in ``df`` (empty list: none).

    A table that names heads has ``layer`` and ``head`` (integers) and ``head_name``
    (``f"L{layer}H{head}"``; :data:`NO_HEAD` with empty ``layer`` and ``head`` for a row that
    names no head); ``head`` is never the name string and ``head_index`` is not used.  A table
    with neither ``head`` nor ``head_name`` names no head and passes, and so does an empty table (e.g. one written when the object is
    absent on a model: its columns read back untyped)."""
    cols = set(df.columns)
    if "head_index" in cols:
        return ["has a `head_index` column (the head's number is `head`)"]
    if not cols & {"head", "head_name"}:
        return []
    missing = [c for c in ("layer", "head", "head_name") if c not in cols]
    if missing:
        return [f"names heads but lacks {', '.join(f'`{c}`' for c in missing)}"]
    problems = []
    named = df["head_name"].astype(str) != NO_HEAD
    for c in ("layer", "head"):
        values = df.loc[named, c]
        if len(values) and (not pd.api.types.is_integer_dtype(values.dropna()) or values.isna().any()):
            problems.append(f"`{c}` is not an integer on every row that names a head (dtype {df[c].dtype})")
        if df.loc[~named, c].notna().any():
            problems.append(f"`{c}` is set on a row whose head_name is {NO_HEAD!r}")
    if not problems:
        expected = [head_name(a, b) for a, b in zip(df.loc[named, "layer"], df.loc[named, "head"])]
        bad = [(got, want) for got, want in zip(df.loc[named, "head_name"].astype(str), expected) if got != want]
        if bad:
            problems.append(f"head_name disagrees with layer/head, e.g. {bad[0][0]!r} vs L{{layer}}H{{head}} = {bad[0][1]!r}")
    return problems
