"""Prompt files (``resources/prompts/*.yaml``) and the probability of a target's token
variants after a prompt (P3, P16).

A target's probability is the total probability that the model's continuation starts
with one of its variants: variants are tokenized without special tokens, duplicates and
variants extending another variant's tokens are dropped (their mass is already counted),
single-token variants contribute their next-token probability and multi-token variants
(e.g. on a character-level model) the product of their tokens' conditional probabilities.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import yaml

from posmech.errors import PosmechError

MAX_BATCH_TOKENS = 1024  # tokens per teacher-forced pass: the [rows, heads, T, T] attention memory of one 1024-token row


@dataclass
class Prompt:
    """One prompt: ``text`` (what the model reads), ``targets`` (name → variant strings)."""

    id: str
    claim: str
    text: str
    targets: dict[str, list[str]]
    extra: dict[str, Any] = field(default_factory=dict)


def load_prompts(path: str | os.PathLike[str], ids: list[str] | None = None) -> list[Prompt]:
    """Prompts of a file (format in ``resources/prompts/repeat_string.yaml``'s header),
    restricted to ``ids`` (in that order) when given."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
        if not isinstance(doc, dict):
            raise PosmechError(
                f"prompt file {str(path)!r} is {'empty' if doc is None else f'a {type(doc).__name__}, not a mapping'}; "
                "see the format in resources/prompts/repeat_string.yaml")
        if not isinstance(doc.get("prompts"), list) or not doc["prompts"]:
            raise KeyError("prompts (a non-empty list)")
        request, reply, reply_open = doc["request"], doc["reply"], doc["reply_open"]
        lines = [line for s in doc.get("fewshot", []) for line in (request.format(string=s), reply.format(string=s))]
        out = {}
        for p in doc["prompts"]:
            text = "\n".join([*lines, request.format(string=p["string"]), reply_open + p.get("reply_prefix", "")])
            targets = {str(k): [str(v) for v in vs] for k, vs in p["targets"].items()}
            if not targets or not all(targets.values()):
                raise KeyError("targets (each with at least one variant)")
            out[p["id"]] = Prompt(p["id"], p.get("claim", ""), text, targets, {"string": p["string"]})
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError) as err:
        raise PosmechError(
            f"prompt file {str(path)!r} is missing or malformed ({type(err).__name__}: {err}); "
            "see the format in resources/prompts/repeat_string.yaml"
        ) from None
    if ids is None:
        return list(out.values())
    missing = [i for i in ids if i not in out]
    if missing:
        raise PosmechError(f"prompt file {str(path)!r} has no prompt(s) {missing}; it defines {sorted(out)}")
    return [out[i] for i in ids]


def variant_token_ids(tokenizer: Any, variants: list[str]) -> list[list[int]]:
    """Token ids of each variant (no special tokens), deduplicated and prefix-free: a
    variant whose ids start with another variant's ids is dropped."""
    seqs = []
    for v in variants:
        ids = list(tokenizer(v, add_special_tokens=False).input_ids)
        if ids and ids not in seqs:
            seqs.append(ids)
    seqs.sort(key=len)
    kept: list[list[int]] = []
    for s in seqs:
        if not any(s[: len(k)] == k for k in kept):
            kept.append(s)
    return kept


def prompt_token_ids(tokenizer: Any, text: str, prepend_bos: bool, max_len: int) -> tuple[np.ndarray, bool]:
    """Token ids of ``text`` (BOS first when ``prepend_bos``), left-truncated to
    ``max_len`` tokens (BOS kept).  Returns ``(ids [n] int64, truncated)``."""
    ids = list(tokenizer(text, add_special_tokens=False).input_ids)
    bos = [tokenizer.bos_token_id] if prepend_bos else []
    room = max_len - len(bos)
    if room < 1:
        raise PosmechError(f"context of {max_len} tokens is too short for a prompt")
    truncated = len(ids) > room
    return np.asarray(bos + ids[-room:], dtype=np.int64), truncated


def continuation_probability(bridge: Any, prompt_ids: np.ndarray, variants: list[list[int]]) -> float:
    """Probability that the continuation of ``prompt_ids`` starts with one of ``variants``
    (token-id lists from :func:`variant_token_ids`; prefix-free, so the events are
    disjoint and their probabilities add).  Needs ``len(prompt) + len(variant) - 1 <= n_ctx``."""
    return target_probabilities(bridge, prompt_ids, {"t": variants})[0]["t"]


def target_probabilities(
    bridge: Any, prompt_ids: np.ndarray, targets: dict[str, list[list[int]]] | dict[str, list[tuple[int, ...]]],
    hooks: Sequence[tuple[str, Any]] = (), max_batch_tokens: int = MAX_BATCH_TOKENS,
) -> tuple[dict[str, float], int, float]:
    """:func:`continuation_probability` of every target's variants, teacher-forced in batched
    forward passes (with ``hooks`` added, e.g. an intervention; they act on every row alike).

    One row per teacher-forced prefix that no other prefix extends (a row holding prefix
    ``a b`` also gives the distributions after ``a`` and after the prompt alone), in the
    passes of :func:`_passes`.  Logits are made only at the positions read
    (:mod:`posmech.analyses.readout`) and log-softmaxed in float64.
    Returns ``(probabilities, top_token, top_probability)`` where the top token is the most
    probable next token after the prompt."""
    import torch

    from posmech.analyses.readout import logits_at

    prefixes = {tuple(int(t) for t in v[:-1]) for vs in targets.values() for v in vs} | {()}
    rows = sorted((p for p in prefixes if not any(len(q) > len(p) and q[: len(p)] == p for q in prefixes)),
                  key=lambda t: (len(t), t))
    logp: dict[tuple[int, ...], Any] = {}  # row -> [len(row) + 1, d_vocab] float64 at positions n-1 ..
    for batch, x, read_rows, read_pos, forward in _passes(bridge, prompt_ids, rows, hooks, max_batch_tokens):
        lg = logits_at(bridge, x, read_rows, read_pos, hooks, forward)
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
