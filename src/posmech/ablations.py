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
