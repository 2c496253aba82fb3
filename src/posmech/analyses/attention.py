"""Attention helpers shared by the analyses: head names, previous-token masses, windows.

One home for what several analyses (taxonomy, kernels, the W_pos interventions, the other
interventions, and the wave-2 analyses) read off attention patterns, so that a head is
named, a mass is measured and a window is cut the same way everywhere:

* heads are written ``L{layer}H{head}`` (:func:`head_name`, :func:`parse_head`,
  :func:`check_head`);
* the previous-token mass of query ``q`` is ``pattern[q, q - 1]`` (:func:`prev_token_mass`
  per query, :func:`mean_prev_token_mass` averaged over a set of query rows);
* a zoom window is a ``size × size`` block on the diagonal (:func:`window` fits it into a
  document, :func:`window_block` cuts it);
* documents are run in batches of equal length (:func:`equal_length_batches`), one forward
  pass per batch feeding one or several *collectors* at once (:func:`run_collectors`): the diagonal taxonomy (P6/P7) and
  the score taxa (P13) share their passes this way.

Patterns are ``[T, T]`` arrays (query, key) of one head on one document.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np

from posmech.core.errors import PosmechError

HEAD_RE = re.compile(r"^L(\d+)H(\d+)$")


# --------------------------------------------------------------------------- head names
def head_name(layer: int, head: int) -> str:
    """``(4, 11)`` → ``"L4H11"``."""
    return f"L{int(layer)}H{int(head)}"


def head_columns(name: str, key: str = "head") -> dict[str, int | str]:
    """``"L4H11"`` → ``{"layer": 4, "head": 11, "head_name": "L4H11"}``: the columns that name a
    head in every per-head table (docs/artifacts.md)."""
    layer, head = parse_head(name, key)
    return {"layer": layer, "head": head, "head_name": head_name(layer, head)}


def parse_head(name: str, key: str = "head") -> tuple[int, int]:
    """``"L4H11"`` → ``(4, 11)``; :class:`PosmechError` naming ``key`` (the config key or
    file the name came from) for anything else."""
    m = HEAD_RE.match(str(name))
    if not m:
        raise PosmechError(f"{key}: {name!r} is not a head name; write heads as L<layer>H<head>, e.g. L4H11")
    return int(m.group(1)), int(m.group(2))


def check_head(bridge: Any, name: str) -> tuple[int, int]:
    """Parse ``name`` and check the head exists in ``bridge`` (``cfg.n_layers`` × ``cfg.n_heads``)."""
    layer, head = parse_head(name)
    if layer >= bridge.cfg.n_layers or head >= bridge.cfg.n_heads:
        raise PosmechError(
            f"head {name} does not exist in a model with {bridge.cfg.n_layers} layers × "
            f"{bridge.cfg.n_heads} heads; check the chosen heads (results/<model>/taxonomy/heads.csv)"
        )
    return layer, head


# --------------------------------------------------------------------------- masses
def prev_token_mass(pattern: np.ndarray) -> np.ndarray:
    """Attention from each query ``q >= 1`` to key ``q - 1``: ``pattern [T, T]`` → ``[T - 1]``
    (entry ``j`` belongs to query ``j + 1``)."""
    return np.diagonal(np.asarray(pattern), offset=-1).copy()


def mean_prev_token_mass(pattern: np.ndarray, rows: slice | None = None) -> float:
    """Mean of :func:`prev_token_mass` over the query rows ``rows`` of ``pattern [T, T]``
    (default: every query ``q >= 1``; query 0 has no previous token and is never counted).
    NaN when the rows hold no query ``q >= 1``."""
    q = np.arange(pattern.shape[0])
    if rows is not None:
        q = q[rows]
    q = q[q >= 1]
    return float(prev_token_mass(pattern)[q - 1].mean()) if len(q) else float("nan")


# --------------------------------------------------------------------------- windows
def window(length: int, start: int, size: int) -> tuple[int, int]:
    """A ``size``-position window starting at ``start`` fitted into ``length`` positions:
    ``(start, size)`` clamped so that ``start + size <= length``."""
    size = min(size, length)
    return max(0, min(start, length - size)), size


def window_block(pattern: np.ndarray, start: int, size: int) -> np.ndarray:
    """The ``[size, size]`` block of ``pattern`` on the diagonal at ``start`` (queries and
    keys ``start .. start + size``; shorter at the end of the document), as a copy."""
    return pattern[start : start + size, start : start + size].copy()


# --------------------------------------------------------------------------- passes
def equal_length_batches(lengths: Sequence[int], max_docs: Callable[[int], int],
                         same: Callable[[int, int], bool] | None = None) -> Iterator[slice]:
    """Consecutive items grouped into batches: an item joins the current batch when it has
    the batch's length, the batch holds fewer than ``max_docs(length)`` items and, if given,
    ``same(first item of the batch, item)``; yields each batch as a slice of the items."""
    start = 0
    for j in range(1, len(lengths) + 1):
        if (j == len(lengths) or lengths[j] != lengths[start] or j - start >= max(1, max_docs(lengths[start]))
                or (same is not None and not same(start, j))):
            yield slice(start, j)
            start = j


class Collector(Protocol):
    """What :func:`run_collectors` feeds: before a batch's forward pass, ``hooks(batch, n)``
    returns the ``(hook name, function)`` pairs it needs for ``batch`` documents of ``n``
    tokens (``[]``: it needs nothing from this batch); after the pass, ``done(batch, n)``."""

    def hooks(self, batch: int, n: int) -> list[tuple[str, Any]]: ...

    def done(self, batch: int, n: int) -> None: ...


def run_collectors(
    bridge: Any, items: Sequence[tuple[np.ndarray, Sequence[Collector]]], batch_size: int = 1,
    progress: bool = True,
) -> None:
    """One forward pass (no logits) per batch of ``items`` — ``(token ids [n], collectors)``
    — with the hooks of every collector of that batch.  Consecutive documents of equal
    length and the same collectors form a batch of at most ``batch_size``; a batch whose
    collectors ask for no hook is not run; a document longer than the model context is an
    error.  ``progress``: :class:`posmech.core.progress.Progress` lines in the rule's log."""
    import torch

    from posmech.core.progress import Progress

    n_ctx = int(bridge.cfg.n_ctx)
    device = next(bridge.parameters()).device
    for doc, _ in items:
        if len(doc) > n_ctx:
            raise PosmechError(f"document of {len(doc)} tokens exceeds the model context {n_ctx}")
    cols_of = [tuple(cols) for _, cols in items]

    def same(i: int, j: int) -> bool:
        return len(cols_of[i]) == len(cols_of[j]) and all(a is b for a, b in zip(cols_of[i], cols_of[j]))

    groups = [([np.asarray(items[j][0]) for j in range(s.start, s.stop)], cols_of[s.start])
              for s in equal_length_batches([len(d) for d, _ in items], lambda n: batch_size, same)]
    bar = Progress(sum(len(g[0]) for g in groups)) if progress else None
    with torch.inference_mode():
        for docs, cols in groups:
            b, n = len(docs), len(docs[0])
            hooks = [h for c in cols for h in c.hooks(b, n)]
            if hooks:
                x = torch.as_tensor(np.stack(docs).astype(np.int64), device=device)
                with bridge.hooks(fwd_hooks=hooks):
                    bridge(x, return_type=None)
            for c in cols:
                c.done(b, n)
            if bar is not None:
                bar.advance(b)
    if bar is not None:
        bar.finish()
