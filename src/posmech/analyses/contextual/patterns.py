"""Claims K6 and K7 on the layer-0 decomposition: the positional patterns of layer-0 heads
(rule ``layer0_positional_patterns``) and the head classes (rule ``layer0_head_classes``),
with their scorecard rows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from posmech.analyses.attention import head_name
from posmech.analyses.contextual.decomposition import Layer0File, TextKeys, decompose, etc, renormalised, tv
from posmech.analyses.contextual.weights import Layer0Weights
from posmech.core.errors import PosmechError

CLASSES = ("duplicate_token", "detokenization", "contextual", "other")


# --------------------------------------------------------------------------- K6
def window_grid(row: np.ndarray, n: int, window: int) -> np.ndarray:
    """The last ``window`` keys ``n − window + 1..n`` of a pattern row (NaN before key 0),
    for drawing as a ``√window × √window`` grid read row by row (the post's 20 × 20)."""
    out = np.full(window, np.nan)
    lo = max(0, n - window + 1)
    out[window - (n + 1 - lo):] = row[lo : n + 1]
    return out


def positional_patterns(w: Layer0Weights, s: float, ids: np.ndarray, positions: Sequence[int], destination: int,
                        window: int, k0: int) -> tuple[dict[int, dict[str, np.ndarray]], pd.DataFrame]:
    """K6 at each ``n`` of ``positions`` on text ``ids``: the positional pattern of the
    fixed ``destination`` token, that of the text's own token at ``n``, and the real
    (exact) attention row of that text, as ``[H, window]`` grids; and per head and ``n`` the
    ETC of each positional pattern, TV(positional pattern of the fixed token, real row) and
    TV between the two destination tokens' patterns (all over keys ``k0..n``, renormalised)."""
    grids: dict[int, dict[str, np.ndarray]] = {}
    rows = []
    for n in positions:
        fixed = decompose(w, s, ids, [n], destination)
        own = decompose(w, s, ids, [n], None)
        p_f, p_o, real = fixed.p[:, 0], own.p[:, 0], own.attention[:, 0]
        grids[int(n)] = {k: np.stack([window_grid(r, int(n), window) for r in a])
                         for k, a in (("fixed", p_f), ("own", p_o), ("real", real))}
        rf, ro, rr = (renormalised(a, k0) for a in (p_f, p_o, real))
        for h in range(w.n_heads):
            rows.append({"head": h, "n": int(n), "n_keys": int(n) - k0 + 1, "own_token_id": int(ids[n]),
                         "etc_fixed": float(etc(rf[h])), "etc_own": float(etc(ro[h])), "etc_real": float(etc(rr[h])),
                         "tv_fixed_vs_real": float(tv(rf[h], rr[h])), "tv_fixed_vs_own": float(tv(rf[h], ro[h])),
                         "tv_own_vs_real": float(tv(ro[h], rr[h])),
                         "real_mass_bos": float(real[h, 0]), "positional_mass_bos": float(p_f[h, 0])})
    return grids, pd.DataFrame(rows)


def positional_pattern_table(df: pd.DataFrame, model: str, tokenizer: Any) -> pd.DataFrame:
    """K6's table from the per (head, n) rows of :func:`positional_patterns`, in place: the
    columns ``claim`` (K6), ``model``, ``layer`` (0) and ``head_name`` put in front, and
    ``own_token`` (the text's own token at ``n``, decoded by ``tokenizer``) added; returns
    ``df``."""
    df.insert(0, "claim", "K6")
    df.insert(1, "model", model)
    df.insert(2, "layer", 0)
    df.insert(4, "head_name", [head_name(0, h) for h in df["head"]])
    df["own_token"] = [tokenizer.decode([int(t)]) for t in df["own_token_id"]]
    return df


# --------------------------------------------------------------------------- K7
def duplicate_scores(w: Layer0Weights, s: float, texts: Sequence[np.ndarray], max_position: int,
                     block: int = 128) -> tuple[np.ndarray, np.ndarray, int]:
    """Duplicate-token behaviour of every layer-0 head on real texts (each with its own
    destination tokens): over every destination ``n`` in ``1..max_position`` that has an
    earlier copy of its token at keys ``1..n−1``, the real attention mass on those copies
    (``dup_mass``) and the same mass under the positional pattern alone (what position
    would give them); returns ``dup_mass [H]``, ``excess [H] = dup_mass − positional mass``
    (the part the content score adds) and the number of such destinations.  None → error."""
    H = w.n_heads
    mass, pmass, count = np.zeros(H), np.zeros(H), 0
    for ids in texts:
        ids = np.asarray(ids, dtype=np.int64)
        pos_all = np.arange(1, min(max_position, len(ids) - 1) + 1)
        keys = TextKeys.of(w, s, ids[: int(pos_all.max()) + 1])
        for a in range(0, len(pos_all), block):
            pos = pos_all[a : a + block]
            K = int(pos.max()) + 1
            ki = np.arange(K)
            dup = (ids[None, :K] == ids[pos][:, None]) & (ki[None, :] >= 1) & (ki[None, :] < pos[:, None])
            has = dup.any(axis=1)
            if not has.any():
                continue
            dec = decompose(w, s, ids, pos, None, keys)
            mass += (dec.attention * dup).sum(axis=-1)[:, has].sum(axis=1)
            pmass += (dec.p * dup).sum(axis=-1)[:, has].sum(axis=1)
            count += int(has.sum())
    if count == 0:
        raise PosmechError("no destination position of the texts has an earlier copy of its token: the duplicate-"
                           "token score would be an average over nothing; use longer texts (`contextual.texts`)")
    return mass / count, (mass - pmass) / count, count


def classify(dup_excess: np.ndarray, local_mass: np.ndarray, etc_fraction: np.ndarray, duplicate_min_excess: float,
             local_min_mass: float, uniform_min_fraction: float) -> np.ndarray:
    """K7 classes, in this order: ``duplicate_token`` when the content score adds at least
    ``duplicate_min_excess`` attention to earlier copies of the destination token;
    else ``detokenization`` when the positional pattern puts at least ``local_min_mass`` on
    the last few keys (a local kernel); else ``contextual`` when the positional pattern is
    spread but not uniform (ETC / n_keys below ``uniform_min_fraction``); else ``other``."""
    out = np.full(len(dup_excess), "other", dtype=object)
    for h in range(len(out)):
        if dup_excess[h] >= duplicate_min_excess:
            out[h] = "duplicate_token"
        elif local_mass[h] >= local_min_mass:
            out[h] = "detokenization"
        elif etc_fraction[h] < uniform_min_fraction:
            out[h] = "contextual"
    return out


def head_classes(dec: Layer0File, dup_mass: np.ndarray, dup_excess: np.ndarray, n_dup: int, n: int, k0: int,
                 local_window: int, thresholds: dict[str, float], model: str) -> pd.DataFrame:
    """K7 table: one row per layer-0 head with every measured quantity and its class.
    Positional quantities come from the stored positional pattern of the fixed destination
    token at position ``n`` over keys ``k0..n`` (renormalised): ETC, ETC / n_keys, the mass on
    the last ``local_window`` keys (``n − local_window + 1..n``)."""
    p = renormalised(dec.pattern(n), k0)
    e = etc(p)
    frac = e / p.shape[-1]
    local = p[:, -local_window:].sum(axis=-1)
    cls = classify(dup_excess, local, frac, thresholds["duplicate_min_excess"], thresholds["local_min_mass"],
                   thresholds["uniform_min_fraction"])
    H = len(cls)
    return pd.DataFrame({"claim": "K7", "model": model, "layer": 0, "head": np.arange(H),
                         "head_name": [head_name(0, h) for h in range(H)], "n": n, "n_keys": p.shape[-1],
                         "duplicate_mass": dup_mass, "duplicate_excess": dup_excess, "n_duplicate_destinations": n_dup,
                         "etc": e, "etc_fraction": frac, "local_mass": local, "head_class": cls})


# --------------------------------------------------------------------------- scorecard rows (K6, K7)
HEAD_CLASS_QUANTITIES = {"detokenization": "detokenization_heads", "contextual": "contextual_heads",
                         "duplicate_token": "duplicate_token_heads", "other": "other_heads"}


def head_class_scorecard(classes: pd.DataFrame, thresholds: dict[str, float], local_window: int, n: int,
                         n_duplicates: int, model: str, artifact: str) -> list[dict[str, Any]]:
    """K7 rows from :func:`head_classes`' table: for each class, the quantity
    :data:`HEAD_CLASS_QUANTITIES` names is the list of the layer-0 heads in that class (e.g.
    ``contextual_heads``); the detail gives the thresholds, the local window, the position
    ``n`` classified at and the number of destinations with an earlier copy of their token
    the duplicate score is measured over."""
    return [{"claim": "K7", "model": model, "quantity": q,
             "value": classes[classes["head_class"] == c]["head_name"].tolist(),
             "detail": f"thresholds {thresholds}, local window {local_window}, n = {n}; "
             f"duplicate score over {n_duplicates} destinations with an earlier copy", "artifact": artifact}
            for c, q in HEAD_CLASS_QUANTITIES.items()]


def positional_pattern_scorecard(table: pd.DataFrame, positions: Sequence[int], title: str, destination_token: str,
                                 model: str, figure: str, artifact: str) -> list[dict[str, Any]]:
    """K6 rows of rule layer0_positional_patterns from :func:`positional_patterns`' table
    (with ``head_name``), at the largest of the figure's ``positions`` ``n``:

    * ``layer0_pattern_grids`` — the word ``figures`` (the grids at ``positions`` on ``title``);
    * ``tv_fixed_token_vs_real_row`` — per head, the total-variation distance between the
      positional pattern of the fixed destination token and the real attention row;
    * ``tv_between_destination_tokens`` — per head, the total-variation distance between the
      positional patterns of the fixed destination token and of the text's own token."""
    n = max(positions)
    at = table[table["n"] == n]
    rows = [{"claim": "K6", "quantity": "layer0_pattern_grids", "value": "figures",
             "detail": f"n = {sorted(positions)} on {title}", "artifact": figure},
            {"claim": "K6", "quantity": "tv_fixed_token_vs_real_row",
             "value": {r.head_name: round(r.tv_fixed_vs_real, 4) for r in at.itertuples()},
             "detail": f"TV(positional pattern of {destination_token!r}, real attention row) at n = {n}",
             "artifact": artifact},
            {"claim": "K6", "quantity": "tv_between_destination_tokens",
             "value": {r.head_name: round(r.tv_fixed_vs_own, 4) for r in at.itertuples()},
             "detail": f"TV between the positional patterns of {destination_token!r} and of the text's own "
             f"token at n = {n}", "artifact": artifact}]
    return [{**r, "model": model} for r in rows]
