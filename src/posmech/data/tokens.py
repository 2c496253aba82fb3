"""Tokenized corpora: ragged token arrays with document ids and positions, in HDF5.

Layout (``results/{model}/tokens/{corpus}.h5``, kind ``tokens``; see docs/artifacts.md):
``token_ids``/``doc_ids``/``positions`` ``[n_tokens]`` int32, ``doc_offsets``
``[n_docs + 1]`` int64, and ``documents/*`` per-document metadata.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from posmech.core.errors import PosmechError
from posmech.store.hdf5 import STR, artifact_writer, attr_json, describe, open_artifact, require_datasets

KIND = "tokens"
DESCRIPTIONS = {
    "token_ids": "[n_tokens] int32 token ids of every document, concatenated (BOS first in each when prepend_bos)",
    "doc_ids": "[n_tokens] int32 document number (0..n_documents-1) of each token",
    "positions": "[n_tokens] int32 position of each token in its document (0 = first token, BOS when prepended)",
    "doc_offsets": "[n_documents+1] int64 document j is token_ids[doc_offsets[j]:doc_offsets[j+1]]",
    "documents/doc_index": "[n_documents] int64 index of each document in the corpus file (its source order)",
    "documents/length": "[n_documents] int32 tokens per document (at most the model's n_ctx)",
    "documents/title": "[n_documents] str document title (Bible: 'Genesis 1'; empty for web text)",
    "documents/book": "[n_documents] str Bible book of each chapter (e.g. GENESIS)",
    "documents/chapter": "[n_documents] int32 Bible chapter number within its book",
}


def tokenize_documents(
    docs: list[dict[str, Any]], tokenizer: Any, n_ctx: int, prepend_bos: bool, min_tokens: int = 1
) -> tuple[list[np.ndarray], list[int]]:
    """Token ids per document, cut to ``n_ctx`` (BOS included when ``prepend_bos``).

    Returns ``(ids, kept)``: ``ids[j]`` int32 ``[len_j]`` with ``len_j <= n_ctx``, and the
    positions in ``docs`` of the kept documents (those with at least ``min_tokens``).
    """
    bos = tokenizer.bos_token_id
    if prepend_bos and bos is None:
        raise PosmechError("prepend_bos is true but the tokenizer has no BOS token; set `prepend_bos: false`")
    ids: list[np.ndarray] = []
    kept: list[int] = []
    for j, d in enumerate(docs):
        t = tokenizer(d["text"], add_special_tokens=False).input_ids
        if prepend_bos:
            t = [bos, *t]
        t = np.asarray(t[:n_ctx], dtype=np.int32)
        if len(t) >= min_tokens:
            ids.append(t)
            kept.append(j)
    return ids, kept


def unknown_tokens(ids: list[np.ndarray], tokenizer: Any) -> tuple[int, int]:
    """How many tokens of ``ids`` are the tokenizer's unknown token (for the character
    tokenizer: one per character outside its vocabulary), and in how many documents.
    ``(0, 0)`` for a tokenizer whose unknown token is its BOS (GPT-2's byte-level BPE,
    which has no unknown input) or that has none."""
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is None or unk == getattr(tokenizer, "bos_token_id", None):
        return 0, 0
    per_doc = [int((t == unk).sum()) for t in ids]
    return sum(per_doc), sum(1 for n in per_doc if n)


def write_tokens(
    path: str | os.PathLike[str], ids: list[np.ndarray], docs: list[dict[str, Any]], attrs: dict[str, Any]
) -> None:
    """Write a token artifact; ``docs[j]`` is the metadata of ``ids[j]``."""
    if not ids:
        raise PosmechError(f"no document left to write to {str(path)!r} (all shorter than min_tokens?)")
    if len(docs) != len(ids):
        raise PosmechError(f"write_tokens: {len(ids)} token arrays but {len(docs)} document records")
    lengths = np.array([len(t) for t in ids], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    flat = np.concatenate(ids).astype(np.int32)
    doc_ids = np.repeat(np.arange(len(ids), dtype=np.int32), lengths)
    positions = np.concatenate([np.arange(n, dtype=np.int32) for n in lengths])
    with artifact_writer(path, KIND, "tokenize", attrs) as f:
        f.attrs["n_documents"] = len(ids)
        f.attrs["n_tokens"] = int(len(flat))
        f.create_dataset("token_ids", data=flat)
        f.create_dataset("doc_ids", data=doc_ids)
        f.create_dataset("positions", data=positions)
        f.create_dataset("doc_offsets", data=offsets)
        g = f.create_group("documents")
        g.create_dataset("doc_index", data=np.array([d["doc_index"] for d in docs], dtype=np.int64))
        g.create_dataset("length", data=lengths.astype(np.int32))
        g.create_dataset("title", data=[str(d.get("title", "")) for d in docs], dtype=STR)
        if all("book" in d for d in docs):
            g.create_dataset("book", data=[d["book"] for d in docs], dtype=STR)
            g.create_dataset("chapter", data=np.array([d["chapter"] for d in docs], dtype=np.int32))
        describe(f, {k: v for k, v in DESCRIPTIONS.items() if k in f})


@dataclass
class TokenSet:
    """A tokenized corpus in memory: ``flat`` ``[n_tokens]``, ``offsets`` ``[n_docs + 1]``."""

    flat: np.ndarray
    offsets: np.ndarray
    attrs: dict[str, Any]
    titles: list[str]

    @property
    def n_documents(self) -> int:
        return len(self.offsets) - 1

    def doc(self, j: int) -> np.ndarray:
        return self.flat[self.offsets[j] : self.offsets[j + 1]]

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


#: the fewest documents a thinned read keeps (:func:`kept_documents`): a mean over documents
#: needs one, its spread across documents two (config ``twins.documents_fraction``)
MIN_DOCUMENTS = 2
#: the fraction of each tokens file's documents that :func:`read_tokens` returns in this context
#: (:func:`documents_fraction`; ``None``: every document)
_FRACTION: ContextVar[float | None] = ContextVar("posmech_documents_fraction", default=None)


def kept_documents(n: int, fraction: float) -> int:
    """How many of ``n`` documents a read of ``fraction`` of them keeps: ``ceil(fraction × n)``,
    at least :data:`MIN_DOCUMENTS`, at most ``n``."""
    if not 0 < fraction <= 1:
        raise PosmechError(f"config key `twins.documents_fraction`: {fraction} is not in (0, 1]; set a fraction "
                           "such as 0.5 (1: every document)")
    return min(n, max(MIN_DOCUMENTS, math.ceil(fraction * n - 1e-9)))


@contextmanager
def documents_fraction(fraction: float | None) -> Iterator[None]:
    """Within this context :func:`read_tokens` returns the first :func:`kept_documents` of
    each tokens file's documents (``None`` or 1: all of them): a random-init twin's
    analyses read fewer documents (:mod:`posmech.pipeline.sweep`)."""
    if fraction is not None:
        kept_documents(MIN_DOCUMENTS, fraction)  # the range check
    token = _FRACTION.set(None if fraction is None or fraction >= 1 else float(fraction))
    try:
        yield
    finally:
        _FRACTION.reset(token)


def first_documents(tokens: TokenSet, k: int, fraction: float) -> TokenSet:
    """The first ``k`` documents of ``tokens``; its attrs record ``n_documents`` (``k``), the
    file's ``n_documents_in_file`` and the ``documents_fraction`` read."""
    offsets = tokens.offsets[: k + 1]
    attrs = {**tokens.attrs, "n_documents": k, "n_documents_in_file": tokens.n_documents,
             "n_tokens": int(offsets[-1]), "documents_fraction": fraction}
    return replace(tokens, flat=tokens.flat[: offsets[-1]], offsets=offsets, attrs=attrs, titles=tokens.titles[:k])


