"""Hand-built GPT-2-architecture models whose behaviour is known exactly (for tests and
benchmarks).

Design (a model whose answer is known makes analysis tests exact): positional embeddings are
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
    ``[d_model, d_mlp]``/``[d_mlp, d_model]``, and ``b_in [d_mlp]``).
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


def sink_scores(n_ctx: int, strength: float = 30.0) -> np.ndarray:
    """Score matrix of a planted attention-sink head: ``strength`` on key 0 from every query,
    0 elsewhere, so query ``i`` puts ``e^s / (e^s + i)`` on key 0 and Gu et al.'s ``alpha[0]``
    (the mean over queries) is 1 to within ``n_ctx·e^−s``."""
    S = np.zeros((n_ctx, n_ctx))
    S[:, 0] = strength
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
            if "b_in" in w:
                mlp.c_fc.bias.copy_(t(w["b_in"]))
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


# --------------------------------------------------------------------------- random weights
#: the architectures :func:`save_random_dir` builds (``model_type`` of their Hugging Face configs)
RANDOM_ARCHS = ("gpt2", "llama", "gpt_neox", "bloom", "opt", "gpt_neo")
#: standard deviation of the random weights :func:`with_random_weights` adds (GPT-2's
#: ``initializer_range``)
RANDOM_STD = 0.02


@dataclass(frozen=True)
class RandomSpec:
    """A random-init model of architecture ``arch`` (:data:`RANDOM_ARCHS`), initialised as its
    family initialises it (``AutoModelForCausalLM.from_config`` under ``torch.manual_seed(seed)``:
    what a random-init twin is, :mod:`posmech.models.twin`), with the character tokenizer."""

    arch: str
    seed: int = 0
    n_layer: int = 2
    n_head: int = 4
    d_model: int = 32
    n_ctx: int = 32
    d_vocab: int = 96

    def config(self) -> Any:
        """The ``transformers`` config (eager attention, no dropout; BOS/EOS/pad id 0)."""
        from transformers import (BloomConfig, GPT2Config, GPTNeoConfig, GPTNeoXConfig, LlamaConfig,
                                  OPTConfig)

        common = {"vocab_size": self.d_vocab, "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0}
        L, H, d, n = self.n_layer, self.n_head, self.d_model, self.n_ctx
        makers = {
            "gpt2": lambda: GPT2Config(n_embd=d, n_layer=L, n_head=H, n_positions=n, **common),
            "llama": lambda: LlamaConfig(hidden_size=d, num_hidden_layers=L, num_attention_heads=H,
                                         num_key_value_heads=H, intermediate_size=2 * d, max_position_embeddings=n,
                                         **common),
            "gpt_neox": lambda: GPTNeoXConfig(hidden_size=d, num_hidden_layers=L, num_attention_heads=H,
                                              intermediate_size=2 * d, max_position_embeddings=n, rotary_pct=0.5,
                                              **common),
            "bloom": lambda: BloomConfig(hidden_size=d, n_layer=L, n_head=H, **common),
            "opt": lambda: OPTConfig(hidden_size=d, num_hidden_layers=L, num_attention_heads=H, ffn_dim=2 * d,
                                     max_position_embeddings=n, word_embed_proj_dim=d, **common),
            "gpt_neo": lambda: GPTNeoConfig(hidden_size=d, num_layers=L, num_heads=H, max_position_embeddings=n,
                                            attention_types=[[["global", "local"], max(1, L // 2)]],
                                            window_size=n // 4, **common),
        }
        if self.arch not in makers:
            raise ValueError(f"random-init architecture {self.arch!r}: one of {RANDOM_ARCHS}")
        cfg = makers[self.arch]()
        cfg._attn_implementation = "eager"
        return cfg


def save_random_dir(spec: RandomSpec, path: str | os.PathLike[str]) -> Path:
    """Write the random-init model ``spec`` as a Hugging Face directory (safetensors, config,
    character tokenizer)."""
    import torch
    from transformers import AutoModelForCausalLM

    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(spec.seed)
    model = AutoModelForCausalLM.from_config(spec.config())
    model.save_pretrained(p, safe_serialization=True)
    char_tokenizer(spec.d_vocab).save_pretrained(p)
    return p


def with_random_weights(spec: Spec, seed: int = 0, std: float = RANDOM_STD) -> Spec:
    """``spec`` with every weight it leaves zero drawn at random, normal of standard deviation
    ``std`` (as GPT-2 initialises): token embeddings, the unembedding, each head's query / key
    weights where the spec sets none, every head's value / output weights where it sets none,
    and the MLPs of the layers it gives none.  What the spec plants (its heads' query / key
    weights, ``W_pos``) is kept: planted heads sit among random ones, their scores perturbed only
    by the random residual they read (of order ``std`` beside the unit positions)."""
    rng = np.random.default_rng(seed)
    d, dh = spec.d_model, spec.dh
    r = lambda *shape: rng.normal(0.0, std, size=shape)  # noqa: E731
    spec.W_E = r(spec.d_vocab, d) if spec.W_E is None else spec.W_E
    spec.W_U = r(d, spec.d_vocab) if spec.W_U is None else spec.W_U
    for layer in range(spec.n_layer):
        for h in range(spec.n_head):
            w = spec.heads.setdefault((layer, h), {})
            for name, shape in (("W_Q", (d, dh)), ("W_K", (d, dh)), ("W_V", (d, dh)), ("W_O", (dh, d))):
                w.setdefault(name, r(*shape))
        spec.mlps.setdefault(layer, {"W_in": r(d, 4 * d), "W_out": r(4 * d, d)})
    return spec


# --------------------------------------------------------------------------- attention-only models
# A two-layer attention-only model in TransformerLens's legacy checkpoint format (the format of
# ``attn-only-2l``), with planted position-only and token-only scores in layer 0 and, optionally,
# a BOS/induction circuit.  Residual-stream layout (``d_model`` dims):
#   P block [0, n_ctx)                    positions, one-hot            (W_pos row i = s·(e_i − e_sP))
#   T block [n_ctx, n_ctx + V)            the token, one-hot            (W_E row t = s·(e_t − e_sT))
#   R block [n_ctx + V, n_ctx + 2V)       the token a layer-0 previous-token head copied
#   O block [n_ctx + 2V, n_ctx + 3V)      the token the layer-1 induction head copied (read by W_U)
#   spare dims sP, sT, sR, sO             make every block's vector zero-mean, so LayerNorm only rescales
# Every block vector has squared norm 2·s², so LayerNorm maps a residual made of ``m`` blocks to
# ``x / sigma`` with ``sigma = sqrt(2·m·s²/d_model + eps)``: the scores below are exact, eps included.


@dataclass
class AttnOnlySpec:
    """An attention-only model with learned absolute positions (TransformerLens legacy form).

    ``scores_pos[(l, h)]`` ``[n_ctx, n_ctx]`` and ``scores_tok[(l, h)]`` ``[d_vocab, d_vocab]``
    are the planted layer-0 scores: with token embeddings zeroed, head ``(0, h)``'s score of
    query ``n`` on key ``i`` is ``scores_pos[n, i]``; with positional embeddings zeroed, the score
    of query token ``a`` on key token ``b`` is ``scores_tok[a, b]``; with both inputs it is
    ``w_pos · scores_pos + w_tok · scores_tok`` (:meth:`both_weights`).  ``copy_head`` (layer 0)
    writes the token it attends to into the R block; ``induction`` = ``(head, beta, bos_score,
    out_scale)`` plants a layer-1 head scoring ``beta`` on keys whose R block equals the query's
    token and ``bos_score`` on BOS keys, copying the key's token into the O block, which
    ``W_U`` reads with weight ``out_scale``."""

    n_ctx: int = 16
    d_vocab: int = 24
    n_heads: int = 2
    s: float = 1.0
    eps: float = 1e-5
    scores_pos: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)
    scores_tok: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)
    copy_head: int | None = None
    induction: tuple[int, float, float, float] | None = None

    @property
    def d_head(self) -> int:
        need = max(self.n_ctx + self.d_vocab, -(-(self.n_ctx + 3 * self.d_vocab + 4) // self.n_heads))
        return int(need)

    @property
    def d_model(self) -> int:
        return self.n_heads * self.d_head

    def block(self, name: str) -> int:
        """First dimension of block ``P``/``T``/``R``/``O``."""
        return {"P": 0, "T": self.n_ctx, "R": self.n_ctx + self.d_vocab, "O": self.n_ctx + 2 * self.d_vocab}[name]

    def spare(self, name: str) -> int:
        return self.d_model - 1 - "PTRO".index(name)

    def sigma(self, n_blocks: int) -> float:
        """LayerNorm's divisor for a residual made of ``n_blocks`` block vectors."""
        return float(np.sqrt(2.0 * n_blocks * self.s**2 / self.d_model + self.eps))

    def both_weights(self) -> tuple[float, float]:
        """``(w_pos, w_tok)``: a layer-0 score with both inputs is ``w_pos·S_pos + w_tok·S_tok``."""
        one, two = self.sigma(1), self.sigma(2)
        return (one / two) ** 2, (one / two) ** 2


