"""One table of head roles per model: ``results/{model}/heads.csv`` (rule ``head_table``).

One row per layer × head with every role the analyses assign, its score and whether it
passes the role's threshold; a role no head passes is filled by none (never by the best of
the rest), and a head that fills no role of a kind says ``none``.  Each input is optional
(``None``: the model is not in that analysis's config section and the columns are left empty):

* ``taxonomy`` (``taxonomy/taxonomy.csv``, P6/P7): score ``prev_token_mass`` (mean attention
  at offset −1), ``prev_token_excess`` (that minus what a uniform causal head gives there),
  role ``previous_token`` (its largest mean diagonal is at offset −1 and the excess is at least
  ``taxonomy.prev_token_min_excess``: ``is_previous_token``, not the post's loose definition),
  ``diagonal_ratio`` (second / largest mean diagonal, smaller = sharper) and ``p7_rank``
  (an integer, empty for a head that is not a previous-token head: ``Int64``);
* ``chosen`` (``taxonomy/heads.csv``, the heads the interventions read): ``p7_chosen``
  (``sharp``, ``early`` or ``none``; ``none`` for a sharp head the taxonomy chose by its fallback
  when no head is a previous-token head: the interventions read it, but it holds no role);
* ``taxa`` (``anatomy/taxa.csv``, P13): scores ``taxon_dip``, ``taxon_bump`` (median dip and
  bump of the score rows), role ``score_taxon`` (dark diagonal, bright sub-diagonal, neither);
* ``etc`` (``kernels/etc.csv``, K3/K4) at query position ``n``: scores ``etc`` and
  ``etc_fraction`` (ETC / n_keys), the type ``kernel_type`` (local, slow_decay, uniform) and
  role ``kernel_role``: the type when it is ``local`` or ``slow_decay`` *and* differs from
  the type of the head's kernel with zero query–key scores (``zero_score_kernel_type``:
  ``uniform``, or for an ALiBi head its bias alone), else ``none`` — a uniform kernel is what
  a random-init head has, and an ALiBi head's own bias is not something its weights do;
* ``classes`` (``contextual/head_classes.csv``, K7, layer 0 only): scores
  ``k7_duplicate_excess``, ``k7_local_mass``, ``k7_etc_fraction``, role ``k7_class``;
* ``roles`` / ``masses`` (``attn_only/head_roles.csv`` and ``random_token_masses.csv``, L1/L4/L5):
  scores ``l_previous_mass``, ``l_offset2_mass``, ``l_induction_score`` and role ``l_role``
  (the role this head fills, ``none`` for none; a role whose best head is below
  ``attn_only.role_min_score`` is filled by no head).

``layer``, ``head`` (int) and ``head_name`` (``L1H0``) name the head, as in every per-head table.
"""

from __future__ import annotations

import pandas as pd

from posmech.analyses.attention import head_name, parse_head
from posmech.analyses.taxonomy import SHARP_FALLBACK_RULE
from posmech.core.errors import PosmechError

HEAD_COLUMNS = ["model", "layer", "head", "head_name",
                "prev_token_mass", "prev_token_excess", "previous_token", "diagonal_ratio", "p7_rank", "p7_chosen",
                "taxon_dip", "taxon_bump", "score_taxon",
                "etc", "etc_fraction", "kernel_type", "kernel_role",
                "k7_duplicate_excess", "k7_local_mass", "k7_etc_fraction", "k7_class",
                "l_previous_mass", "l_offset2_mass", "l_induction_score", "l_role",
                "sink_alpha0", "sink"]

_NEEDS = {
    "taxonomy": ("taxonomy.csv", ("head_name", "is_previous_token", "prev_token_mass", "prev_token_excess", "ratio",
                                  "rank"),
                 "diagonal_taxonomy"),
    "chosen": ("taxonomy/heads.csv", ("head_name", "role"), "diagonal_taxonomy"),
    "taxa": ("taxa.csv", ("head_name", "taxon", "dip", "bump"), "score_taxa"),
    "etc": ("etc.csv", ("head_name", "n", "kernel_type", "zero_score_kernel_type", "etc_mean", "etc_fraction"),
            "etc_table"),
    "classes": ("head_classes.csv", ("head_name", "head_class", "duplicate_excess", "local_mass", "etc_fraction"),
                "layer0_head_classes"),
    "roles": ("head_roles.csv", ("role", "head_name"), "random_token_patterns"),
    "masses": ("random_token_masses.csv", ("head_name", "mass", "value"), "random_token_patterns"),
    "sinks": ("sink_heads.csv", ("head_name", "alpha0_mean", "is_sink"), "attention_sinks"),
}


def _check(key: str, df: pd.DataFrame) -> None:
    name, cols, rule = _NEEDS[key]
    missing = [c for c in cols if c not in df]
    if missing:
        raise PosmechError(f"{name} lacks the column(s) {', '.join(map(repr, missing))}; rerun rule {rule!r}")


