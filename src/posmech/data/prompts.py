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
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import yaml

from posmech.errors import PosmechError


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
        request, reply, reply_open = doc["request"], doc["reply"], doc["reply_open"]
        lines = [line for s in doc.get("fewshot", []) for line in (request.format(string=s), reply.format(string=s))]
        out = {}
        for p in doc["prompts"]:
            text = "\n".join([*lines, request.format(string=p["string"]), reply_open + p.get("reply_prefix", "")])
            targets = {str(k): [str(v) for v in vs] for k, vs in p["targets"].items()}
            if not targets or not all(targets.values()):
                raise KeyError("targets (each with at least one variant)")
            out[p["id"]] = Prompt(p["id"], p.get("claim", ""), text, targets, {"string": p["string"]})
    except (OSError, yaml.YAMLError, KeyError, TypeError) as err:
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
    bridge: Any, prompt_ids: np.ndarray, targets: dict[str, list[list[int]]]
) -> tuple[dict[str, float], int, float]:
    """:func:`continuation_probability` of every target's variants in one batched forward
    pass (one row per distinct teacher-forced prefix, right-padded: causal attention makes
    the padding invisible to earlier positions).  Returns ``(probabilities, top_token,
    top_probability)`` where the top token is the most probable next token after the prompt."""
    import torch

    n = len(prompt_ids)
    prefixes = sorted({tuple(v[:-1]) for vs in targets.values() for v in vs} | {()}, key=lambda t: (len(t), t))
    row = {pre: i for i, pre in enumerate(prefixes)}
    width = n + max(len(pre) for pre in prefixes)
    x = np.zeros((len(prefixes), width), dtype=np.int64)
    for pre, i in row.items():
        x[i, : n + len(pre)] = np.concatenate([prompt_ids, np.asarray(pre, dtype=np.int64)])
    device = next(bridge.parameters()).device
    with torch.inference_mode():
        logp = torch.log_softmax(bridge(torch.as_tensor(x, device=device))[:, n - 1 :].double(), -1).cpu()
    out = {}
    for name, vs in targets.items():
        total = 0.0
        for v in vs:
            r = row[tuple(v[:-1])]
            total += float(logp[r, torch.arange(len(v)), torch.as_tensor(v)].sum().exp())
        out[name] = total
    first = logp[row[()], 0].exp()
    top = int(first.argmax())
    return out, top, float(first[top])
