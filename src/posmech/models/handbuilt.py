"""Hand-built GPT-2-architecture models whose behaviour is known exactly (for tests and
benchmarks).

Design (``../shared/DESIGN.md``, "Testing on known answers"): positional embeddings are
scaled one-hot vectors ``s·(e_i − e_spare)`` (the spare dimension cancels the layer
norm's centring, so every post-LN positional embedding is ``sqrt(d_model/2)·(e_i − e_spare)``),
token embeddings are zero (or whatever the caller sets), every attention-output and MLP
projection is zero unless set, so the residual stream is the positional embedding at
every layer.  Each head's query/key weights are chosen so that its score matrix on those
inputs is any given ``[n_ctx, n_ctx]`` matrix of rank ``<= d_head``.

All functions return plain numpy arrays or write a Hugging Face directory that
:func:`posmech.models.loading.load_bridge` and ``prepare_local_model`` accept.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

BOS = "<|endoftext|>"


@dataclass
class Spec:
    """Weights of a GPT-2-architecture model, in TransformerLens orientation.

    Shapes: ``W_E [d_vocab, d_model]``, ``W_pos [n_ctx, d_model]``; per layer ``l`` and
    head ``h``: ``W_Q/W_K/W_V [l][h] : [d_model, d_head]``, ``W_O [l][h] : [d_head, d_model]``,
    ``b_Q/b_K/b_V [l][h] : [d_head]``.  Missing entries are zero.  LN weights are 1,
    biases 0.  MLPs are zero (``W_in``/``W_out`` may be set per layer as
    ``[d_model, d_mlp]``/``[d_mlp, d_model]``).
    """

    n_layer: int
    n_head: int
    d_model: int
    n_ctx: int
    d_vocab: int
    d_head: int | None = None
    W_E: np.ndarray | None = None
    W_pos: np.ndarray | None = None
    W_U: np.ndarray | None = None
    heads: dict[tuple[int, int], dict[str, np.ndarray]] = field(default_factory=dict)
    mlps: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)

    @property
    def dh(self) -> int:
        return self.d_head or self.d_model // self.n_head


def positional_basis(n_ctx: int, d_model: int, scale: float = 1.0) -> np.ndarray:
    """``W_pos [n_ctx, d_model]`` with row ``i = scale·(e_i − e_{d_model−1})`` (needs
    ``d_model > n_ctx``): zero mean per row, so LN maps row ``i`` to
    ``sqrt(d_model/2)·(e_i − e_spare)``."""
    if d_model <= n_ctx:
        raise ValueError("positional_basis needs d_model > n_ctx (one spare dimension)")
    W = np.zeros((n_ctx, d_model))
    W[np.arange(n_ctx), np.arange(n_ctx)] = scale
    W[:, d_model - 1] = -scale
    return W


def ln_positional(n_ctx: int, d_model: int) -> np.ndarray:
    """The post-LN image of :func:`positional_basis` (any scale): ``[n_ctx, d_model]``."""
    return positional_basis(n_ctx, d_model, 1.0) * np.sqrt(d_model / 2.0)


def head_for_scores(S: np.ndarray, d_model: int, d_head: int) -> dict[str, np.ndarray]:
    """``W_Q, W_K [d_model, d_head]`` so that the attention scores of post-LN positional
    inputs (:func:`ln_positional`) are ``S[n, i]`` exactly (after GPT-2's
    ``1/sqrt(d_head)`` scaling).  ``S`` is ``[n_ctx, n_ctx]`` with rank ``<= d_head``
    (entries above the diagonal are masked anyway)."""
    n_ctx = S.shape[0]
    U, s, Vt = np.linalg.svd(S)
    r = int((s > 1e-12 * max(1.0, s[0])).sum())
    if r > d_head:
        raise ValueError(f"score matrix has rank {r} > d_head {d_head}")
    A = U[:, :r] * np.sqrt(s[:r]) * (float(d_head) ** 0.25)  # [n_ctx, r]
    B = Vt[:r].T * np.sqrt(s[:r]) * (float(d_head) ** 0.25)
    W_Q = np.zeros((d_model, d_head))
    W_K = np.zeros((d_model, d_head))
    amp = np.sqrt(d_model / 2.0)
    W_Q[:n_ctx, :r] = A / amp
    W_K[:n_ctx, :r] = B / amp
    return {"W_Q": W_Q, "W_K": W_K}


def previous_token_scores(n_ctx: int, strength: float = 30.0) -> np.ndarray:
    """Score matrix of an exact previous-token head: ``strength`` on ``(n, n−1)``, and on
    ``(0, 0)`` (position 0 can only attend to itself)."""
    S = np.zeros((n_ctx, n_ctx))
    S[np.arange(1, n_ctx), np.arange(n_ctx - 1)] = strength
    S[0, 0] = strength
    return S


def char_tokenizer(d_vocab: int) -> Any:
    """A character tokenizer with ``d_vocab`` ids: id 0 is ``<|endoftext|>`` (BOS), then
    printable characters."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    chars = [chr(c) for c in range(32, 32 + d_vocab - 1)]
    vocab = {BOS: 0, **{ch: i + 1 for i, ch in enumerate(chars)}}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None, fuse_unk=False))
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([BOS])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=BOS, pad_token=BOS)


