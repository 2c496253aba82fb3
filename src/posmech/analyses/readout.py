"""Logits only where they are read.

A full forward pass ends in the unembedding, ``[batch, T, d_vocab]`` logits: for GPT-2 small
200 MB per 1024-token row, most of which an analysis that reads one position per row throws
away.  :func:`final_residual` instead runs the model with ``return_type=None`` and a hook on
``ln_final.hook_out`` (the unembedding's input, in the TransformerLens bridge and in the
posmech engine alike, in either processing mode) that keeps the rows and positions asked for
and then stops the pass (nothing after it is read); :func:`unembed` applies the model's own
(processed) ``W_U``/``b_U`` to them.  The logits equal the model's to float32 rounding (the
same matrix product on fewer rows; ``tests/analyses/test_readout.py``).

:func:`logits_at` and :func:`next_token_logprobs` combine the two; the latter bounds memory
for a long document by unembedding ``chunk`` positions at a time.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

FINAL = "ln_final.hook_out"  # the unembedding's input
CHUNK = 256  # positions unembedded at a time: 256 x 50257 float32 logits = 51 MB


class _Stop(Exception):
    """Raised by the read-out hook once it has what it needs (the pass has nothing left to do)."""


def final_residual(
    model: Any, tokens: Any, rows: Any, positions: Any, hooks: Sequence[tuple[str, Any]] = (),
    forward: dict[str, Any] | None = None,
) -> Any:
    """The unembedding's input at ``(rows[i], positions[i])`` of a forward pass of ``tokens
    [B, T]`` (int ids, a tensor or array) with ``hooks`` added for the pass: ``[m, d_model]``
    in the model's dtype (``m = len(rows)``).

    The pass stops right after the final LayerNorm (no ``[B, T, d_vocab]`` logits are made);
    ``hooks`` (e.g. interventions on the attention pattern) act as in a full pass; ``forward``:
    more keyword arguments of the model's call (e.g. a token tree's ``positions``/``visible``,
    :class:`posmech.models.lens.Lens`)."""
    import torch

    device = next(model.parameters()).device
    x = torch.as_tensor(np.asarray(tokens, dtype=np.int64) if not torch.is_tensor(tokens) else tokens, device=device)
    if x.ndim == 1:
        x = x[None]
    r = torch.as_tensor(np.asarray(rows, dtype=np.int64), device=device)
    p = torch.as_tensor(np.asarray(positions, dtype=np.int64), device=device)
    got: list[Any] = []

    def read(resid: Any, hook: Any) -> None:
        got.append(resid[r, p].clone())
        raise _Stop

    with torch.inference_mode(), model.hooks(fwd_hooks=[*hooks, (FINAL, read)]):
        try:
            model(x, return_type=None, **(forward or {}))
        except _Stop:
            pass
    if not got:
        raise RuntimeError(f"the model's forward pass did not reach {FINAL!r}; it cannot be read out")
    return got[0]


def unembed(model: Any, resid: Any, W_U: Any = None, b_U: Any = None) -> Any:
    """Logits ``resid @ W_U + b_U`` (``[..., d_vocab]``, the model's dtype) of the unembedding's
    input ``resid [..., d_model]`` (``W_U``/``b_U``: the model's processed ones unless given)."""
    import torch

    W = model.W_U if W_U is None else W_U
    b = model.b_U if b_U is None else b_U
    with torch.inference_mode():
        return torch.matmul(resid, W) + b


def logits_at(model: Any, tokens: Any, rows: Any, positions: Any, hooks: Sequence[tuple[str, Any]] = (),
              forward: dict[str, Any] | None = None) -> Any:
    """The model's logits ``[m, d_vocab]`` at ``(rows[i], positions[i])`` of ``tokens [B, T]``
    (see :func:`final_residual`)."""
    return unembed(model, final_residual(model, tokens, rows, positions, hooks, forward))


def chunks(n: int, size: int = CHUNK) -> Iterator[slice]:
    """Consecutive slices of at most ``size`` covering ``range(n)``."""
    for a in range(0, n, size):
        yield slice(a, min(a + size, n))


def next_token_logprobs(model: Any, doc: Any, chunk: int = CHUNK) -> Any:
    """``log P(doc[t + 1] | doc[: t + 1])`` for ``t = 0 .. n-2``: ``[n - 1]`` in the model's
    dtype, from one forward pass of ``doc [n]``; the log-softmax over the vocabulary is taken
    ``chunk`` positions at a time, so at most ``chunk x d_vocab`` logits exist at once."""
    import torch

    ids = np.asarray(doc, dtype=np.int64)
    n = len(ids)
    resid = final_residual(model, ids[None], np.zeros(n - 1, dtype=np.int64), np.arange(n - 1))
    W, b = model.W_U, model.b_U
    target = torch.as_tensor(ids[1:], device=resid.device)
    out = []
    with torch.inference_mode():
        for s in chunks(n - 1, chunk):
            logp = torch.log_softmax(unembed(model, resid[s], W, b), -1)
            out.append(logp.gather(-1, target[s, None])[:, 0])
    return torch.cat(out)