def _factor(S: np.ndarray, dh: int) -> tuple[np.ndarray, np.ndarray]:
    """``A [n, r], B [m, r]`` with ``A @ B.T = S * sqrt(dh)`` (r = rank of S)."""
    U, sv, Vt = np.linalg.svd(np.asarray(S, dtype=np.float64))
    r = int((sv > 1e-12 * max(1.0, sv[0] if len(sv) else 0.0)).sum())
    root = np.sqrt(sv[:r]) * float(dh) ** 0.25
    return U[:, :r] * root, Vt[:r].T * root


def attn_only_state_dict(spec: AttnOnlySpec) -> dict[str, Any]:
    """The legacy TransformerLens state dict (``embed.W_E``, ``blocks.0.attn.W_Q`` ``[n_heads,
    d_model, d_head]`` …, as ``HookedTransformer.state_dict()`` wrote it) of ``spec``."""
    import torch

    N, V, H, dh, d, s = spec.n_ctx, spec.d_vocab, spec.n_heads, spec.d_head, spec.d_model, spec.s
    P0, T0, R0, O0 = (spec.block(b) for b in "PTRO")
    W_E = np.zeros((V, d))
    W_E[np.arange(V), T0 + np.arange(V)] = s
    W_E[:, spec.spare("T")] = -s
    W_pos = np.zeros((N, d))
    W_pos[np.arange(N), P0 + np.arange(N)] = s
    W_pos[:, spec.spare("P")] = -s
    W = {k: np.zeros((2, H, d, dh)) for k in ("W_Q", "W_K", "W_V")}
    W_O = np.zeros((2, H, dh, d))
    one = spec.sigma(1)
    for (layer, h), S in spec.scores_pos.items():
        A, B = _factor(S, dh)  # LN(p_i) = (s/one)·e_i on the P block
        W["W_Q"][layer, h, P0 : P0 + N, : A.shape[1]] = A * one / s
        W["W_K"][layer, h, P0 : P0 + N, : B.shape[1]] = B * one / s
    for (layer, h), S in spec.scores_tok.items():
        A, B = _factor(S, dh)
        if A.shape[1] > dh - N:
            raise ValueError(f"token score matrix of rank {A.shape[1]} > d_head - n_ctx = {dh - N}")
        W["W_Q"][layer, h, T0 : T0 + V, N : N + A.shape[1]] = A * one / s
        W["W_K"][layer, h, T0 : T0 + V, N : N + B.shape[1]] = B * one / s
    if spec.copy_head is not None:  # layer 0: value = the key's token; output: R block, norm as a token's
        two = spec.sigma(2)
        W["W_V"][0, spec.copy_head, T0 : T0 + V, :V] = np.eye(V)
        W_O[0, spec.copy_head, :V, R0 : R0 + V] = two * np.eye(V)
        W_O[0, spec.copy_head, :V, spec.spare("R")] = -two
    W_U = np.zeros((d, V))
    if spec.induction is not None:
        h, beta, bos_score, out_scale = spec.induction
        three = spec.sigma(3)  # layer-1 residual: P + T + R blocks
        a = (three / s) * float(dh) ** 0.25
        W["W_Q"][1, h, T0 : T0 + V, :V] = a * np.sqrt(beta) * np.eye(V)
        W["W_K"][1, h, R0 : R0 + V, :V] = a * np.sqrt(beta) * np.eye(V)
        # BOS sink: the query's constant sT coordinate (-s/sigma) times the key's BOS coordinate
        W["W_Q"][1, h, spec.spare("T"), V] = -a
        W["W_K"][1, h, T0 + 0, V] = a * bos_score
        W["W_V"][1, h, T0 : T0 + V, :V] = np.eye(V)
        W_O[1, h, :V, O0 : O0 + V] = three * np.eye(V)
        W_O[1, h, :V, spec.spare("O")] = -three
        W_U[O0 : O0 + V, :] = out_scale * np.eye(V)
    t = lambda a: torch.as_tensor(np.asarray(a), dtype=torch.float32)  # noqa: E731
    sd: dict[str, Any] = {"embed.W_E": t(W_E), "pos_embed.W_pos": t(W_pos)}
    for layer in range(2):
        sd[f"blocks.{layer}.ln1.w"] = torch.ones(d)
        sd[f"blocks.{layer}.ln1.b"] = torch.zeros(d)
        for k in ("W_Q", "W_K", "W_V"):
            sd[f"blocks.{layer}.attn.{k}"] = t(W[k][layer])
        sd[f"blocks.{layer}.attn.W_O"] = t(W_O[layer])
        for k in ("b_Q", "b_K", "b_V"):
            sd[f"blocks.{layer}.attn.{k}"] = torch.zeros(H, dh)
        sd[f"blocks.{layer}.attn.b_O"] = torch.zeros(d)
        sd[f"blocks.{layer}.attn.mask"] = torch.tril(torch.ones(N, N, dtype=torch.bool))
        sd[f"blocks.{layer}.attn.IGNORE"] = torch.tensor(-1e5)
    sd["ln_final.w"] = torch.ones(d)
    sd["ln_final.b"] = torch.zeros(d)
    sd["unembed.W_U"] = t(W_U)
    sd["unembed.b_U"] = torch.zeros(V)
    return sd