def _rules(chosen: pd.DataFrame) -> list[str]:
    """The ``rule`` column of a chosen-heads table (empty strings when it has none)."""
    return [str(r) for r in chosen["rule"]] if "rule" in chosen else [""] * len(chosen)


def _by_name(df: pd.DataFrame) -> pd.DataFrame:
    return df.set_index(df["head_name"].astype(str))


def head_table(model: str, taxonomy: pd.DataFrame | None = None, taxa: pd.DataFrame | None = None,
               etc: pd.DataFrame | None = None, n: int | None = None, classes: pd.DataFrame | None = None,
               roles: pd.DataFrame | None = None, masses: pd.DataFrame | None = None,
               chosen: pd.DataFrame | None = None, sinks: pd.DataFrame | None = None) -> pd.DataFrame:
    """The head-roles table of one model (columns :data:`HEAD_COLUMNS`), from the per-analysis
    tables it has; the heads are those any table names (every table names every head)."""
    given = {"taxonomy": taxonomy, "chosen": chosen, "taxa": taxa, "etc": etc, "classes": classes, "roles": roles,
             "masses": masses, "sinks": sinks}
    for key, df in given.items():
        if df is not None:
            _check(key, df)
    names: set[str] = set()
    for df in (taxonomy, taxa, etc, classes, masses, sinks):
        if df is not None:
            names |= set(df["head_name"].astype(str))
    if not names:
        raise PosmechError(f"model {model!r}: no per-head table to build heads.csv from")
    tx = _by_name(taxonomy) if taxonomy is not None else None
    ta = _by_name(taxa) if taxa is not None else None
    if etc is not None:
        if n is None or not (etc["n"] == n).any():
            raise PosmechError(f"etc.csv has no row at n={n} (kernels.etc_heatmap_position)")
        et = _by_name(etc[etc["n"] == n])
    kc = _by_name(classes) if classes is not None else None
    sk = _by_name(sinks) if sinks is not None else None
    picked = ({str(h): str(r) for r, h, why in zip(chosen["role"], chosen["head_name"], _rules(chosen))
               if why != SHARP_FALLBACK_RULE} if chosen is not None else {})
    role_of = ({str(h): str(r) for r, h in zip(roles["role"], roles["head_name"]) if str(h) != NO_HEAD}
               if roles is not None else {})
    ms = ({(str(h), str(k)): float(v) for h, k, v in zip(masses["head_name"], masses["mass"], masses["value"])}
          if masses is not None else {})
    rows = []
    for name in sorted(names, key=parse_head):
        layer, h = parse_head(name)
        r = {"model": model, "layer": layer, "head": h, "head_name": head_name(layer, h)}
        if tx is not None and name in tx.index:
            t = tx.loc[name]
            r.update(prev_token_mass=float(t["prev_token_mass"]), prev_token_excess=float(t["prev_token_excess"]),
                     previous_token=bool(t["is_previous_token"]),
                     diagonal_ratio=float(t["ratio"]), p7_rank=t["rank"])
        if chosen is not None:
            r["p7_chosen"] = picked.get(name, NO_HEAD)
        if ta is not None and name in ta.index:
            t = ta.loc[name]
            r.update(taxon_dip=float(t["dip"]), taxon_bump=float(t["bump"]), score_taxon=str(t["taxon"]))
        if etc is not None and name in et.index:
            t = et.loc[name]
            kind = str(t["kernel_type"])
            role = kind if kind in KERNEL_ROLES and kind != str(t["zero_score_kernel_type"]) else NO_HEAD
            r.update(etc=float(t["etc_mean"]), etc_fraction=float(t["etc_fraction"]), kernel_type=kind,
                     kernel_role=role)
        if kc is not None and name in kc.index:
            t = kc.loc[name]
            r.update(k7_duplicate_excess=float(t["duplicate_excess"]), k7_local_mass=float(t["local_mass"]),
                     k7_etc_fraction=float(t["etc_fraction"]), k7_class=str(t["head_class"]))
        if masses is not None:
            r.update(l_previous_mass=ms.get((name, "previous")), l_offset2_mass=ms.get((name, "offset_2")),
                     l_induction_score=ms.get((name, "induction_score")), l_role=role_of.get(name, NO_HEAD))
        if sk is not None and name in sk.index:
            r.update(sink_alpha0=float(sk.loc[name, "alpha0_mean"]), sink=bool(sk.loc[name, "is_sink"]))
        rows.append(r)
    df = pd.DataFrame(rows, columns=HEAD_COLUMNS)
    # an integer with gaps (heads that are not previous-token heads have no rank): nullable,
    # so that it is written as 3, not 3.0, and read back as an integer (store.tables.column_types)
    df["p7_rank"] = pd.to_numeric(df["p7_rank"], errors="coerce").astype("Int64")
    return df


#: the kernel types that are roles (``kernel_role``): a uniform kernel is a random head's
KERNEL_ROLES = ("local", "slow_decay")

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
