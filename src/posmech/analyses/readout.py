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
CHUNK = 128  # positions unembedded at a time: 128 x 50257 float32 logits = 26 MB (faster than 256 or 512 on CPU)


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


def next_token_logprobs(model: Any, doc: Any, chunk: int = CHUNK, W_U_T: Any = None) -> Any:
    """``log P(doc[t + 1] | doc[: t + 1])`` for ``t = 0 .. n-2``: ``[n - 1]`` in the model's
    dtype, from one forward pass of ``doc [n]``.

    The unembedding runs ``chunk`` positions at a time as ``W_U^T @ resid^T`` (``[d_vocab,
    chunk]``: on CPU 1.25x as fast as ``resid @ W_U`` for GPT-2's 768 x 50257, measured in
    bench/study.py's stand-in), and each position's log-probability is its target's logit
    minus the log-sum-exp over the vocabulary; at most ``chunk x d_vocab`` logits exist at
    once.  ``W_U_T``: ``W_U`` transposed and contiguous ``[d_vocab, d_model]``
    (:func:`unembedding_rows`; made here if not given — pass it when calling per document)."""
    import torch

    ids = np.asarray(doc, dtype=np.int64)
    n = len(ids)
    resid = final_residual(model, ids[None], np.zeros(n - 1, dtype=np.int64), np.arange(n - 1))
    Wt = unembedding_rows(model) if W_U_T is None else W_U_T
    b = model.b_U
    target = torch.as_tensor(ids[1:], device=resid.device)
    out = []
    with torch.inference_mode():
        for s in chunks(n - 1, chunk):
            lg = torch.addmm(b[:, None], Wt, resid[s].t())  # [d_vocab, m]
            out.append(lg[target[s], torch.arange(lg.shape[1], device=lg.device)] - torch.logsumexp(lg, 0))
    return torch.cat(out)


def unembedding_rows(model: Any) -> Any:
    """The model's (processed) ``W_U`` as a contiguous ``[d_vocab, d_model]`` copy."""
    import torch

    with torch.inference_mode():
        return model.W_U.t().contiguous()