def attn_only_config(spec: AttnOnlySpec, positional: str = "standard") -> dict[str, Any]:
    """The TransformerLens config.json of a legacy checkpoint (keys as attn-only-2l's)."""
    return {
        "n_layers": 2, "d_model": spec.d_model, "d_head": spec.d_head, "n_heads": spec.n_heads,
        "d_mlp": -1, "d_vocab": spec.d_vocab, "n_ctx": spec.n_ctx, "act_fn": "solu_ln",
        "normalization_type": "LN", "attn_only": True, "eps": spec.eps,
        "positional_embedding_type": positional, "shortformer_pos": positional == "shortformer",
        "tokenizer_name": None, "model_name": "handbuilt-attn-only", "original_architecture": "neel",
    }


def save_attn_only_dir(
    spec: AttnOnlySpec, path: str | os.PathLike[str], weights: str = "safetensors", positional: str = "standard",
    tokenizer: bool = True,
) -> Path:
    """Write ``spec`` as a legacy TransformerLens directory: ``config.json`` in TransformerLens form,
    the state dict as ``model.safetensors`` (``weights='safetensors'``, what ``fetch_model``
    produces) or as ``model_final.pth`` (``'pth'``, what the Hub repo ships), and the character
    tokenizer (id 0 = BOS) unless ``tokenizer`` is false."""
    import json

    import torch

    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    sd = attn_only_state_dict(spec)
    if weights == "pth":
        torch.save(sd, p / "model_final.pth")
    else:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in sd.items()}, str(p / "model.safetensors"))
    (p / "config.json").write_text(json.dumps(attn_only_config(spec, positional), indent=2))
    if tokenizer:
        char_tokenizer(spec.d_vocab).save_pretrained(p)
    return p