def read_tokens(path: str | os.PathLike[str]) -> TokenSet:
    """The tokens file ``path``: every document, or the first :func:`kept_documents` of them
    within :func:`documents_fraction`."""
    with open_artifact(path, KIND) as f:
        require_datasets(f, path, ["token_ids", "doc_offsets", "documents/title"])
        attrs = {k: attr_json(f, k) for k in f.attrs}
        titles = [t.decode() if isinstance(t, bytes) else str(t) for t in f["documents/title"][()]]
        tokens = TokenSet(f["token_ids"][()], f["doc_offsets"][()], attrs, titles)
    fraction = _FRACTION.get()
    if fraction is None:
        return tokens
    return first_documents(tokens, kept_documents(tokens.n_documents, fraction), fraction)


def context_documents(tokens: TokenSet, n_documents: int, context: int | None,
                      section: str) -> tuple[list[np.ndarray], int, list[int]]:
    """The first ``n_documents`` documents of ``tokens`` with at least ``context`` tokens
    (``None``: its ``n_ctx``), cut to it: ``(documents, context, indices in the tokens
    file)``; fewer documents when fewer are long enough.  None long enough is an error
    naming the config key ``{section}.context``."""
    lengths = tokens.lengths()
    ctx = int(context or tokens.attrs.get("n_ctx") or lengths.max())
    idx = np.flatnonzero(lengths >= ctx)[:n_documents]
    if not len(idx):
        raise PosmechError(f"config key `{section}.context`: no document has {ctx} tokens (longest: "
                           f"{int(lengths.max())}); lower `{section}.context` or use a corpus with longer documents")
    return [tokens.doc(int(j))[:ctx] for j in idx], ctx, [int(j) for j in idx]