def to_hf(spec: Spec) -> Any:
    """A ``GPT2LMHeadModel`` with the weights of ``spec`` (eager attention)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    d, H, dh = spec.d_model, spec.n_head, spec.dh
    if H * dh != d:
        raise ValueError("GPT-2 needs n_head * d_head == d_model")
    cfg = GPT2Config(
        vocab_size=spec.d_vocab, n_positions=spec.n_ctx, n_embd=d, n_layer=spec.n_layer, n_head=H,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
        tie_word_embeddings=spec.W_U is None, layer_norm_epsilon=1e-12,
    )
    cfg._attn_implementation = "eager"
    m = GPT2LMHeadModel(cfg)
    t = lambda a: torch.as_tensor(np.asarray(a), dtype=torch.float32)  # noqa: E731
    with torch.no_grad():
        for p in m.parameters():
            p.zero_()
        for blk in m.transformer.h:
            blk.ln_1.weight.fill_(1.0)
            blk.ln_2.weight.fill_(1.0)
        m.transformer.ln_f.weight.fill_(1.0)
        if spec.W_E is not None:
            m.transformer.wte.weight.copy_(t(spec.W_E))
        if spec.W_pos is not None:
            m.transformer.wpe.weight.copy_(t(spec.W_pos))
        if spec.W_U is not None:
            m.lm_head.weight.copy_(t(spec.W_U).T)
        for (layer, h), w in spec.heads.items():
            attn = m.transformer.h[layer].attn
            sl = slice(h * dh, (h + 1) * dh)
            for j, name in enumerate(("Q", "K", "V")):
                if f"W_{name}" in w:
                    attn.c_attn.weight[:, j * d + sl.start : j * d + sl.stop] = t(w[f"W_{name}"])
                if f"b_{name}" in w:
                    attn.c_attn.bias[j * d + sl.start : j * d + sl.stop] = t(w[f"b_{name}"])
            if "W_O" in w:
                attn.c_proj.weight[sl, :] = t(w["W_O"])
        for layer, w in spec.mlps.items():
            mlp = m.transformer.h[layer].mlp
            if "W_in" in w:
                mlp.c_fc.weight.copy_(t(w["W_in"]))
            if "W_out" in w:
                mlp.c_proj.weight.copy_(t(w["W_out"]))
    m.eval()
    return m


def save_model_dir(spec: Spec, path: str | os.PathLike[str]) -> Path:
    """Write ``spec`` as a Hugging Face directory (safetensors + config + tokenizer)."""
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    to_hf(spec).save_pretrained(p, safe_serialization=True)
    char_tokenizer(spec.d_vocab).save_pretrained(p)
    return p


def positional_spec(
    n_ctx: int = 16, n_layer: int = 2, n_head: int = 2, d_head: int | None = None, d_vocab: int = 40,
    scores: dict[tuple[int, int], np.ndarray] | None = None, scale: float = 1.0,
) -> Spec:
    """A model whose residual stream is its positional embedding at every layer and whose
    head ``(l, h)`` has score matrix ``scores[(l, h)]`` on it (zero, i.e. uniform, when
    absent).  ``d_model = n_head * d_head`` must exceed ``n_ctx``."""
    d_head = d_head or n_ctx + 1
    d_model = n_head * d_head
    spec = Spec(n_layer, n_head, d_model, n_ctx, d_vocab, d_head, W_pos=positional_basis(n_ctx, d_model, scale))
    for key, S in (scores or {}).items():
        spec.heads[key] = head_for_scores(S, d_model, d_head)
    return spec