def offset_scores(n_ctx: int, by_offset: dict[int, float], self_first: float | None = None) -> np.ndarray:
    """``[n_ctx, n_ctx]`` scores ``by_offset[n - i]`` on key ``i`` of query ``n`` (0 elsewhere);
    ``self_first`` (if given) replaces query 1's scores by ``self_first`` on itself and 0 on key 0
    (the position-0 exception of L3)."""
    S = np.zeros((n_ctx, n_ctx))
    for n in range(n_ctx):
        for i in range(n + 1):
            S[n, i] = by_offset.get(n - i, 0.0)
    if self_first is not None and n_ctx > 1:
        S[1, :2] = [0.0, self_first]
    return S


def induction_probability(spec: AttnOnlySpec, tokens: np.ndarray, prev_key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Analytic output of the planted circuit at the last position of ``tokens [T]``.

    ``prev_key[k]`` is the position whose token the layer-0 copy head wrote at position ``k``
    (its attention is one-hot up to e^-30).  Returns ``(pattern [T], probs [d_vocab])``: the
    induction head's attention row at the last query and the next-token distribution."""
    from scipy.special import softmax

    assert spec.induction is not None
    _, beta, bos_score, out_scale = spec.induction
    t = np.asarray(tokens)
    scores = beta * (t[prev_key] == t[-1]) + bos_score * (t == 0)
    pattern = softmax(scores)
    m = np.bincount(t, weights=pattern, minlength=spec.d_vocab)  # attention mass per token
    s, d = spec.s, spec.d_model
    # final residual: P + T + R blocks (2 s^2 each) + the head's output s·(sum_v m_v e_v − e_sO)
    sq = 3 * 2 * s**2 + s**2 * (float((m**2).sum()) + 1.0)
    sigma_f = np.sqrt(sq / d + spec.eps)
    logits = out_scale * s * m / sigma_f
    return pattern, softmax(logits)


# --------------------------------------------------------------------------- rotary
@dataclass
class RotaryHead:
    """One head of :func:`rotary_model` whose ``q·k`` lives in the rotary frequency pairs
    ``pairs`` (0: the highest frequency). ``kind='positional'``: the query and key read the
    constant dimension only, ``q_f = (a, 0)`` and ``k_f = a·(cos φ_f, sin φ_f)`` with ``φ_f =
    offset·θ_f`` in each pair, so the score at ``Δ = n − i`` is ``Σ_f a²·cos(θ_f·(Δ −
    offset)) / sqrt(d_head)`` whatever the tokens: largest at ``Δ = offset`` (``offset`` 1: a
    previous-token head, as sharp as ``a`` and the frequencies make it); ``kind='content'``:
    seeded random query and key weights from the token dimensions into the pairs, a score that
    depends on the tokens only through those pairs."""

    pairs: tuple[int, ...]
    kind: str = "content"
    amplitude: float = 1.0
    offset: float = 1.0


def rotary_model(heads: dict[tuple[int, int], RotaryHead], n_layer: int = 1, n_head: int = 2, d_head: int = 8,
                 d_model: int = 16, n_ctx: int = 8, d_vocab: int = 40, rope_theta: float = 10000.0,
                 seed: int = 0) -> Any:
    """A ``LlamaForCausalLM`` (rotary on every head dimension, ``rotate_half`` layout: pair
    ``f`` is dimensions ``f`` and ``f + d_head/2``) whose listed heads' queries and keys live
    in one pair each (:class:`RotaryHead`); every other query/key weight, every attention
    output and MLP output projection is zero, so the residual stream is the token embedding
    at every layer. Token embeddings: ``e_t = (1, u_t)`` with ``u_t`` a seeded random unit
    vector on the other dimensions, so every token's RMS is ``sqrt(2/d_model)`` and the
    normalised constant dimension is ``sqrt(d_model/2)`` for every token (RMSNorm weights 1)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if n_head * d_head != d_model or d_head % 2:
        raise ValueError("rotary_model needs n_head * d_head == d_model and an even d_head")
    P = d_head // 2
    cfg = LlamaConfig(vocab_size=d_vocab, hidden_size=d_model, intermediate_size=2 * d_model, num_hidden_layers=n_layer,
                      num_attention_heads=n_head, num_key_value_heads=n_head, max_position_embeddings=n_ctx,
                      rope_theta=rope_theta, bos_token_id=0, eos_token_id=0, pad_token_id=0,
                      tie_word_embeddings=False, attention_dropout=0.0, use_cache=False, rms_norm_eps=1e-12)
    cfg._attn_implementation = "eager"
    m = LlamaForCausalLM(cfg)
    rng = np.random.default_rng(seed)
    u = rng.normal(size=(d_vocab, d_model - 1))
    E = np.concatenate([np.ones((d_vocab, 1)), u / np.linalg.norm(u, axis=1, keepdims=True)], 1)
    const = np.sqrt(d_model / 2.0)  # the normalised constant dimension
    t = lambda a: torch.as_tensor(np.asarray(a), dtype=torch.float32)  # noqa: E731
    with torch.no_grad():
        for p in m.parameters():
            p.zero_()
        for blk in m.model.layers:
            blk.input_layernorm.weight.fill_(1.0)
            blk.post_attention_layernorm.weight.fill_(1.0)
        m.model.norm.weight.fill_(1.0)
        m.model.embed_tokens.weight.copy_(t(E))
        m.lm_head.weight.copy_(t(rng.normal(size=(d_vocab, d_model))))
        for (layer, h), spec in heads.items():
            if spec.kind not in ("positional", "content"):
                raise ValueError(f"head L{layer}H{h}: kind {spec.kind!r}; expected positional or content")
            attn = m.model.layers[layer].self_attn
            for f in spec.pairs:
                if not 0 <= f < P:
                    raise ValueError(f"head L{layer}H{h}: pair {f} outside 0..{P - 1}")
                rows = [h * d_head + f, h * d_head + f + P]
                if spec.kind == "positional":
                    a, phase = spec.amplitude / const, spec.offset * rope_theta ** (-2.0 * f / d_head)
                    attn.q_proj.weight[rows[0], 0] = a
                    attn.k_proj.weight[rows[0], 0] = a * np.cos(phase)
                    attn.k_proj.weight[rows[1], 0] = a * np.sin(phase)
                else:
                    for proj in (attn.q_proj, attn.k_proj):
                        proj.weight[rows, 1:] = t(spec.amplitude * rng.normal(size=(2, d_model - 1)))
    return m.eval()


def save_hf_model_dir(model: Any, path: str | os.PathLike[str]) -> Path:
    """Write a built Hugging Face model (e.g. a :func:`rotary_model`) as a directory with the
    character tokenizer."""
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(p, safe_serialization=True)
    char_tokenizer(int(model.config.vocab_size)).save_pretrained(p)
    return p


# --------------------------------------------------------------------------- rotary and ALiBi models
# Layer 0 of these reads the token embedding alone, so a head's position part comes from the
# rotation (Llama) or the ALiBi bias (BLOOM). Token ``t`` is embedded by its code ``t % n_codes``
# (one-hot in a block of ``n_codes`` dimensions), so the vocabulary can be the self-check's 96
# characters in a narrow model; every token embedding has the same norm, so layer 0's norm scale is
# the same for every token. Attention outputs, MLPs and the unembedding are zero: the residual
# stream is the token embedding at every layer.


def rotary_offset_weights(thetas: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, float]:
    """Non-negative weights ``w_j`` (summing to 1) of the frequency pairs ``thetas`` making
    ``f(k) = Σ_j w_j cos(k·θ_j)`` as much larger at ``k = 0`` than at every other ``k`` of
    ``offsets`` as a linear programme allows; returns ``(w, gap)``, ``gap = min_k f(0) − f(k)``."""
    from scipy.optimize import linprog

    ks = np.asarray([k for k in offsets if k != 0], dtype=np.float64)
    J = len(thetas)
    # variables: w_0..w_{J-1}, t; maximise t subject to sum_j w_j (1 - cos k θ_j) >= t, sum w = 1
    A = np.hstack([-(1.0 - np.cos(ks[:, None] * thetas[None, :])), np.ones((len(ks), 1))])
    res = linprog(np.r_[np.zeros(J), -1.0], A_ub=A, b_ub=np.zeros(len(ks)), A_eq=np.r_[np.ones(J), 0.0][None],
                  b_eq=[1.0], bounds=[(0, None)] * J + [(None, None)])
    if not res.success:
        raise ValueError(f"no rotary weights: {res.message}")
    return res.x[:J], float(res.x[J])


@dataclass
class RotarySpec:
    """A Llama model (RMSNorm, rotary on every head dimension) whose layer-0 heads attend by
    rotation alone: ``offsets[h] = (shift, gap)`` plants in head ``(0, h)`` scores
    ``gap·f(i − n + shift)/g`` over keys ``i ≤ n`` (``f``, ``g`` of :func:`rotary_offset_weights`):
    largest at key ``n − shift``, at least ``gap`` above every other key of the context, for
    every token (its query and key read only the dimension all tokens share)."""

    n_ctx: int = 32
    d_vocab: int = 96
    n_codes: int = 16
    n_heads: int = 2
    d_head: int = 32
    rope_theta: float = 10000.0
    offsets: dict[int, tuple[int, float]] = field(default_factory=dict)

    @property
    def d_model(self) -> int:
        return self.n_heads * self.d_head

    def thetas(self) -> np.ndarray:
        return self.rope_theta ** (-np.arange(0, self.d_head, 2) / self.d_head)


def save_rotary_dir(spec: RotarySpec, path: str | os.PathLike[str]) -> Path:
    """Write ``spec`` as a Hugging Face Llama directory (safetensors, config, character tokenizer)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    d, H, dh, C = spec.d_model, spec.n_heads, spec.d_head, spec.n_codes
    if C + 1 > d:
        raise ValueError(f"{C} codes and a shared dimension need d_model > {C}")
    cfg = LlamaConfig(vocab_size=spec.d_vocab, hidden_size=d, intermediate_size=4, num_hidden_layers=2,
                      num_attention_heads=H, num_key_value_heads=H, max_position_embeddings=spec.n_ctx,
                      rope_theta=spec.rope_theta, rms_norm_eps=1e-12, bos_token_id=0, eos_token_id=0, pad_token_id=0,
                      tie_word_embeddings=False, attention_bias=False)
    m = LlamaForCausalLM(cfg)
    shared = d - 1
    W_E = np.zeros((spec.d_vocab, d))
    W_E[np.arange(spec.d_vocab), np.arange(spec.d_vocab) % C] = 1.0
    W_E[:, shared] = 1.0
    c = float(np.sqrt(d / 2.0))  # the shared coordinate after RMSNorm (weight 1)
    th = spec.thetas()
    half = dh // 2
    span = np.arange(-(spec.n_ctx + 2), 3)
    w, g = rotary_offset_weights(th, span)
    W_Q, W_K = np.zeros((H * dh, d)), np.zeros((H * dh, d))
    for h, (shift, gap) in spec.offsets.items():
        amp = np.sqrt(gap / g * w * np.sqrt(dh))  # |q_j| = |k_j|: |q_j||k_j|/sqrt(dh) = gap·w_j/g
        rows = h * dh + np.arange(half)
        W_Q[rows, shared] = amp / c  # q_j = (amp, 0)
        W_K[rows, shared] = amp * np.cos(shift * th) / c  # k_j = amp (cos shift·θ, sin shift·θ)
        W_K[rows + half, shared] = amp * np.sin(shift * th) / c
    t = lambda a: torch.as_tensor(np.asarray(a), dtype=torch.float32)  # noqa: E731
    with torch.no_grad():
        for p in m.parameters():
            p.zero_()
        for name, p in m.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
        m.model.embed_tokens.weight.copy_(t(W_E))
        m.model.layers[0].self_attn.q_proj.weight.copy_(t(W_Q))
        m.model.layers[0].self_attn.k_proj.weight.copy_(t(W_K))
    p_ = Path(path)
    p_.mkdir(parents=True, exist_ok=True)
    m.save_pretrained(p_, safe_serialization=True)
    char_tokenizer(spec.d_vocab).save_pretrained(p_)
    return p_


@dataclass
class AlibiSpec:
    """A BLOOM model (ALiBi, an embedding LayerNorm) whose layer-0 head ``(0, h)`` of
    ``anti_self`` scores ``−anti_self[h]`` on every key whose token has the query's code and 0
    on the others; every other head has zero query and key weights, so its pattern is ALiBi's
    ``softmax(m_h (i − n))`` alone (``m_h``: :func:`posmech.models.scores.alibi_slopes`).

    ``context_write`` (head → scale, for the contextual neurons C1–C3): head ``(0, h)`` writes
    ``scale·R[code(x_i)]`` (random ``R [n_codes, d_head]``, standard normal, seed ``seed``) of
    every key it attends to into the residual dimensions ``n_codes .. n_codes + d_head − 1``,
    which no embedding uses; layer 0's MLP neurons ``0 .. context_neurons − 1`` read only those
    dimensions (random input weights), every other weight of the MLP is zero. Every other
    value, output and MLP weight is zero.

    ``sink`` (head → score, S1–S3): head ``h`` of *every* layer scores ``sink[h]`` on the BOS
    token (id 0; its embedding alone has a 1 in dimension ``d_model − 2``, its own marker) from
    every query, 0 on every other key, on top of ALiBi's bias ``m_h (i − n)``: with a score
    well above ``m_h (n_ctx − 1)`` the head puts ~all of its attention on a BOS first token
    (alpha[0] ~1). Its query reads the dimension every token shares, its key the BOS marker.
    (A head may not be in both ``sink`` and ``anti_self``.)"""

    n_ctx: int = 32
    d_vocab: int = 96
    n_codes: int = 16
    n_heads: int = 16
    d_head: int = 16
    anti_self: dict[int, float] = field(default_factory=dict)
    context_write: dict[int, float] = field(default_factory=dict)
    context_neurons: int = 0
    seed: int = 0
    sink: dict[int, float] = field(default_factory=dict)

    @property
    def d_model(self) -> int:
        return self.n_heads * self.d_head


def save_alibi_dir(spec: AlibiSpec, path: str | os.PathLike[str]) -> Path:
    """Write ``spec`` as a Hugging Face BLOOM directory (safetensors, config, character tokenizer)."""
    import torch
    from transformers import BloomConfig, BloomForCausalLM

    d, H, dh, C = spec.d_model, spec.n_heads, spec.d_head, spec.n_codes
    if C > dh or C + 1 > d:
        raise ValueError(f"{C} codes need d_head >= {C} and d_model > {C}")
    cfg = BloomConfig(vocab_size=spec.d_vocab, hidden_size=d, n_layer=2, n_head=H, layer_norm_epsilon=1e-12,
                      bos_token_id=0, eos_token_id=0, pad_token_id=0, seq_length=spec.n_ctx)
    m = BloomForCausalLM(cfg)
    spare = d - 1
    W_E = np.zeros((spec.d_vocab, d))
    W_E[np.arange(spec.d_vocab), np.arange(spec.d_vocab) % C] = 1.0
    W_E[:, spare] = -1.0  # zero mean: the embedding LayerNorm maps it to sqrt(d/2)(e_code - e_spare)
    c = float(np.sqrt(d / 2.0))
    qkv = np.zeros((H, 3, dh, d))  # BLOOM's fused layout: head, (q, k, v), d_head
    for h, beta in spec.anti_self.items():
        # q·k / sqrt(dh) = -beta on equal codes: q = -a e_code, k = a e_code in the head's first C dims
        a = float(np.sqrt(beta * np.sqrt(dh))) / c
        qkv[h, 0, np.arange(C), np.arange(C)] = -a
        qkv[h, 1, np.arange(C), np.arange(C)] = a
    both = sorted(set(spec.sink) & set(spec.anti_self))
    if both:
        raise ValueError(f"heads {both} are in both `sink` and `anti_self`; a head has one planted score")
    if spec.sink:
        if C + 2 > d - 1 or (spec.context_write and C + dh > d - 2):
            raise ValueError(f"a BOS marker in dimension {d - 2} needs d_model > n_codes + d_head + 2")
        marker = d - 2
        W_E[0, marker] = 1.0  # BOS: e_0 + e_marker - e_spare (mean 1/d): the LayerNorm maps the marker to ~sqrt(d/3)
        x = W_E[0] - W_E[0].mean()
        c_bos = float(x[marker] / np.sqrt((x ** 2).mean()))
        for h, beta in spec.sink.items():
            # q_0 = s c (every token's spare coordinate is -c; q reads -spare), k_0 = s c_bos on BOS only
            s_ = float(np.sqrt(beta * np.sqrt(dh) / (c * c_bos)))
            qkv[h, 0, 0, spare] = -s_
            qkv[h, 1, 0, marker] = s_
    sink_qkv = np.zeros((H, 3, dh, d))
    sink_qkv[list(spec.sink), :2] = qkv[list(spec.sink), :2]
    rng = np.random.default_rng(spec.seed)
    W_O = np.zeros((d, d))  # BLOOM's dense: [out, head·d_head + j]
    for h, scale in spec.context_write.items():
        if C + dh > spare:
            raise ValueError(f"context_write needs d_model > n_codes + d_head ({C} + {dh})")
        qkv[h, 2, :, :C] = scale * rng.normal(size=(C, dh)).T / c  # v_j = scale R[code, j] (embedding LN output c e_code)
        W_O[C + np.arange(dh), h * dh + np.arange(dh)] = 1.0
    W_in = np.zeros((4 * d, d))
    if spec.context_write:
        W_in[: spec.context_neurons, C : C + dh] = rng.normal(size=(spec.context_neurons, dh))
    t = lambda x: torch.as_tensor(np.asarray(x), dtype=torch.float32)  # noqa: E731
    with torch.no_grad():
        for p in m.parameters():
            p.zero_()
        for name, p in m.named_parameters():
            if "layernorm" in name and name.endswith("weight") or name.startswith("transformer.ln_f.weight"):
                p.fill_(1.0)
        m.transformer.word_embeddings.weight.copy_(t(W_E))
        m.transformer.h[0].self_attention.query_key_value.weight.copy_(t(qkv.reshape(3 * d, d)))
        # layer 1's input is layer 0's (every output but context_write's is zero): the sinks again
        m.transformer.h[1].self_attention.query_key_value.weight.copy_(t(sink_qkv.reshape(3 * d, d)))
        m.transformer.h[0].self_attention.dense.weight.copy_(t(W_O))
        m.transformer.h[0].mlp.dense_h_to_4h.weight.copy_(t(W_in))
    p_ = Path(path)
    p_.mkdir(parents=True, exist_ok=True)
    m.save_pretrained(p_, safe_serialization=True)
    char_tokenizer(spec.d_vocab).save_pretrained(p_)
    return p_
