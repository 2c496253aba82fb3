"""Prompt files (``resources/prompts/*.yaml``) and their tokenization (P3, P16): a
prompt's token ids and each target's variants as token-id lists.

Data only: the probability of a target after a prompt (forward passes) is
:func:`posmech.analyses.readout.target_probabilities`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import yaml

from posmech.core.errors import PosmechError

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
