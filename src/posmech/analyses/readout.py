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

:func:`target_probabilities` (P3, P16) reads them after a prompt: a target's probability is
the total probability that the model's continuation starts with one of its variants
(token-id lists from :func:`posmech.data.prompts.variant_token_ids`: without special tokens,
deduplicated, and variants extending another variant's tokens dropped, their mass already
counted); single-token variants contribute their next-token probability and multi-token
variants (e.g. on a character-level model) the product of their tokens' conditional
probabilities.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

FINAL = "ln_final.hook_out"  # the unembedding's input
CHUNK = 128  # positions unembedded at a time: 128 x 50257 float32 logits = 26 MB (faster than 256 or 512 on CPU)
MAX_BATCH_TOKENS = 1024  # tokens per teacher-forced pass: the [rows, heads, T, T] attention memory of one 1024-token row


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


def continuation_probability(
    model: Any, prompt_ids: np.ndarray, variants: Sequence[Sequence[int]], hooks: Sequence[tuple[str, Any]] = (),
) -> float:
    """Probability that the continuation of ``prompt_ids`` starts with one of ``variants``
    (token-id lists from :func:`posmech.data.prompts.variant_token_ids`; prefix-free, so the
    events are disjoint and their probabilities add), under ``hooks`` (teacher-forced: the
    prompt positions, where the hooks act, are the same in every row).  Needs
    ``len(prompt) + len(variant) - 1 <= n_ctx``."""
    return target_probabilities(model, prompt_ids, {"t": list(variants)}, hooks)[0]["t"]


def target_probabilities(
    model: Any, prompt_ids: np.ndarray, targets: dict[str, list[list[int]]] | dict[str, list[tuple[int, ...]]],
    hooks: Sequence[tuple[str, Any]] = (), max_batch_tokens: int = MAX_BATCH_TOKENS,
) -> tuple[dict[str, float], int, float]:
    """:func:`continuation_probability` of every target's variants, teacher-forced in batched
    forward passes (with ``hooks`` added, e.g. an intervention; they act on every row alike).

    One row per teacher-forced prefix that no other prefix extends (a row holding prefix
    ``a b`` also gives the distributions after ``a`` and after the prompt alone), in the
    passes of :func:`_passes`.  Logits are made only at the positions read
    (:func:`logits_at`) and log-softmaxed in float64.
    Returns ``(probabilities, top_token, top_probability)`` where the top token is the most
    probable next token after the prompt."""
    import torch

    prefixes = {tuple(int(t) for t in v[:-1]) for vs in targets.values() for v in vs} | {()}
    rows = sorted((p for p in prefixes if not any(len(q) > len(p) and q[: len(p)] == p for q in prefixes)),
                  key=lambda t: (len(t), t))
    logp: dict[tuple[int, ...], Any] = {}  # row -> [len(row) + 1, d_vocab] float64 at positions n-1 ..
    for batch, x, read_rows, read_pos, forward in _passes(model, prompt_ids, rows, hooks, max_batch_tokens):
        lg = logits_at(model, x, read_rows, read_pos, hooks, forward)
        with torch.inference_mode():
            lp = torch.log_softmax(lg.double(), -1).cpu()
        at = 0
        for r in batch:
            logp[r] = lp[at : at + len(r) + 1]
            at += len(r) + 1

    def row_of(pre: tuple[int, ...]) -> Any:
        return logp[next(r for r in rows if r[: len(pre)] == pre)]

    out = {}
    for name, vs in targets.items():
        total = 0.0
        for v in vs:
            lp = row_of(tuple(int(t) for t in v[:-1]))
            total += float(lp[torch.arange(len(v)), torch.as_tensor(list(v))].sum().exp())
        out[name] = total
    first = row_of(())[0].exp()
    top = int(first.argmax())
    return out, top, float(first[top])


def _passes(
    model: Any, prompt_ids: np.ndarray, rows: list[tuple[int, ...]], hooks: Sequence[tuple[str, Any]],
    max_batch_tokens: int,
) -> Any:
    """The forward passes of :func:`target_probabilities`: ``(batch rows, tokens, read rows,
    read positions, call keywords)``; the positions read are the prompt's last token and each
    row's tokens, in row order.

    * No ``hooks`` and an engine that runs token trees (``model.runs_token_trees``, the
      posmech engine): **the prompt runs once** and the rows follow it in the same sequence,
      each at positions ``n, n+1, ..`` and seeing the prompt and its own earlier tokens only
      (``positions``/``visible``), at most ``max_batch_tokens`` row tokens per pass.  Every
      position read gets the value of a pass of prompt + row alone, to float32 rounding.
    * Otherwise (interventions act on whole sequences; the bridge): one batch row per row,
      right-padded (causal attention makes the padding invisible to the positions read), at
      most ``max_batch_tokens`` tokens per pass (at least one row)."""
    n = len(prompt_ids)
    if not hooks and getattr(model, "runs_token_trees", False):
        a = 0
        while a < len(rows):
            batch, size = [], 0
            while a < len(rows) and (not batch or size + len(rows[a]) <= max_batch_tokens):
                batch.append(rows[a])
                size += len(rows[a])
                a += 1
            T = n + size
            x = np.concatenate([prompt_ids, *[np.asarray(r, dtype=np.int64) for r in batch]])[None]
            positions = np.arange(T)
            visible = np.tril(np.ones((T, T), dtype=bool))
            visible[n:, n:] = False
            read_pos, at = [], n
            for r in batch:
                seg = slice(at, at + len(r))
                positions[seg] = np.arange(n, n + len(r))
                visible[seg, seg] = np.tril(np.ones((len(r), len(r)), dtype=bool))
                read_pos += [n - 1, *range(at, at + len(r))]
                at += len(r)
            yield batch, x, [0] * len(read_pos), read_pos, {"positions": positions, "visible": visible}
        return
    width = n + max(len(r) for r in rows)
    per_pass = max(1, max_batch_tokens // width)
    for a in range(0, len(rows), per_pass):
        batch = rows[a : a + per_pass]
        w = n + max(len(r) for r in batch)
        x = np.zeros((len(batch), w), dtype=np.int64)
        read_rows, read_pos = [], []
        for i, r in enumerate(batch):
            x[i, : n + len(r)] = np.concatenate([prompt_ids, np.asarray(r, dtype=np.int64)])
            read_rows += [i] * (len(r) + 1)
            read_pos += range(n - 1, n + len(r))
        yield batch, x, read_rows, read_pos, {}
