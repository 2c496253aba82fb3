"""Interventions on positional embeddings (P2–P4): group averaging of ``W_pos`` rows.

:func:`group_average` replaces each contiguous group of ``k`` rows (positions) by the
group's mean; :func:`averaged_W_pos` swaps a bridge's positional embedding matrix for
its group-averaged version inside a ``with`` block and restores the original bitwise on
exit (also when the block raises).  Both are used by the positional-embedding rules and
by other interventions (e.g. averaging the residual stream's positional component).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from posmech.errors import PosmechError

ArrayT = TypeVar("ArrayT")


def check_group_size(k: Any, key: str = "k") -> int:
    """``k`` as a positive int, else :class:`PosmechError` naming ``key``."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise PosmechError(f"{key}: group size must be a positive integer, got {k!r}")
    return int(k)


def group_average(x: ArrayT, k: int, dim: int = 0) -> ArrayT:
    """Average ``x`` along ``dim`` in contiguous groups of ``k`` (``[g·k, (g+1)·k)``).

    ``x``: numpy array or torch tensor, e.g. ``W_pos [n, d]`` (``dim=0``) or a residual
    stream ``[batch, pos, d]`` (``dim=1``).  Returns the same type and shape; every
    position of a group holds the group's mean.  When ``n`` is not a multiple of ``k``
    the last group is the remaining ``n mod k`` positions.  ``k = 1`` returns an exact
    copy (bitwise equal); ``k >= n`` averages everything into one group.
    """
    k = check_group_size(k)
    if isinstance(x, np.ndarray):
        if k == 1 or x.shape[dim] == 0:
            return x.copy()
        xt = np.moveaxis(x, dim, 0)
        group = np.arange(xt.shape[0]) // k  # group of each position
        sums = np.zeros((group[-1] + 1, *xt.shape[1:]), dtype=np.float64)
        np.add.at(sums, group, xt)
        means = (sums / np.bincount(group).reshape(-1, *([1] * (xt.ndim - 1)))).astype(x.dtype)
        return np.ascontiguousarray(np.moveaxis(means[group], 0, dim))
    import torch

    if k == 1 or x.shape[dim] == 0:  # type: ignore[attr-defined]
        return x.clone()  # type: ignore[attr-defined,no-any-return]
    xt = x.movedim(dim, 0)  # type: ignore[attr-defined]
    n, rest = xt.shape[0], tuple(xt.shape[1:])
    full = (n // k) * k
    pieces = []
    if full:
        g = xt[:full].reshape(n // k, k, *rest).mean(1, keepdim=True)
        pieces.append(g.expand(n // k, k, *rest).reshape(full, *rest))
    if full < n:
        pieces.append(xt[full:].mean(0, keepdim=True).expand(n - full, *rest))
    return torch.cat(pieces, 0).movedim(0, dim).contiguous()  # type: ignore[no-any-return]


@contextlib.contextmanager
def swapped_parameter(param: Any, value: Any) -> Iterator[Any]:
    """Copy ``value`` into the live tensor ``param`` for the block; restore it bitwise after."""
    import torch

    saved = param.detach().clone()
    try:
        with torch.no_grad():
            param.copy_(value)
        yield param
    finally:
        with torch.no_grad():
            param.copy_(saved)


@contextlib.contextmanager
def averaged_W_pos(bridge: Any, k: int) -> Iterator[Any]:
    """Run the block with ``bridge.W_pos`` averaged in contiguous groups of ``k`` rows.

    The live parameter is overwritten in place (so every forward pass in the block sees
    it) and restored bitwise on exit, also on error.  Yields the bridge.  ``k = 1`` leaves
    every forward pass bitwise unchanged.
    """
    k = check_group_size(k)
    W = bridge.W_pos
    with swapped_parameter(W, group_average(W.detach(), k, dim=0)):
        yield bridge


# --------------------------------------------------------------------------- P2, P3
def next_token_loss(bridge: Any, documents: list[np.ndarray]) -> tuple[float, int]:
    """Summed next-token cross-entropy (nats, float64) over every predicted position of
    ``documents`` (token-id arrays, one forward pass each) and the number of predictions."""
    import torch

    device = next(bridge.parameters()).device
    total, count = 0.0, 0
    with torch.inference_mode():
        for doc in documents:
            if len(doc) < 2:
                continue
            x = torch.as_tensor(np.asarray(doc, dtype=np.int64), device=device)[None]
            logp = torch.log_softmax(bridge(x)[0, :-1].double(), -1)
            total -= float(logp.gather(-1, x[0, 1:, None]).sum())
            count += len(doc) - 1
    return total, count


def posembed_averaging(
    bridge: Any, ks: list[int], documents: list[np.ndarray], prompts: list[Any], prepend_bos: bool,
) -> pd.DataFrame:
    """P2/P3: for each ``k``, with ``W_pos`` averaged in groups of ``k`` (restored after
    each), the mean next-token loss on ``documents`` and each prompt target's probability.

    Returns tidy rows: ``k, quantity`` (``loss`` | ``probability``), ``prompt``,
    ``target``, ``value``, ``n_predictions`` (loss) / ``n_prompt_tokens``,
    ``prompt_truncated``, ``top_token``, ``top_token_probability`` (probability rows).
    """
    from posmech.prompts import continuation_probability, prompt_token_ids, top_next_token, variant_token_ids

    tok = bridge.tokenizer
    n_ctx = bridge.cfg.n_ctx
    prepared = []
    for p in prompts:
        variants = {name: variant_token_ids(tok, vs) for name, vs in p.targets.items()}
        longest = max(len(v) for vs in variants.values() for v in vs)
        ids, truncated = prompt_token_ids(tok, p.text, prepend_bos, n_ctx - (longest - 1))
        prepared.append((p, variants, ids, truncated))
    rows: list[dict[str, Any]] = []
    for k in ks:
        with averaged_W_pos(bridge, k):
            total, count = next_token_loss(bridge, documents)
            rows.append({"k": k, "quantity": "loss", "prompt": "", "target": "", "value": total / max(count, 1),
                         "n_predictions": count})
            for p, variants, ids, truncated in prepared:
                top, top_p = top_next_token(bridge, ids)
                for name, vs in variants.items():
                    rows.append({
                        "k": k, "quantity": "probability", "prompt": p.id, "target": name,
                        "value": continuation_probability(bridge, ids, vs), "n_prompt_tokens": len(ids),
                        "prompt_truncated": truncated, "top_token": tok.decode([top]), "top_token_probability": top_p,
                    })
    return pd.DataFrame(rows)


def max_unchanged_k(df: pd.DataFrame, loss_tolerance: float, probability_tolerance: float) -> int:
    """Largest ``k`` such that for every ``k' <= k`` the loss exceeds the ``k = 1`` loss by at
    most ``loss_tolerance`` nats and every prompt target probability moves by at most
    ``probability_tolerance`` (absolute) from ``k = 1``.  ``df`` from :func:`posembed_averaging`."""
    base = df[df["k"] == 1].set_index(["quantity", "prompt", "target"])["value"]
    if base.empty:
        raise PosmechError("posembed_averaging: the k grid must contain 1 (the intact model)")
    best = 1
    for k in sorted(df["k"].unique()):
        cur = df[df["k"] == k].set_index(["quantity", "prompt", "target"])["value"]
        diff = cur - base
        loss_ok = bool((diff.xs("loss", level="quantity") <= loss_tolerance).all())
        probs = diff.drop("loss", level="quantity", errors="ignore")
        if not (loss_ok and bool((probs.abs() <= probability_tolerance).all())):
            break
        best = int(k)
    return best


# --------------------------------------------------------------------------- P4
def head_pattern(bridge: Any, doc: np.ndarray, layer: int, head: int) -> np.ndarray:
    """One head's attention pattern on a document: ``[n, n]`` float64 (query, key)."""
    import torch

    out: dict[str, Any] = {}

    def hook(pattern: Any, hook: Any) -> None:
        out["p"] = pattern[0, head].double().cpu().numpy()

    device = next(bridge.parameters()).device
    with torch.inference_mode(), bridge.hooks(fwd_hooks=[(f"blocks.{layer}.attn.hook_pattern", hook)]):
        bridge(torch.as_tensor(np.asarray(doc, dtype=np.int64), device=device)[None], return_type=None)
    return out["p"]


def previous_token_mass(pattern: np.ndarray, rows: slice | None = None) -> float:
    """Mean attention from query ``i`` to key ``i − 1`` over query rows ``rows`` (default
    all rows ``i >= 1``) of a ``[n, n]`` pattern."""
    n = pattern.shape[0]
    q = np.arange(n)[rows] if rows is not None else np.arange(n)
    q = q[q >= 1]
    return float(pattern[q, q - 1].mean()) if len(q) else float("nan")


def pattern_similarity(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """Similarity of two attention (sub)matrices of equal shape: ``cosine_similarity`` of
    the flattened matrices, ``mean_abs_diff`` (per entry) and ``mean_row_tv`` (mean over
    rows of the total-variation distance ½·Σ|a − b|)."""
    fa, fb = a.ravel(), b.ravel()
    denom = float(np.linalg.norm(fa) * np.linalg.norm(fb))
    return {
        "cosine_similarity": float(fa @ fb / denom) if denom > 0 else float("nan"),
        "mean_abs_diff": float(np.abs(a - b).mean()),
        "mean_row_tv": float(0.5 * np.abs(a - b).sum(-1).mean()),
    }


def window(length: int, start: int, size: int) -> tuple[int, int]:
    """A ``size``-position window starting at ``start`` fitted into ``length`` positions:
    ``(start, size)`` clamped so that ``start + size <= length``."""
    size = min(size, length)
    return max(0, min(start, length - size)), size
