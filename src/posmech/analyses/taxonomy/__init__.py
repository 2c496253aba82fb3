"""The taxonomy family's library (docs/workflow.md, "Families"): this module is the diagonal
taxonomy (analysis ``diagonal_taxonomy``); :mod:`posmech.analyses.taxonomy.statistics` is the
family's first analysis, ``attention_statistics`` (the forward pass shared with the anatomy
family's score taxa).

Diagonal taxonomy of attention heads (P6, P7) and the chosen previous-token heads.

Per head, the mean attention on each diagonal offset ``d`` (key = query − d) of the
attention pattern, over documents at full context, accumulated inside the forward pass
by a hook on ``blocks.L.attn.hook_pattern`` (patterns are reduced to ``[n_heads, n]``
diagonal sums as they are produced and never stored).

Two definitions of a previous-token head, both written:

* the post's own (``is_previous_token_post``): the largest mean diagonal is offset 1,
  however weak.  A nearly uniform causal head has it half the time: a uniform head gives
  query ``i`` a share ``1/(i+1)`` on each of its keys, so offsets 0 and 1 get exactly the
  same mean (:func:`uniform_baseline`) and noise decides.  The scorecard's comparison with
  the post's published numbers reads this one (quantities ``*_post``);
* the finding's and the roles' (``is_previous_token``): the post's, *and* the head's mean
  attention at offset 1 exceeds what a uniform causal head gives there on the same
  documents and positions (:func:`uniform_baseline`) by at least ``min_excess``
  (``taxonomy.prev_token_min_excess``): a random-init head, close to uniform, does not pass.

The previous-token heads are ranked by (second-largest mean diagonal) / (largest) (P7,
smaller = sharper): ``rank`` among the finding's heads, ``rank_post`` among the post's.

The chosen-heads table (``results/{model}/taxonomy/heads.csv``) is the contract with the
intervention rules: one row per chosen head, columns :data:`HEADS_COLUMNS`, roles
``sharp`` (exactly one) and ``early`` (zero or more); read it with
:func:`read_chosen_heads`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from posmech.analyses.attention import head_name, parse_head, run_collectors
from posmech.core.errors import PosmechError, mean_over
from posmech.store.tables import read_table

HEADS_COLUMNS = ["model", "role", "layer", "head", "head_name", "score", "rule"]
ROLES = ("sharp", "early")


def read_chosen_heads(path: str | os.PathLike[str]) -> dict[str, list[str]]:
    """The chosen heads of a model from ``heads.csv``: ``{"sharp": ["L4H11"], "early": [...]}``
    (both keys always present; heads in the table's order, i.e. best first)."""
    try:
        df = read_table(path)
    except (OSError, ValueError) as err:
        raise PosmechError(
            f"chosen-heads table {str(path)!r} is missing or unreadable ({err}); rerun rule `taxonomy` (analysis `diagonal_taxonomy`)"
        ) from None
    missing = set(HEADS_COLUMNS) - set(df.columns)
    if missing:
        raise PosmechError(
            f"chosen-heads table {str(path)!r} lacks columns {sorted(missing)}; rerun rule `taxonomy` (analysis `diagonal_taxonomy`)"
        )
    out: dict[str, list[str]] = {r: [] for r in ROLES}
    for role, head in zip(df["role"], df["head_name"]):
        if role not in out:
            raise PosmechError(f"chosen-heads table {str(path)!r}: unknown role {role!r} (expected sharp or early)")
        parse_head(head, f"{path}: head_name")
        out[role].append(str(head))
    if len(out["sharp"]) != 1:
        raise PosmechError(f"chosen-heads table {str(path)!r} must have exactly one `sharp` row, has {len(out['sharp'])}")
    return out


def chosen_heads_frame(model: str, rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The heads table from dicts with ``role, head_name, score, rule`` (``layer``, ``head`` derived)."""
    out = []
    for r in rows:
        layer, h = parse_head(r["head_name"], "head_name")
        out.append({"model": model, "role": r["role"], "layer": layer, "head": h, "head_name": r["head_name"],
                    "score": r["score"], "rule": r["rule"]})
    return pd.DataFrame(out, columns=HEADS_COLUMNS)


# --------------------------------------------------------------------------- accumulation
ROW_BLOCK = 128


def diagonal_sums(pattern: Any) -> Any:
    """Sum of a causal attention pattern on each diagonal offset.

    ``pattern``: torch tensor ``[..., n, n]`` (query, key), exactly zero above the main
    diagonal (as softmax of masked scores is).  Returns ``[..., n]``: entry ``d`` is
    ``sum_i pattern[..., i, i - d]`` (offset ``d``, key ``d`` positions before the query).

    One pass over the pattern, no copy: flattened, entry ``(i, j)`` has index
    ``i·n + j ≡ j − i (mod n + 1)``, so viewing the first ``n² − 1`` entries as rows of
    ``n + 1`` puts each lower diagonal in its own column (the masked upper triangle,
    all zeros, shares columns with them).  The sums are accumulated in float64 (the result
    is float64 whatever the pattern's dtype).
    """
    import torch

    n = pattern.shape[-1]
    lead = tuple(pattern.shape[:-2])
    flat = pattern.reshape(*lead, n * n)
    if n == 1:
        return flat.to(torch.float64)
    # float64 accumulation: float32 sums of ~1000 entries carry ~1e-7 relative error,
    # enough to decide the argmax between offsets whose exact means are equal.  Blocks of
    # rows are converted and summed one at a time: `.sum(dtype=float64)` of the strided view
    # costs 14x a float32 sum, blockwise conversion 2.5x (gpt2 shape: 0.14 s per document)
    rows = flat[..., : n * n - 1].reshape(*lead, n - 1, n + 1)
    cols = torch.zeros(*lead, n + 1, dtype=torch.float64, device=pattern.device)  # [..., n + 1]
    for start in range(0, n - 1, ROW_BLOCK):
        cols += rows[..., start : start + ROW_BLOCK, :].to(torch.float64).sum(-2)
    cols[..., 0] += flat[..., -1].to(torch.float64)  # the last main-diagonal entry (n-1, n-1)

    idx = torch.remainder(-torch.arange(n, device=pattern.device), n + 1)
    return cols[..., idx]


@dataclass
class DiagonalStats:
    """Running sums of a diagonal taxonomy.

    ``sums [n_layers, n_heads, n_offsets]`` float64: attention on offset ``d`` summed over
    documents and query positions; ``counts [n_offsets]`` int64: number of (document,
    query) entries on offset ``d``; ``detector_sum [n_layers, n_heads]``: sum over
    documents of TransformerLens's ``head_detector`` previous-token score (``"mul"``
    measure, no exclusions); ``n_documents``, ``n_tokens``.
    """

    sums: np.ndarray
    counts: np.ndarray
    detector_sum: np.ndarray
    n_documents: int = 0
    n_tokens: int = 0

    def means(self) -> np.ndarray:
        """Mean attention per offset ``[n_layers, n_heads, n_offsets]`` (NaN where no entry)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.counts > 0, self.sums / np.maximum(self.counts, 1), np.nan)

    def detector_scores(self) -> np.ndarray:
        """Mean ``head_detector`` previous-token score per head ``[n_layers, n_heads]``."""
        return mean_over(self.detector_sum, self.n_documents,
                         "the head_detector scores of `diagonal_taxonomy`: no document was measured "
                         "(check `taxonomy.corpus`, `taxonomy.n_documents`, `taxonomy.context`)")


def add_pattern(stats: DiagonalStats, layer: int, pattern: Any, exclude_first_query: bool = True) -> None:
    """Add one batch of layer ``layer``'s patterns (torch ``[batch, n_heads, n, n]``, causal)
    to ``stats.sums`` and ``stats.detector_sum`` (float64 throughout; counts are the
    caller's).  ``exclude_first_query``: query 0's entry (offset 0, weight 1) is removed
    from the offset-0 sum before anything is rounded."""
    import torch

    ds = diagonal_sums(pattern)  # [b, H, n] float64
    det = ds[..., 1] / ds.sum(-1) if ds.shape[-1] > 1 else torch.zeros_like(ds[..., 0])
    if exclude_first_query:
        ds[..., 0] -= pattern[..., 0, 0].to(torch.float64)
    n = ds.shape[-1]
    stats.sums[layer, :, :n] += ds.sum(0).cpu().numpy()
    stats.detector_sum[layer] += det.sum(0).cpu().numpy()


class DiagonalCollector:
    """A :class:`~posmech.analyses.attention.Collector` of diagonal sums: hooks
    ``blocks.L.attn.hook_pattern`` of every layer and adds each batch's patterns to
    :attr:`stats` (:func:`add_pattern`); patterns are reduced inside the hook and never
    kept.  The first pattern it sees must be causal (nothing above the diagonal)."""

    def __init__(self, cfg: Any, exclude_first_query: bool = True) -> None:
        L, H, n_ctx = int(cfg.n_layers), int(cfg.n_heads), int(cfg.n_ctx)
        self.layers = L
        self.exclude_first_query = exclude_first_query
        self.stats = DiagonalStats(np.zeros((L, H, n_ctx)), np.zeros(n_ctx, np.int64), np.zeros((L, H)))
        self._checked = False

    def _hook(self, layer: int) -> Any:
        def hook(pattern: Any, hook: Any) -> None:
            import torch

            if not self._checked:
                if torch.triu(pattern[0, 0], 1).abs().max() != 0:
                    raise PosmechError("attention pattern is not causal (non-zero above the diagonal)")
                self._checked = True
            add_pattern(self.stats, layer, pattern, self.exclude_first_query)

        return hook

    def hooks(self, batch: int, n: int) -> list[tuple[str, Any]]:
        return [(f"blocks.{layer}.attn.hook_pattern", self._hook(layer)) for layer in range(self.layers)]

    def done(self, batch: int, n: int) -> None:
        st = self.stats
        st.counts[:n] += batch * (n - np.arange(n))
        if self.exclude_first_query:
            st.counts[0] -= batch
        st.n_documents += batch
        st.n_tokens += batch * n

    def result(self) -> DiagonalStats:
        """The accumulated :class:`DiagonalStats`; :class:`PosmechError` when no document ran."""
        if self.stats.n_documents == 0:
            raise PosmechError("no document to run the diagonal taxonomy on")
        return self.stats


def accumulate_diagonals(
    bridge: Any, documents: Iterable[np.ndarray], batch_size: int = 1, exclude_first_query: bool = True
) -> DiagonalStats:
    """Run ``documents`` (token-id arrays, equal lengths within a batch) through ``bridge``
    and accumulate per-head diagonal sums from ``blocks.L.attn.hook_pattern``
    (:class:`DiagonalCollector`).

    ``exclude_first_query``: leave query position 0 (which can attend only to itself)
    out of the means.  The ``head_detector`` score always uses the whole pattern, as
    TransformerLens does.  Patterns are reduced inside the hook and never kept.
    """
    col = DiagonalCollector(bridge.cfg, exclude_first_query)
    run_collectors(bridge, [(d, (col,)) for d in documents], batch_size)
    return col.result()


# --------------------------------------------------------------------------- classification
TIE_RTOL = 1e-6
#: default of ``taxonomy.prev_token_min_excess`` (reason in the config schema)
PREV_MIN_EXCESS = 0.1


def uniform_baseline(counts: np.ndarray, n_documents: int, exclude_first_query: bool = True,
                     window: int = 0, slope: float = 0.0) -> np.ndarray:
    """Mean attention per offset ``[n_offsets]`` that a uniform causal head gives on the same
    documents and positions as the accumulated means (NaN where ``counts`` is 0).

    A uniform causal head gives query ``i`` the share ``1/(i+1)`` on each of its keys
    ``0..i``, so its sum on offset ``d`` over one document of ``n`` tokens is
    ``Σ_{i=d}^{n-1} 1/(i+1)``; in a sliding-window layer (``window`` keys, the query's own
    included; 0: none) the share is ``1/min(i+1, window)`` and offsets from ``window`` on get 0.
    ALiBi (``slope`` m > 0, the head's fixed bias ``−m·d`` on offset d): the head whose query–key
    scores are zero is not uniform but the bias's own softmax, share ``e^{−m·d} / Σ_{d'} e^{−m·d'}``
    over the offsets the query sees; that is the baseline (a random-init ALiBi head is close to it).  The documents' lengths are recovered from ``counts`` (the
    (document, query) entries per offset, :class:`DiagonalStats`): ``counts[i] − counts[i+1]``
    documents are longer than ``i`` tokens (``i ≥ 1``; all ``n_documents`` for ``i = 0``).
    ``exclude_first_query``: query 0's weight 1 on offset 0 is left out, as the means do.
    On documents of ``n`` tokens the means of offsets 0 and 1 are equal,
    ``(H_n − 1)/(n − 1)`` (``H_n`` the harmonic number; 0.099 at n = 32, 0.0058 at n = 1024)."""
    c = np.asarray(counts, dtype=np.float64)
    n = len(c)
    longer = np.empty(n)  # documents with more than i tokens
    longer[0] = n_documents
    longer[1:] = c[1:] - np.append(c[2:], 0.0)
    d = np.arange(n)
    weight = np.exp(-float(slope) * d)  # the zero-score head's unnormalised weight on offset d
    seen = np.minimum(d + 1, window) if window else d + 1  # offsets query i sees: 0..seen-1
    z = np.cumsum(weight)[seen - 1]  # query i's normaliser
    sums = weight * np.cumsum((longer / z)[::-1])[::-1]  # e^{-m d} Σ_{i>=d} longer[i] / z_i
    if window:
        sums[window:] = 0.0
    if exclude_first_query:
        sums[0] -= n_documents
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(c > 0, sums / np.maximum(c, 1), np.nan)


def full_documents_baseline(n: int, exclude_first_query: bool = True) -> np.ndarray:
    """:func:`uniform_baseline` of documents of exactly ``n`` tokens (any number of them)."""
    counts = (n - np.arange(n)).astype(np.int64)
    counts[0] -= int(exclude_first_query)
    return uniform_baseline(counts, 1, exclude_first_query)


def classify_heads(means: np.ndarray, detector: np.ndarray | None = None, tie_rtol: float = TIE_RTOL,
                   baseline: np.ndarray | None = None, min_excess: float = PREV_MIN_EXCESS) -> pd.DataFrame:
    """One row per head from mean diagonals ``[n_layers, n_heads, n_offsets]`` (NaN = no data).

    Columns: ``layer, head`` (ints), ``head_name`` (``L{layer}H{head}``), ``top_offset`` (offset of the largest mean
    diagonal), ``n_tied`` (offsets whose mean is within ``tie_rtol`` × the largest of
    it: tied for the largest; 1 when the largest is unique), ``largest``,
    ``second_offset``, ``second_largest``, ``ratio`` (second / largest),
    ``prev_token_mass`` (mean on offset 1), ``prev_token_baseline`` (what a uniform causal
    head of the layer gives on offset 1: ``baseline[..., 1]``), ``prev_token_excess`` (the difference),
    ``is_previous_token_post`` (``top_offset == 1``: the post's P6 definition),
    ``is_previous_token`` (the post's definition and ``prev_token_excess >= min_excess``: the
    finding's P6 definition and the roles'), ``rank`` (1 = smallest ratio among the
    ``is_previous_token`` heads, P7; empty for other heads), ``rank_post`` (the same among the
    ``is_previous_token_post`` heads), and ``head_detector_score`` when ``detector [n_layers, n_heads]`` is given.

    ``baseline [n_offsets]``, ``[n_layers, n_offsets]`` (a layer's own, e.g. a sliding
    window) or ``[n_layers, n_heads, n_offsets]`` (a head's own, e.g. an ALiBi slope):
    :func:`uniform_baseline` of the documents behind ``means``; ``None``: documents of
    ``n_offsets`` tokens with query 0 left out, no window (:func:`full_documents_baseline`).

    Ties: offsets tied for the largest (relative tolerance ``tie_rtol``, default 1e-6:
    float32 patterns carry ~6e-8 relative rounding per entry, so means that agree this
    closely are equal up to rounding) go to the **smallest** offset.  An exactly uniform
    head has equal means on offsets 0 and 1 and is therefore never a previous-token head
    (by either definition).
    """
    L, H, n_off = means.shape
    base = full_documents_baseline(n_off) if baseline is None else np.asarray(baseline, dtype=np.float64)
    if base.shape not in ((n_off,), (L, n_off), (L, H, n_off)):
        raise PosmechError(f"classify_heads: baseline has shape {base.shape}, the means have {L} layers, {H} heads "
                           f"and {n_off} offsets")
    base = _per_head(base, L, H)
    rows = []
    for layer in range(L):
        for h in range(H):
            b1 = float(base[layer, h, 1]) if n_off > 1 else float("nan")
            m = np.where(np.isnan(means[layer, h]), -np.inf, means[layer, h])
            mx = float(m.max())
            tied = np.flatnonzero(m >= mx - tie_rtol * abs(mx)) if np.isfinite(mx) else np.array([0])
            top = int(tied[0])
            rest = np.delete(np.arange(len(m)), top)
            second = int(rest[np.argmax(m[rest])]) if len(rest) else top
            largest, sec = float(m[top]), float(m[second]) if np.isfinite(m[second]) and second != top else float("nan")
            prev = float(m[1]) if len(m) > 1 else float("nan")
            excess = prev - b1
            rows.append({
                "layer": layer, "head": h, "head_name": head_name(layer, h),
                "top_offset": top, "n_tied": len(tied), "largest": largest, "second_offset": second,
                "second_largest": sec, "ratio": sec / largest if largest > 0 else float("nan"),
                "prev_token_mass": prev, "prev_token_baseline": b1, "prev_token_excess": excess,
                "is_previous_token_post": top == 1,
                "is_previous_token": bool(top == 1 and np.isfinite(excess) and excess >= min_excess),
            })
    df = pd.DataFrame(rows)
    if detector is not None:
        df["head_detector_score"] = detector.reshape(-1)
    for flag, col in (("is_previous_token", "rank"), ("is_previous_token_post", "rank_post")):
        prev = df[df[flag]].sort_values(["ratio", "layer", "head"], kind="stable")
        df[col] = pd.Series(dtype="Int64")
        df.loc[prev.index, col] = np.arange(1, len(prev) + 1)
        df[col] = df[col].astype("Int64")
    return df


def rank_correlations(df: pd.DataFrame) -> dict[str, Any]:
    """Spearman correlations between this taxonomy and TransformerLens's ``head_detector``.

    ``spearman_ratio_vs_head_detector``: over the previous-token heads, ranking by ratio
    (ascending) vs by ``head_detector`` score (descending) — i.e. Spearman of
    ``(-ratio, score)``; ``spearman_prev_mass_vs_head_detector``: over every head, mean
    offset-1 attention vs ``head_detector`` score.  ``None`` when undefined (< 3 heads or
    constant input; NaN in either, as ``scipy.stats.spearmanr`` gives).

    pandas' own rank correlation (``DataFrame.corr(method="spearman")``: Pearson's
    correlation of the ranks, tied values sharing their average rank, as ``spearmanr``);
    ``Series.corr`` and ``spearmanr`` would import ``scipy.stats`` (~1.5 CPU s) into the
    taxonomy job for two numbers.
    """

    def rho(a: np.ndarray, b: np.ndarray) -> float | None:
        if len(a) < 3 or np.all(a == a[0]) or np.all(b == b[0]) or np.isnan(a).any() or np.isnan(b).any():
            return None
        r = pd.DataFrame({"a": a, "b": b}).corr(method="spearman").iloc[0, 1]
        return None if not np.isfinite(r) else round(float(r), 6)

    prev = df[df["is_previous_token"]]
    return {
        "spearman_ratio_vs_head_detector": rho(-prev["ratio"].to_numpy(), prev["head_detector_score"].to_numpy()),
        "n_heads_ratio_vs_head_detector": int(len(prev)),
        "spearman_prev_mass_vs_head_detector": rho(df["prev_token_mass"].to_numpy(), df["head_detector_score"].to_numpy()),
        "n_heads_prev_mass_vs_head_detector": int(len(df)),
    }


SHARP_RULE = "rank 1 by P7 ratio among previous-token heads"
EARLY_RULE = "P7 rank <= {top_n} and layer < sharp head's layer"
EARLY_FALLBACK_RULE = "fallback (no ranked head below the sharp head's layer): P7 rank <= {top_n}, other than the sharp head"
#: the rule of a sharp head chosen when no head is a previous-token head: the interventions still
#: get a head to read, but it holds no role (posmech.verdicts.heads: ``p7_chosen`` none)
SHARP_FALLBACK_RULE = "fallback (no previous-token head): largest mean attention on offset 1"


def strict_early_heads(chosen: dict[str, list[str]]) -> list[str]:
    """The early heads of ``chosen`` (:func:`read_chosen_heads`) in a layer strictly below the
    sharp head's: the early previous-token heads of P13/P15's findings, never the fallback's
    heads of the sharp head's layer or above."""
    if not chosen.get("sharp"):
        return []
    layer = parse_head(chosen["sharp"][0])[0]
    return [h for h in chosen.get("early", []) if parse_head(h)[0] < layer]


def choose_heads(df: pd.DataFrame, model: str, early_top_n: int = 11, pin: dict[str, Any] | None = None) -> pd.DataFrame:
    """The chosen-heads table (:data:`HEADS_COLUMNS`) from :func:`classify_heads` output.

    Rule: the *sharp* head is the rank-1 previous-token head (smallest P7 ratio, among the
    ``is_previous_token`` heads: above the uniform baseline by the margin); the
    *early* heads are the previous-token heads ranked within the top ``early_top_n`` whose
    layer is below the sharp head's (on ``gpt2`` with the published ranking: L4H11 and
    L3H3, L2H2, L2H4, L1H0, L3H7, L3H2).  When none is below the sharp head (e.g. the
    sharp head is in layer 0), the other top-``early_top_n`` heads are used; when no head at
    all is a previous-token head, the sharp head is the one with the largest offset-1 mean
    (rule :data:`SHARP_FALLBACK_RULE`: a head for the interventions to read, not a role);
    the rule column says which rule chose each head.  ``pin = {"sharp": "L4H11", "early": [...]}`` (either key) overrides
    the rule.
    """
    pin = pin or {}
    by_head = df.set_index("head_name")
    known = set(by_head.index)
    ranked = df[df["rank"].notna()].sort_values("rank")
    rows: list[dict[str, Any]] = []

    def score(head: str) -> float:
        r = by_head.loc[head, "ratio"] if head in known else float("nan")
        return float(r) if head in known and bool(by_head.loc[head, "is_previous_token"]) else float("nan")

    pinned = ([("sharp", pin["sharp"])] if pin.get("sharp") else []) + [("early", h) for h in pin.get("early") or []]
    for role, h in pinned:
        if h not in known:
            raise PosmechError(f"config key `taxonomy.pin.{model}.{role}`: head {h!r} does not exist in model {model!r}")
    if pin.get("sharp"):
        sharp, sharp_rule = pin["sharp"], "pinned in config taxonomy.pin"
    elif len(ranked):
        sharp, sharp_rule = str(ranked["head_name"].iloc[0]), SHARP_RULE
    else:  # keep the interventions running, and say so
        sharp = str(df.loc[df["prev_token_mass"].idxmax(), "head_name"])
        sharp_rule = SHARP_FALLBACK_RULE
    rows.append({"role": "sharp", "head_name": sharp, "score": score(sharp), "rule": sharp_rule})
    if "early" in pin and pin["early"] is not None:
        early = [(h, "pinned in config taxonomy.pin") for h in pin["early"]]
    else:
        top = ranked[ranked["rank"] <= early_top_n]
        sharp_layer = parse_head(sharp)[0]
        below = top[(top["layer"] < sharp_layer) & (top["head_name"] != sharp)]
        if len(below):
            early = [(h, EARLY_RULE.format(top_n=early_top_n)) for h in below["head_name"]]
        else:
            early = [(h, EARLY_FALLBACK_RULE.format(top_n=early_top_n)) for h in top["head_name"] if h != sharp]
    rows += [{"role": "early", "head_name": h, "score": score(h), "rule": rule} for h, rule in early]
    return chosen_heads_frame(model, rows)


def _per_head(baseline: np.ndarray, L: int, H: int) -> np.ndarray:
    """A baseline of :func:`classify_heads`'s shapes as ``[L, H, n_offsets]``."""
    b = np.asarray(baseline, dtype=np.float64)
    return np.broadcast_to(b if b.ndim != 2 else b[:, None, :], (L, H, b.shape[-1]))


def diagonals_frame(means: np.ndarray, counts: np.ndarray, model: str, max_offset: int | None = None,
                    baseline: np.ndarray | None = None) -> pd.DataFrame:
    """Tidy mean diagonals: one row per (head, offset) with ``claim, model, layer, head,
    head_name, offset, mean, count`` (offsets with data, up to ``max_offset``) and, when
    ``baseline`` (:func:`uniform_baseline`; shapes as :func:`classify_heads`) is given,
    ``uniform_mean``: what the head's zero-score (uniform causal) counterpart gives on that offset."""
    L, H, n = means.shape
    offs = np.flatnonzero(counts > 0)
    if max_offset is not None:
        offs = offs[offs <= max_offset]
    layer, head, off = np.meshgrid(np.arange(L), np.arange(H), offs, indexing="ij")
    return pd.DataFrame({
        "claim": "P6", "model": model,
        "layer": layer.ravel(), "head": head.ravel(),
        "head_name": [head_name(a, b) for a, b in zip(layer.ravel(), head.ravel())], "offset": off.ravel(),
        "mean": means[layer.ravel(), head.ravel(), off.ravel()], "count": counts[off.ravel()],
        **({} if baseline is None else {"uniform_mean": _per_head(baseline, L, H)[layer.ravel(), head.ravel(), off.ravel()]}),
    })


# --------------------------------------------------------------------------- rule helpers
def full_context_documents(tokens: Any, n_documents: int, context: int | None) -> tuple[list[np.ndarray], int]:
    """:func:`posmech.data.tokens.context_documents` of the ``taxonomy`` section:
    ``(documents, context)``."""
    from posmech.data.tokens import context_documents

    return context_documents(tokens, n_documents, context, "taxonomy")[:2]


def run_taxonomy(
    bridge: Any, documents: list[np.ndarray], model: str, early_top_n: int = 11,
    pin: dict[str, Any] | None = None, batch_size: int = 1, exclude_first_query: bool = True,
    tie_rtol: float = TIE_RTOL, min_excess: float = PREV_MIN_EXCESS,
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """The whole P6/P7 analysis: ``(per_head, diagonals, chosen, meta)``.

    ``per_head``: :func:`classify_heads` with ``claim``/``model`` columns; ``diagonals``:
    :func:`diagonals_frame`; ``chosen``: :func:`choose_heads`; ``meta``: rank correlations,
    counts and parameters for the tables' metadata.
    """
    stats = accumulate_diagonals(bridge, documents, batch_size=batch_size, exclude_first_query=exclude_first_query)
    windows = list(getattr(bridge.cfg, "windows", None) or []) or None
    slopes = None
    if getattr(bridge.cfg, "positional_embedding_type", "") == "alibi":
        from posmech.models.scores import alibi_slopes

        slopes = alibi_slopes(int(bridge.cfg.n_heads))
    return analyse_taxonomy(stats, model, early_top_n, pin, exclude_first_query, tie_rtol, min_excess, windows,
                            slopes)


def analyse_taxonomy(
    stats: DiagonalStats, model: str, early_top_n: int = 11, pin: dict[str, Any] | None = None,
    exclude_first_query: bool = True, tie_rtol: float = TIE_RTOL, min_excess: float = PREV_MIN_EXCESS,
    windows: list[int] | None = None, slopes: np.ndarray | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """:func:`run_taxonomy` from accumulated :class:`DiagonalStats` (e.g. read back from
    ``attention_statistics.h5`` with :func:`posmech.analyses.taxonomy.statistics.read_statistics`):
    no forward pass, so thresholds and pins can change without rerunning the model.
    ``windows``: per layer, the sliding window of keys a query sees (0 or ``None``: every
    earlier key; :func:`posmech.models.architecture.attention_windows`) and ``slopes [n_heads]``
    (ALiBi's, :func:`posmech.models.scores.alibi_slopes`; ``None``: no position bias), for the
    baseline (:func:`uniform_baseline`)."""
    means = stats.means()
    L, H = stats.sums.shape[:2]
    windows = list(windows or [0] * L)
    slopes = np.zeros(H) if slopes is None else np.asarray(slopes, dtype=np.float64)
    if len(windows) != L or slopes.shape != (H,):
        raise PosmechError(f"analyse_taxonomy: {len(windows)} layer windows and {slopes.shape} slopes for {L} layers "
                           f"of {H} heads")
    baseline = np.stack([np.stack([uniform_baseline(stats.counts, stats.n_documents, exclude_first_query, w, m)
                                   for m in slopes]) for w in windows])  # [L, H, n]
    per_head = classify_heads(means, stats.detector_scores(), tie_rtol=tie_rtol, baseline=baseline,
                              min_excess=min_excess)
    per_head.insert(0, "model", model)
    per_head.insert(0, "claim", np.where(per_head["is_previous_token"], "P6,P7", "P6"))
    chosen = choose_heads(per_head, model, early_top_n=early_top_n, pin=pin)
    meta = {
        **rank_correlations(per_head),
        "n_heads": int(len(per_head)),
        "n_previous_token_heads": int(per_head["is_previous_token"].sum()),
        "n_previous_token_heads_post": int(per_head["is_previous_token_post"].sum()),
        "prev_token_min_excess": min_excess,
        "attention_windows": [int(w) for w in windows],
        "alibi_slopes": [float(m) for m in slopes],
        "prev_token_baseline": "mean attention a uniform causal head (share 1/(i+1) on each key of query i) gives "
                               "on the same documents and positions; prev_token_excess = prev_token_mass minus it",
        "n_documents": stats.n_documents,
        "n_tokens": stats.n_tokens,
        "exclude_first_query": exclude_first_query,
        "head_detector": "transformer_lens.head_detector previous_token_head score, error_measure='mul', "
                         "no exclusions, mean over documents (computed in the same forward pass)",
        "early_top_n": early_top_n,
        "tie_rtol": tie_rtol,
        "n_heads_with_ties": int((per_head["n_tied"] > 1).sum()),
        "pin": pin or {},
    }
    return per_head, diagonals_frame(means, stats.counts, model, baseline=baseline), chosen, meta


def taxonomy_scorecard(per_head: pd.DataFrame, meta: dict[str, Any], model: str, corpus: str, context: int,
                       figure: str, table: str) -> list[dict[str, Any]]:
    """P6 and P7 rows of rule diagonal_taxonomy from :func:`analyse_taxonomy`'s ``per_head``
    and ``meta``, measured on ``meta['n_documents']`` ``corpus`` documents of ``context`` tokens,
    each quantity twice: for the finding's previous-token heads (``is_previous_token``: largest
    mean diagonal at offset −1 *and* at least ``meta['prev_token_min_excess']`` above what a
    uniform causal head gives there) and, suffixed ``_post``, for the post's own loose ones
    (``is_previous_token_post``: largest mean diagonal at offset −1, however weak), which the
    comparison with the published values reads:

    * P6 ``n_prev_token_heads`` — the number of previous-token heads;
      ``prev_token_head_fraction`` — that number over all heads;
    * P7 ``sharpest_prev_token_head`` — the previous-token head ranked first by its
      diagonal ratio (a one-element list; empty when no head is a previous-token head);
      ``diagonal_ratio`` — every previous-token head's ratio, (second-largest mean diagonal)
      / (largest) (head name → ratio, 4 decimals), in rank order."""
    n_heads = meta["n_heads"]
    detail = f"{meta['n_documents']} {corpus} documents of {context} tokens"
    margin = meta.get("prev_token_min_excess", PREV_MIN_EXCESS)
    rows = []
    for suffix, flag, rank, words in (
        ("", "is_previous_token", "rank",
         f"have their largest mean diagonal at offset -1 and at least {margin:g} more attention there than a "
         "uniform causal head"),
        ("_post", "is_previous_token_post", "rank_post",
         "have their largest mean diagonal at offset -1 (the post's definition, however weak)"),
    ):
        prev = per_head[per_head[rank].notna()].sort_values(rank)
        n_prev = int(per_head[flag].sum())
        rows += [
            {"claim": "P6", "quantity": f"n_prev_token_heads{suffix}", "value": n_prev,
             "detail": f"of {n_heads} heads; {detail}", "artifact": figure},
            {"claim": "P6", "quantity": f"prev_token_head_fraction{suffix}", "value": n_prev / n_heads,
             "detail": f"{n_prev} of {n_heads} heads {words}; {detail}", "artifact": figure},
            {"claim": "P7", "quantity": f"sharpest_prev_token_head{suffix}", "value": prev["head_name"].head(1).tolist(),
             "detail": detail, "artifact": table},
            {"claim": "P7", "quantity": f"diagonal_ratio{suffix}",
             "value": dict(zip(prev["head_name"], prev["ratio"].round(4))),
             "detail": ("every previous-token head by the post's definition" if suffix else
                        "every previous-token head above the uniform baseline; Spearman vs head_detector "
                        f"{meta['spearman_ratio_vs_head_detector']}"),
             "artifact": table},
        ]
    return [{**r, "model": model} for r in rows]
