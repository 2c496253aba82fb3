"""Contextual attention heads in layer 0 (claims K6–K10, seed post 004).

The layer-0 decomposition
-------------------------
Layer 0 reads the residual ``r_i = e(x_i) + p_i`` (token embedding ``e = W_E[x]``
``[d_model]`` plus positional embedding ``p_i = W_pos[i]``), so every layer-0 attention
score is a function of the embedding matrices alone, computed here in float64 from the
model's own weights (no forward pass; tests check it equals the model's layer-0 pattern).
Take a head ``h`` (``W_Q, W_K [d_model, d_head]``, ``b_Q, b_K [d_head]``, score scale
``σ_att``, √d_head for GPT-2), a destination token ``x_n = d`` at position ``n`` and keys
``i = 0..n``.  LayerNorm is ``LN(r) = γ ⊙ (r − mean r) / σ(r) + β`` with
``σ(r) = sqrt(var(r) + eps)`` (TransformerLens's ``blocks.0.ln1.hook_scale``).

* query (exact LayerNorm, one vector per destination): ``q_h(d, n) = LN(e(d) + p_n) W_Q + b_Q``
  ``[d_head]``;
* **LayerNorm treated as linear at its measured scale** ``s`` for the keys (``s`` = the
  median of ``hook_scale`` over the tokens of a corpus, or a configured number):
  ``LN(e + p_i) ≈ γ⊙(ẽ + p̃_i)/s + β`` with ``ẽ, p̃`` centred over ``d_model``; the key
  splits into a **positional key** ``kp_h(i) = (γ⊙p̃_i/s + β) W_K + b_K`` ``[d_head]`` and
  a **content key** ``kc_h(x) = (γ⊙ẽ(x)/s) W_K`` ``[d_head]``;
* **positional score** ``π_h(n, i) = q_h(d, n)·kp_h(i) / σ_att``  ``[n + 1]`` per ``n``;
* **content score** ``κ_h(n, x) = q_h(d, n)·kc_h(x) / σ_att`` (depends on the key's token only);
* **positional pattern** ``p_h(n, i) = softmax_{i ≤ n} π_h(n, i)`` (the pattern if every
  key had the same token);
* **content factor** ``c_h(n, i) = exp κ_h(n, x_i)``;
* **denominator** ``Z_h(n) = Σ_{i ≤ n} p_h(n, i)·c_h(n, i)``, and the (linear-LN)
  attention is ``A_h(n, i) = p_h(n, i)·c_h(n, i) / Z_h(n)`` — an identity, not an
  approximation, once LN is linear.
* **exact pattern**: ``A*_h(n, i) = softmax_i q_h(d, n)·(LN(e(x_i) + p_i) W_K + b_K) / σ_att``
  with the real LayerNorm; its denominator relative to the same positional pattern is
  ``Z*_h(n) = Σ_i exp(s*_h(n, i)) / Σ_i exp π_h(n, i)`` (so ``A* = exp(s*)/(Σ exp π · Z*)``).
  The quality of the linear approximation is the total variation ``TV(A, A*) = ½ Σ_i |A − A*|``
  per head, destination position and text (stored, and reported).

When the destination token is fixed (``d = " the"``, K8/K9), the keys ``0..n−1`` carry the
text's tokens and key ``n`` carries ``d`` itself.  Everything is computed with log-sum-exp
(``log Z``), never from overflowing exponentials.

Shapes: ``H`` heads of layer 0, ``P`` positions (``n_ctx``), ``V`` vocabulary, ``T``
texts, ``N`` destination positions, ``K`` keys.

Artifact ``results/{model}/contextual/layer0.h5`` (kind ``layer0_decomposition``, rule
``layer0_decomposition``; every dataset in docs/artifacts.md): the measured LayerNorm scale
distribution, the factors ``query [H, P, d_head]`` (destination token fixed),
``positional_key [H, P, d_head]``, ``content_key [H, V, d_head]`` from which any ``π``, ``κ``,
``p``, ``c`` is one dot product (:class:`Decomposition`), the texts used, and for each text
``log Z`` (linear and exact) and ``TV(A, A*)`` at every destination position: what K8, K9
and the contextual-neuron rules (C1–C3) read instead of recomputing.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from posmech.analyses.attention import head_name
from posmech.errors import PosmechError
from posmech.models.architecture import ALIBI_TYPES, ROTARY_TYPES, score_divisor

KIND = "layer0_decomposition"
DESCRIPTIONS = {
    "ln_scale/levels": "[9] quantile levels of the LN-scale quantiles",
    "ln_scale/quantiles": "[9] quantiles of blocks.0.ln1.hook_scale over the scale corpus's tokens (position 0 excluded)",
    "ln_scale/counts": "[50] histogram counts of the LN scale (position 0 excluded)",
    "ln_scale/edges": "[51] histogram bin edges of the LN scale",
    "ln_scale/position0": "[n_documents] the LN scale at position 0 (BOS) of each document",
    "factors/query": "[H, n_ctx, d_head] exact-LN query of the fixed destination token at every position n",
    "factors/positional_key": "[H, n_ctx, d_head] positional key (gamma*p_i/s + beta) W_K + b_K, LN linear at scale s",
    "factors/content_key": "[H, d_vocab, d_head] content key (gamma*e(x)/s) W_K of every token, LN linear at scale s",
    "texts/corpus": "[T] corpus of each text (the pattern corpus first)",
    "texts/doc_index": "[T] document index of each text in its corpus's tokens file",
    "texts/title": "[T] title of each text",
    "texts/token_ids": "[T, max_position + 1] the first tokens of each text",
    "denominators/positions": "[N] destination positions n = 1..max_position",
    "denominators/log_z_linear": "[T, H, N] log Z_h(n), LN linear, destination token fixed at n",
    "denominators/log_z_exact": "[T, H, N] log Z*_h(n): real-LN normaliser relative to the positional pattern's",
    "denominators/tv_linear_exact": "[T, H, N] total variation between the linear-LN and the exact attention rows",
}
RULE = "layer0_decomposition"
CLASSES = ("duplicate_token", "detokenization", "contextual", "other")
#: model types without learned absolute positions: the architecture module's rotary and
#: ALiBi lists, and Falcon and MPT (rotary or ALiBi by their config)
ROTARY = (*ROTARY_TYPES, *ALIBI_TYPES, "falcon", "mpt")


# --------------------------------------------------------------------------- weights
@dataclass
class Layer0Weights:
    """Layer-0 weights of a GPT-2-style model with learned absolute positions (float64).

    ``W_E [V, d]``, ``W_pos [P, d]``, ``ln_w, ln_b [d]`` (LayerNorm γ, β), ``eps``,
    ``W_Q, W_K [H, d, d_head]``, ``b_Q, b_K [H, d_head]``, ``attn_scale`` (scores are
    divided by it)."""

    W_E: np.ndarray
    W_pos: np.ndarray
    ln_w: np.ndarray
    ln_b: np.ndarray
    eps: float
    W_Q: np.ndarray
    b_Q: np.ndarray
    W_K: np.ndarray
    b_K: np.ndarray
    attn_scale: float

    @property
    def n_heads(self) -> int:
        return int(self.W_Q.shape[0])

    @property
    def n_ctx(self) -> int:
        return int(self.W_pos.shape[0])

    @property
    def d_vocab(self) -> int:
        return int(self.W_E.shape[0])

    def resid(self, ids: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """``r = W_E[ids] + W_pos[pos]`` ``[T, d]``."""
        return self.W_E[np.asarray(ids)] + self.W_pos[np.asarray(pos)]

    def ln_scale(self, ids: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """``blocks.0.ln1.hook_scale``: ``sqrt(var(r) + eps)`` per token ``[T]``."""
        return np.sqrt(self.resid(ids, pos).var(axis=-1) + self.eps)

    def ln(self, ids: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """The exact post-ln1 embedding ``[T, d]``."""
        r = self.resid(ids, pos)
        r = r - r.mean(axis=-1, keepdims=True)
        return r / np.sqrt(np.square(r).mean(axis=-1, keepdims=True) + self.eps) * self.ln_w + self.ln_b

    def _project(self, x: np.ndarray, W: np.ndarray) -> np.ndarray:
        """``x [T, d] @ W [H, d, d_head]`` → ``[H, T, d_head]`` as one BLAS matrix product."""
        H, d, dh = W.shape
        return (x @ W.transpose(1, 0, 2).reshape(d, H * dh)).reshape(len(x), H, dh).transpose(1, 0, 2)

    def queries(self, ids: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """Exact-LN queries ``[H, T, d_head]`` of tokens ``ids`` at positions ``pos``."""
        return self._project(self.ln(ids, pos), self.W_Q) + self.b_Q[:, None]

    def exact_keys(self, ids: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """Exact-LN keys ``[H, T, d_head]``."""
        return self._project(self.ln(ids, pos), self.W_K) + self.b_K[:, None]

    def positional_keys(self, s: float) -> np.ndarray:
        """``kp_h(i) = (γ⊙p̃_i/s + β) W_K + b_K`` for every position ``[H, P, d_head]``
        (computed once per ``s``)."""
        cache = self.__dict__.setdefault("_positional_keys", {})
        if s not in cache:
            p = self.W_pos - self.W_pos.mean(axis=-1, keepdims=True)
            cache.clear()
            cache[s] = self._project(p / s * self.ln_w + self.ln_b, self.W_K) + self.b_K[:, None]
        return cache[s]

    def content_keys(self, s: float, ids: np.ndarray | None = None) -> np.ndarray:
        """``kc_h(x) = (γ⊙ẽ(x)/s) W_K`` ``[H, U, d_head]`` for tokens ``ids`` (all when None)."""
        e = self.W_E if ids is None else self.W_E[np.asarray(ids)]
        e = e - e.mean(axis=-1, keepdims=True)
        return self._project(e / s * self.ln_w, self.W_K)


def refuse_unsupported(hf_config: dict[str, Any], model: str, key: str = "contextual.models") -> None:
    """Rotary/ALiBi and shortformer models have no positional embedding in the residual
    stream, so there is no layer-0 positional score: a clear error naming the model and ``key``."""
    mtype = hf_config.get("model_type")
    if mtype in ROTARY or hf_config.get("rotary") or hf_config.get("positional_embedding_type") in ("rotary", "alibi"):
        raise PosmechError(
            f"model {model!r} (model_type {mtype!r}) uses rotary/ALiBi positions: layer 0 has no positional "
            f"embedding in the residual stream to decompose; remove {model!r} from `{key}`"
        )
    if hf_config.get("shortformer_pos") or hf_config.get("positional_embedding_type") == "shortformer":
        raise PosmechError(
            f"model {model!r} uses shortformer positions (added to queries and keys only): remove it from `{key}`"
        )


def as_float64(t: Any) -> np.ndarray:
    """A torch tensor or numpy array as a float64 numpy array."""
    if hasattr(t, "detach"):
        t = t.detach().double().cpu().numpy()
    return np.asarray(t, dtype=np.float64)


#: model types whose layer-0 weights are read through the engine's converter
#: (:func:`posmech.models.lens.hf_state`, TransformerLens's layout) and then
#: :func:`weights_from_tl`: OPT (its position table from row 2, ``q·k/sqrt(d_head)``)
STATE_TYPES = ("opt",)


def hf_param(model: Any, name: str) -> Any:
    """The parameter ``name`` (``model.decoder.layers.0.fc1.weight``) of a Hugging Face
    model or of a :class:`posmech.models.loading.WeightView`, as a torch tensor; ``None``
    when the model has none (a bias-free projection)."""
    obj = model
    for part in name.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    if hasattr(obj, "detach"):
        return obj
    import torch

    return torch.from_numpy(np.ascontiguousarray(obj))


def layer0_state(model: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Layer 0's weights of a Hugging Face model of a :data:`STATE_TYPES` type (or its
    directory's ``WeightView``) as a TransformerLens state dict and config (a dict: ``d_model``,
    ``d_head``, ``d_mlp``, ``eps``, ``attn_scale`` the divisor of ``q·k``, ``post_ln``, …), by
    the forward engine's own converter :func:`posmech.models.lens.hf_state` read for one
    layer (the other layers are not read)."""
    from dataclasses import asdict

    from posmech.models.lens import hf_state

    cfg = model.config.to_dict()
    one = {**cfg, "num_hidden_layers": 1, "n_layer": 1, "num_layers": 1}
    sd, lens_cfg = hf_state(lambda n: hf_param(model, n), one)
    # TransformerLens's names (attn_scale already the config's own divisor): a TransformerLens config
    return sd, {k: v for k, v in asdict(lens_cfg).items() if k != "model_type"}


def weights_from_hf(model: Any, name: str = "model") -> Layer0Weights:
    """:class:`Layer0Weights` of a Hugging Face GPT-2, GPT-Neo or OPT model, or of its
    directory's :class:`posmech.models.loading.WeightView` (its raw weights: the function,
    hence the decomposition, does not depend on TransformerLens processing). OPT goes
    through :func:`layer0_state` (``W_pos`` is its position table from row 2, the row of
    position 0)."""
    cfg = model.config.to_dict()
    refuse_unsupported(cfg, name)
    mtype = cfg.get("model_type")
    if mtype in STATE_TYPES:
        return weights_from_tl(*layer0_state(model), name)
    body = getattr(model, "transformer", None)
    get = as_float64
    if body is None or mtype not in ("gpt2", "gpt_neo"):
        raise PosmechError(f"model {name!r}: the layer-0 decomposition supports GPT-2, GPT-Neo and OPT models with "
                           f"learned positions, not model_type {mtype!r}; remove it from `contextual.models`")
    blk = body.h[0]
    d = int(cfg.get("n_embd") or cfg["hidden_size"])
    H = int(cfg.get("n_head") or cfg["num_heads"])
    dh = d // H
    if mtype == "gpt2":
        W, b = get(blk.attn.c_attn.weight), get(blk.attn.c_attn.bias)  # Conv1D [d, 3d]
        split = lambda m: m.reshape(d, H, dh).transpose(1, 0, 2)  # noqa: E731
        W_Q, W_K = split(W[:, :d]), split(W[:, d : 2 * d])
        b_Q, b_K = b[:d].reshape(H, dh), b[d : 2 * d].reshape(H, dh)
    else:
        if cfg.get("attention_layers", ["global"])[0] != "global":
            raise PosmechError(f"model {name!r}: layer 0 is a sliding-window layer; remove it from `contextual.models`")
        att = blk.attn.attention
        lin = lambda m: get(m.weight).T.reshape(d, H, dh).transpose(1, 0, 2)  # noqa: E731
        bias = lambda m: get(m.bias).reshape(H, dh) if m.bias is not None else np.zeros((H, dh))  # noqa: E731
        W_Q, W_K, b_Q, b_K = lin(att.q_proj), lin(att.k_proj), bias(att.q_proj), bias(att.k_proj)
    return Layer0Weights(get(body.wte.weight), get(body.wpe.weight), get(blk.ln_1.weight), get(blk.ln_1.bias),
                         float(cfg.get("layer_norm_epsilon", 1e-5)), W_Q, b_Q, W_K, b_K, score_divisor(cfg, dh))


def weights_from_tl(state: dict[str, Any], cfg: dict[str, Any], name: str = "model") -> Layer0Weights:
    """:class:`Layer0Weights` of a legacy TransformerLens checkpoint (``attn-only-2l`` and the
    demo's attention-only model): ``embed.W_E``, ``pos_embed.W_pos``, ``blocks.0.ln1.w/b``,
    ``blocks.0.attn.W_Q/W_K [H, d, d_head]``, ``b_Q/b_K [H, d_head]``; TransformerLens's
    LayerNorm eps (``eps``, default 1e-5) and score scale (:func:`posmech.models.architecture.score_divisor`:
    its ``attn_scale``, else √d_head unless ``use_attn_scale`` is false). ``cfg`` may be the
    engine's config of a Hugging Face model (:func:`layer0_state`); a post-LayerNorm one is
    refused."""
    refuse_unsupported(cfg, name)
    if cfg.get("post_ln"):
        raise PosmechError(f"model {name!r}: its LayerNorm comes after each residual addition (OPT's "
                           "do_layer_norm_before false), so layer 0's attention reads the raw residual, not a "
                           "LayerNorm of it: the layer-0 decomposition is not defined; remove it from `contextual.models`")
    norm = cfg.get("normalization_type", cfg.get("normalization", "LN"))
    if norm not in ("LN", "LNPre"):
        raise PosmechError(f"model {name!r}: layer-0 normalisation {norm!r} is not a LayerNorm; remove it from "
                           "`contextual.models`")
    get = lambda k: np.asarray(state[k], dtype=np.float64)  # noqa: E731
    d = int(cfg["d_model"])
    ln_w = get("blocks.0.ln1.w") if "blocks.0.ln1.w" in state else np.ones(d)
    ln_b = get("blocks.0.ln1.b") if "blocks.0.ln1.b" in state else np.zeros(d)
    scale = score_divisor(cfg, int(cfg["d_head"]), f"model {name!r}")
    W_Q, W_K = get("blocks.0.attn.W_Q"), get("blocks.0.attn.W_K")
    bias = lambda k, W: get(k) if k in state else np.zeros((W.shape[0], W.shape[-1]))  # noqa: E731
    return Layer0Weights(get("embed.W_E"), get("pos_embed.W_pos"), ln_w, ln_b, float(cfg.get("eps", 1e-5)),
                         W_Q, bias("blocks.0.attn.b_Q", W_Q), W_K, bias("blocks.0.attn.b_K", W_K), scale)


def load_weights(manifest: dict[str, Any], name: str, tokenizer: bool = True) -> tuple[Layer0Weights, Any]:
    """Layer-0 weights of a configured model (``manifest`` of
    :func:`posmech.models.loading.read_manifest`) and its tokenizer (``None`` when
    ``tokenizer`` is false: loading it imports ``transformers``): Hugging Face GPT-2 /
    GPT-Neo / pre-LayerNorm OPT directories and legacy TransformerLens checkpoints (safetensors). The weights
    are read from the files; no model is built."""
    from posmech.models.loading import is_tl_legacy_dir, load_tokenizer, verify_weights, weight_view

    hf_dir = Path(manifest["hf_dir"])
    verify_weights(manifest)
    cfg = json.loads((hf_dir / "config.json").read_text())
    refuse_unsupported(cfg, name)
    if is_tl_legacy_dir(hf_dir):
        from safetensors.numpy import load_file

        own = (hf_dir / "tokenizer_config.json").exists()
        if not own and not cfg.get("tokenizer_name"):
            raise PosmechError(f"model {name!r}: {str(hf_dir)!r} has no tokenizer; save it into the directory")
        tok = load_tokenizer(hf_dir if own else cfg["tokenizer_name"]) if tokenizer else None
        return weights_from_tl(load_file(str(hf_dir / "model.safetensors")), cfg, name), tok
    return weights_from_hf(weight_view(manifest), name), load_tokenizer(hf_dir) if tokenizer else None


# --------------------------------------------------------------------------- decomposition
def _logsumexp(a: np.ndarray, axis: int = -1) -> np.ndarray:
    m = np.max(a, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        return np.squeeze(m, axis) + np.log(np.sum(np.exp(a - m), axis=axis))


@dataclass
class Decomposition:
    """The decomposition of one text at destination positions ``positions [N]``:
    ``pi, kappa, exact [H, N, K]`` (scores; ``-inf`` / 0 for keys after ``n``), with
    ``K = max(positions) + 1``."""

    positions: np.ndarray
    pi: np.ndarray
    kappa: np.ndarray
    exact: np.ndarray

    @property
    def mask(self) -> np.ndarray:
        return np.arange(self.pi.shape[-1])[None, :] <= self.positions[:, None]  # [N, K]

    @property
    def p(self) -> np.ndarray:
        """Positional pattern ``[H, N, K]``."""
        return softmax(self.pi)

    @property
    def c(self) -> np.ndarray:
        """Content factor ``exp κ`` ``[H, N, K]`` (0 after ``n``)."""
        return np.where(self.mask, np.exp(np.where(self.mask, self.kappa, 0.0)), 0.0)

    @property
    def log_z(self) -> np.ndarray:
        """``log Z_h(n)`` ``[H, N]`` (linear LN)."""
        return _logsumexp(self.pi + self.kappa) - _logsumexp(self.pi)

    @property
    def log_z_exact(self) -> np.ndarray:
        """``log Z*_h(n)`` ``[H, N]`` (real LN, relative to the same positional pattern)."""
        return _logsumexp(self.exact) - _logsumexp(self.pi)

    @property
    def linear(self) -> np.ndarray:
        """Linear-LN attention ``p·c/Z`` ``[H, N, K]``."""
        return softmax(self.pi + self.kappa)

    @property
    def attention(self) -> np.ndarray:
        """Exact attention ``[H, N, K]``."""
        return softmax(self.exact)

    def tv(self) -> np.ndarray:
        """``TV(A, A*)`` ``[H, N]``."""
        return 0.5 * np.abs(self.linear - self.attention).sum(axis=-1)


def softmax(scores: np.ndarray) -> np.ndarray:
    """Softmax over the last axis; ``-inf`` entries get 0."""
    m = np.max(scores, axis=-1, keepdims=True)
    e = np.exp(scores - m)
    return e / e.sum(axis=-1, keepdims=True)


@dataclass
class TextKeys:
    """Keys of one text computed once for several :func:`decompose` calls: the sorted
    token ids ``vocab [U]`` of the text (and destination), their content keys ``kc [H, U, d_head]``
    and the exact keys of the text's tokens ``exact [H, T, d_head]``."""

    vocab: np.ndarray
    kc: np.ndarray
    exact: np.ndarray

    @classmethod
    def of(cls, w: Layer0Weights, s: float, ids: np.ndarray, destination: int | None = None) -> TextKeys:
        ids = np.asarray(ids, dtype=np.int64)
        vocab = np.unique(np.concatenate([ids, [] if destination is None else [destination]]).astype(np.int64))
        return cls(vocab, w.content_keys(s, vocab), w.exact_keys(ids, np.arange(len(ids))))


def decompose(w: Layer0Weights, s: float, ids: np.ndarray, positions: Sequence[int] | np.ndarray,
              destination: int | None = None, keys: TextKeys | None = None) -> Decomposition:
    """Decompose layer 0 on text ``ids`` at destination ``positions`` (strictly increasing).

    ``destination``: a token id put at each destination position ``n`` (keys ``0..n−1``
    keep the text's tokens, key ``n`` is ``destination``), or None for the text's own token
    (then ``ids`` must reach the largest position).  Memory ``~5·H·N·K`` floats: pass a
    block of positions at a time for long texts, with the text's :class:`TextKeys`."""
    pos = np.asarray(positions, dtype=np.int64)
    K = int(pos.max()) + 1
    ids = np.asarray(ids, dtype=np.int64)
    need = K - 1 if destination is not None else K
    if len(ids) < need:
        raise PosmechError(f"text of {len(ids)} tokens is shorter than destination position {K - 1} needs ({need})")
    kid = ids[:K].copy() if len(ids) >= K else np.concatenate([ids, [ids[0]]])
    if destination is not None:
        kid[K - 1] = destination  # the largest n's own key (each row's key n is set below)
    dest = np.full(len(pos), destination) if destination is not None else ids[pos]
    if keys is None or K > keys.exact.shape[1] + (destination is not None):
        keys = TextKeys.of(w, s, ids, destination)
    q = w.queries(dest, pos)  # [H, N, dh]
    kp = w.positional_keys(s)[:, :K]
    key_inv, dest_inv = np.searchsorted(keys.vocab, kid), np.searchsorted(keys.vocab, dest)
    if not (np.array_equal(keys.vocab[np.minimum(key_inv, len(keys.vocab) - 1)], kid)
            and np.array_equal(keys.vocab[np.minimum(dest_inv, len(keys.vocab) - 1)], dest)):
        raise PosmechError("internal: TextKeys of another text or destination token passed to decompose")
    kappa_u = q @ keys.kc.transpose(0, 2, 1) / w.attn_scale  # [H, N, U]
    kappa = np.take(kappa_u, key_inv, axis=2)  # [H, N, K]
    pi = q @ kp.transpose(0, 2, 1) / w.attn_scale
    ke = keys.exact[:, :K]
    if ke.shape[1] < K:
        ke = np.concatenate([ke, np.zeros_like(ke[:, :1])], axis=1)  # key n, set below
    exact = q @ ke.transpose(0, 2, 1) / w.attn_scale
    if destination is not None:  # key n is the destination token itself
        ke_d = w.exact_keys(dest, pos)  # [H, N, dh]
        rows = np.arange(len(pos))
        kappa[:, rows, pos] = kappa_u[:, rows, dest_inv]
        exact[:, rows, pos] = np.einsum("hne,hne->hn", q, ke_d) / w.attn_scale
    mask = np.arange(K)[None, :] <= pos[:, None]
    pi = np.where(mask, pi, -np.inf)
    exact = np.where(mask, exact, -np.inf)
    kappa = np.where(mask, kappa, 0.0)
    return Decomposition(pos, pi, kappa, exact)


def denominators(w: Layer0Weights, s: float, ids: np.ndarray, positions: np.ndarray, destination: int,
                 block: int = 128) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``log Z``, ``log Z*`` and ``TV(A, A*)``, each ``[H, N]``, of one text with the
    destination token fixed, in blocks of ``block`` positions."""
    pos = np.asarray(positions, dtype=np.int64)
    out = [np.empty((w.n_heads, len(pos))) for _ in range(3)]
    keys = TextKeys.of(w, s, np.asarray(ids)[: int(pos.max())], destination)
    for a in range(0, len(pos), block):
        dec = decompose(w, s, ids, pos[a : a + block], destination, keys)
        out[0][:, a : a + block] = dec.log_z
        out[1][:, a : a + block] = dec.log_z_exact
        out[2][:, a : a + block] = dec.tv()
    return out[0], out[1], out[2]


def positional_pattern(query: np.ndarray, positional_key: np.ndarray, n: int, attn_scale: float) -> np.ndarray:
    """``p_h(n, ·)`` ``[H, n + 1]`` from the stored factors ``query, positional_key [H, P, d_head]``."""
    return softmax(np.einsum("he,hke->hk", query[:, n], positional_key[:, : n + 1]) / attn_scale)


def etc(p: np.ndarray) -> np.ndarray:
    """Effective Token Count ``1 / Σ p²`` over the last axis."""
    return 1.0 / np.square(p).sum(axis=-1)


def tv(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Total variation ``½ Σ |a − b|`` over the last axis."""
    return 0.5 * np.abs(a - b).sum(axis=-1)


def renormalised(p: np.ndarray, k0: int) -> np.ndarray:
    """``p`` over keys ``k0..`` renormalised (keys before ``k0`` dropped)."""
    q = p[..., k0:]
    return q / q.sum(axis=-1, keepdims=True)


# --------------------------------------------------------------------------- inputs
def single_token(tokenizer: Any, text: str, key: str) -> int:
    """The id of ``text`` if the tokenizer keeps it as one token; else a clear error naming ``key``."""
    ids = tokenizer(text, add_special_tokens=False).input_ids
    if len(ids) != 1:
        pieces = [tokenizer.decode([i]) for i in ids]
        raise PosmechError(f"config key `{key}`: {text!r} is {len(ids)} tokens for this model's tokenizer "
                           f"({pieces}); choose a string that is a single token")
    back = tokenizer.decode(ids)
    if back != text:
        raise PosmechError(f"config key `{key}`: {text!r} does not decode back from its token ({back!r}: the "
                           "tokenizer drops or changes characters); choose a string that is a single token")
    return int(ids[0])


def check_positions(positions: Sequence[int], n_ctx: int, key: str, model: str = "") -> None:
    """Every position below the model's context (``0..n_ctx−1``), else an error naming ``key``."""
    bad = [int(n) for n in positions if not 1 <= int(n) < n_ctx]
    if bad:
        of = f" (model {model})" if model else ""
        raise PosmechError(f"config key `{key}`{of}: position(s) {bad} are outside 1..{n_ctx - 1} (the model's "
                           f"context is {n_ctx}); lower them")


def choose_texts(corpora: dict[str, Any], n_per_corpus: int, min_length: int, seed: int,
                 key: str) -> list[dict[str, Any]]:
    """``n_per_corpus`` documents of at least ``min_length`` tokens from each corpus
    (:class:`posmech.data.tokens.TokenSet` by name), drawn with ``seed``; the first corpus's
    first text is the one whose patterns are drawn (K6, K10).  A corpus with too few long
    documents is an error naming ``key``."""
    rng = np.random.default_rng(seed)
    out = []
    for name, toks in corpora.items():
        lengths = toks.lengths()
        ok = np.flatnonzero(lengths >= min_length)
        if len(ok) < n_per_corpus:
            raise PosmechError(
                f"config key `{key}`: corpus {name!r} has {len(ok)} document(s) of at least {min_length} tokens "
                f"(longest {int(lengths.max())}), {n_per_corpus} needed: the largest position is beyond the texts; "
                "lower the positions or `contextual.texts.n_per_corpus`"
            )
        for j in np.sort(rng.choice(ok, size=n_per_corpus, replace=False)):
            out.append({"corpus": name, "doc_index": int(j), "title": toks.titles[int(j)],
                        "ids": np.asarray(toks.doc(int(j))[:min_length], dtype=np.int64)})
    return out


def ln_scale_summary(w: Layer0Weights, tokens: Any, max_tokens: int | None = None,
                     block: int = 8192) -> dict[str, Any]:
    """The distribution of ``blocks.0.ln1.hook_scale`` over the tokens of a corpus
    (:class:`posmech.data.tokens.TokenSet`): quantiles (levels 0, .01, .05, .25, .5, .75, .95,
    .99, 1), mean, a 50-bin histogram; all tokens (BOS included: listed separately)."""
    pos = np.concatenate([np.arange(n) for n in tokens.lengths()])
    ids = tokens.flat
    if max_tokens is not None:
        ids, pos = ids[:max_tokens], pos[:max_tokens]
    vals = np.concatenate([w.ln_scale(ids[a : a + block], pos[a : a + block]) for a in range(0, len(ids), block)])
    if not len(vals):
        raise PosmechError("the LayerNorm-scale corpus has no tokens")
    levels = np.array([0, 0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99, 1.0])
    non_first = vals[pos != 0] if (pos != 0).any() else vals
    counts, edges = np.histogram(non_first, bins=50)
    return {"levels": levels, "quantiles": np.quantile(non_first, levels), "mean": float(non_first.mean()),
            "std": float(non_first.std()), "n_tokens": int(len(non_first)), "position0": vals[pos == 0],
            "counts": counts, "edges": edges}


# --------------------------------------------------------------------------- artifact
def build_decomposition(w: Layer0Weights, destination: int, destination_text: str, scale_tokens: Any,
                        texts: list[dict[str, Any]], max_position: int, ln_scale: float | None,
                        path: str | os.PathLike[str], attrs: dict[str, Any],
                        progress: Any = None) -> dict[str, Any]:
    """Rule ``layer0_decomposition``: measure the LN scale on ``scale_tokens``, fix ``s``
    (``ln_scale`` or the median), compute the factors and every text's denominators at
    positions ``1..max_position`` and write ``path`` (layout in the module docstring)."""
    from posmech.hdf5 import STR, artifact_writer, describe

    summary = ln_scale_summary(w, scale_tokens)
    s = float(ln_scale) if ln_scale is not None else float(summary["quantiles"][4])
    positions = np.arange(1, max_position + 1)
    H, P = w.n_heads, w.n_ctx
    meta = {**attrs, "destination_token": destination_text, "destination_id": destination, "ln_scale_used": s,
            "ln_scale_source": "config" if ln_scale is not None else "median", "ln_eps": w.eps,
            "attn_scale": w.attn_scale, "n_heads": H, "d_head": int(w.W_Q.shape[-1]), "n_ctx": P,
            "max_position": max_position, "layer": 0}
    query = w.queries(np.full(P, destination), np.arange(P))
    with artifact_writer(path, KIND, RULE, meta) as f:
        g = f.create_group("ln_scale")
        for k in ("levels", "quantiles", "counts", "edges", "position0"):
            g.create_dataset(k, data=summary[k])
        for k in ("mean", "std", "n_tokens"):
            g.attrs[k] = summary[k]
        fa = f.create_group("factors")
        fa.create_dataset("query", data=query)
        fa.create_dataset("positional_key", data=w.positional_keys(s))
        ck = fa.create_dataset("content_key", shape=(H, w.d_vocab, query.shape[-1]), dtype="float32",
                               chunks=(1, min(w.d_vocab, 4096), query.shape[-1]))
        for a in range(0, w.d_vocab, 8192):
            ck[:, a : a + 8192] = w.content_keys(s, np.arange(a, min(a + 8192, w.d_vocab))).astype(np.float32)
        t = f.create_group("texts")
        t.create_dataset("corpus", data=[x["corpus"] for x in texts], dtype=STR)
        t.create_dataset("doc_index", data=np.array([x["doc_index"] for x in texts], dtype=np.int64))
        t.create_dataset("title", data=[x["title"] for x in texts], dtype=STR)
        t.create_dataset("token_ids", data=np.stack([x["ids"][: max_position + 1] for x in texts]).astype(np.int32))
        d = f.create_group("denominators")
        d.create_dataset("positions", data=positions)
        out = {k: d.create_dataset(k, shape=(len(texts), H, len(positions)), dtype="float64")
               for k in ("log_z_linear", "log_z_exact", "tv_linear_exact")}
        for j, x in enumerate(texts):
            lz, lze, tvs = denominators(w, s, x["ids"], positions, destination)
            out["log_z_linear"][j], out["log_z_exact"][j], out["tv_linear_exact"][j] = lz, lze, tvs
            if progress:
                progress(j + 1, len(texts))
        tv_med = float(np.median(f["denominators/tv_linear_exact"][()]))
        describe(f, DESCRIPTIONS)
    return {"ln_scale_used": s, "quantiles": dict(zip(summary["levels"].tolist(), summary["quantiles"].tolist())),
            "tv_median": tv_med, "n_texts": len(texts)}


@dataclass
class Layer0File:
    """The contents of ``layer0.h5`` (:func:`read_decomposition`)."""

    attrs: dict[str, Any]
    ln_scale: dict[str, Any]
    query: np.ndarray
    positional_key: np.ndarray
    texts: pd.DataFrame
    token_ids: np.ndarray
    positions: np.ndarray
    log_z_linear: np.ndarray
    log_z_exact: np.ndarray
    tv_linear_exact: np.ndarray
    path: str

    def content_key(self, ids: np.ndarray | None = None) -> np.ndarray:
        """``kc [H, U, d_head]`` (float32 on disk) of tokens ``ids`` (all when None)."""
        from posmech.hdf5 import open_artifact

        with open_artifact(self.path, KIND) as f:
            ds = f["factors/content_key"]
            if ids is None:
                return ds[()].astype(np.float64)
            ids = np.asarray(ids)
            u, inv = np.unique(ids, return_inverse=True)
            return ds[:, u, :].astype(np.float64)[:, inv]

    def pattern(self, n: int) -> np.ndarray:
        """Positional pattern ``p_h(n, ·)`` ``[H, n + 1]`` of the fixed destination token."""
        return positional_pattern(self.query, self.positional_key, n, float(self.attrs["attn_scale"]))


def read_decomposition(path: str | os.PathLike[str]) -> Layer0File:
    """Read ``layer0.h5`` (everything but the content keys, read on demand)."""
    from posmech.hdf5 import attr_json, open_artifact

    with open_artifact(path, KIND) as f:
        attrs = {k: attr_json(f, k) for k in f.attrs}
        g = f["ln_scale"]
        ln = {k: g[k][()] for k in g}
        ln.update({k: g.attrs[k] for k in g.attrs})
        dec = lambda a: [v.decode() if isinstance(v, bytes) else str(v) for v in a]  # noqa: E731
        texts = pd.DataFrame({"corpus": dec(f["texts/corpus"][()]), "doc_index": f["texts/doc_index"][()],
                              "title": dec(f["texts/title"][()])})
        return Layer0File(attrs, ln, f["factors/query"][()], f["factors/positional_key"][()], texts,
                          f["texts/token_ids"][()].astype(np.int64), f["denominators/positions"][()],
                          f["denominators/log_z_linear"][()], f["denominators/log_z_exact"][()],
                          f["denominators/tv_linear_exact"][()], str(path))


# --------------------------------------------------------------------------- K6
def window_grid(row: np.ndarray, n: int, window: int) -> np.ndarray:
    """The last ``window`` keys ``n − window + 1..n`` of a pattern row (NaN before key 0),
    for drawing as a ``√window × √window`` grid read row by row (the post's 20 × 20)."""
    out = np.full(window, np.nan)
    lo = max(0, n - window + 1)
    out[window - (n + 1 - lo):] = row[lo : n + 1]
    return out


def positional_patterns(w: Layer0Weights, s: float, ids: np.ndarray, positions: Sequence[int], destination: int,
                        window: int, k0: int) -> tuple[dict[int, dict[str, np.ndarray]], pd.DataFrame]:
    """K6 at each ``n`` of ``positions`` on text ``ids``: the positional pattern of the
    fixed ``destination`` token, that of the text's own token at ``n``, and the real
    (exact) attention row of that text, as ``[H, window]`` grids; and per head and ``n`` the
    ETC of each positional pattern, TV(positional pattern of the fixed token, real row) and
    TV between the two destination tokens' patterns (all over keys ``k0..n``, renormalised)."""
    grids: dict[int, dict[str, np.ndarray]] = {}
    rows = []
    for n in positions:
        fixed = decompose(w, s, ids, [n], destination)
        own = decompose(w, s, ids, [n], None)
        p_f, p_o, real = fixed.p[:, 0], own.p[:, 0], own.attention[:, 0]
        grids[int(n)] = {k: np.stack([window_grid(r, int(n), window) for r in a])
                         for k, a in (("fixed", p_f), ("own", p_o), ("real", real))}
        rf, ro, rr = (renormalised(a, k0) for a in (p_f, p_o, real))
        for h in range(w.n_heads):
            rows.append({"head": h, "n": int(n), "n_keys": int(n) - k0 + 1, "own_token_id": int(ids[n]),
                         "etc_fixed": float(etc(rf[h])), "etc_own": float(etc(ro[h])), "etc_real": float(etc(rr[h])),
                         "tv_fixed_vs_real": float(tv(rf[h], rr[h])), "tv_fixed_vs_own": float(tv(rf[h], ro[h])),
                         "tv_own_vs_real": float(tv(ro[h], rr[h])),
                         "real_mass_bos": float(real[h, 0]), "positional_mass_bos": float(p_f[h, 0])})
    return grids, pd.DataFrame(rows)


def positional_pattern_table(df: pd.DataFrame, model: str, tokenizer: Any) -> pd.DataFrame:
    """K6's table from the per (head, n) rows of :func:`positional_patterns`, in place: the
    columns ``claim`` (K6), ``model``, ``layer`` (0) and ``head_name`` put in front, and
    ``own_token`` (the text's own token at ``n``, decoded by ``tokenizer``) added; returns
    ``df``."""
    df.insert(0, "claim", "K6")
    df.insert(1, "model", model)
    df.insert(2, "layer", 0)
    df.insert(4, "head_name", [head_name(0, h) for h in df["head"]])
    df["own_token"] = [tokenizer.decode([int(t)]) for t in df["own_token_id"]]
    return df


# --------------------------------------------------------------------------- K7
def duplicate_scores(w: Layer0Weights, s: float, texts: Sequence[np.ndarray], max_position: int,
                     block: int = 128) -> tuple[np.ndarray, np.ndarray, int]:
    """Duplicate-token behaviour of every layer-0 head on real texts (each with its own
    destination tokens): over every destination ``n`` in ``1..max_position`` that has an
    earlier copy of its token at keys ``1..n−1``, the real attention mass on those copies
    (``dup_mass``) and the same mass under the positional pattern alone (what position
    would give them); returns ``dup_mass [H]``, ``excess [H] = dup_mass − positional mass``
    (the part the content score adds) and the number of such destinations.  None → error."""
    H = w.n_heads
    mass, pmass, count = np.zeros(H), np.zeros(H), 0
    for ids in texts:
        ids = np.asarray(ids, dtype=np.int64)
        pos_all = np.arange(1, min(max_position, len(ids) - 1) + 1)
        keys = TextKeys.of(w, s, ids[: int(pos_all.max()) + 1])
        for a in range(0, len(pos_all), block):
            pos = pos_all[a : a + block]
            K = int(pos.max()) + 1
            ki = np.arange(K)
            dup = (ids[None, :K] == ids[pos][:, None]) & (ki[None, :] >= 1) & (ki[None, :] < pos[:, None])
            has = dup.any(axis=1)
            if not has.any():
                continue
            dec = decompose(w, s, ids, pos, None, keys)
            mass += (dec.attention * dup).sum(axis=-1)[:, has].sum(axis=1)
            pmass += (dec.p * dup).sum(axis=-1)[:, has].sum(axis=1)
            count += int(has.sum())
    if count == 0:
        raise PosmechError("no destination position of the texts has an earlier copy of its token: the duplicate-"
                           "token score would be an average over nothing; use longer texts (`contextual.texts`)")
    return mass / count, (mass - pmass) / count, count


def classify(dup_excess: np.ndarray, local_mass: np.ndarray, etc_fraction: np.ndarray, duplicate_min_excess: float,
             local_min_mass: float, uniform_min_fraction: float) -> np.ndarray:
    """K7 classes, in this order: ``duplicate_token`` when the content score adds at least
    ``duplicate_min_excess`` attention to earlier copies of the destination token;
    else ``detokenization`` when the positional pattern puts at least ``local_min_mass`` on
    the last few keys (a local kernel); else ``contextual`` when the positional pattern is
    spread but not uniform (ETC / n_keys below ``uniform_min_fraction``); else ``other``."""
    out = np.full(len(dup_excess), "other", dtype=object)
    for h in range(len(out)):
        if dup_excess[h] >= duplicate_min_excess:
            out[h] = "duplicate_token"
        elif local_mass[h] >= local_min_mass:
            out[h] = "detokenization"
        elif etc_fraction[h] < uniform_min_fraction:
            out[h] = "contextual"
    return out


def head_classes(dec: Layer0File, dup_mass: np.ndarray, dup_excess: np.ndarray, n_dup: int, n: int, k0: int,
                 local_window: int, thresholds: dict[str, float], model: str) -> pd.DataFrame:
    """K7 table: one row per layer-0 head with every measured quantity and its class.
    Positional quantities come from the stored positional pattern of the fixed destination
    token at position ``n`` over keys ``k0..n`` (renormalised): ETC, ETC / n_keys, the mass on
    the last ``local_window`` keys (``n − local_window + 1..n``)."""
    p = renormalised(dec.pattern(n), k0)
    e = etc(p)
    frac = e / p.shape[-1]
    local = p[:, -local_window:].sum(axis=-1)
    cls = classify(dup_excess, local, frac, thresholds["duplicate_min_excess"], thresholds["local_min_mass"],
                   thresholds["uniform_min_fraction"])
    H = len(cls)
    return pd.DataFrame({"claim": "K7", "model": model, "layer": 0, "head": np.arange(H),
                         "head_name": [head_name(0, h) for h in range(H)], "n": n, "n_keys": p.shape[-1],
                         "duplicate_mass": dup_mass, "duplicate_excess": dup_excess, "n_duplicate_destinations": n_dup,
                         "etc": e, "etc_fraction": frac, "local_mass": local, "head_class": cls})


# --------------------------------------------------------------------------- K8
def denominator_spread(log_z: np.ndarray, positions: np.ndarray, from_n: int) -> np.ndarray:
    """How much a head's denominator varies across texts: the mean over destination
    positions ``n ≥ from_n`` of the standard deviation over texts of ``log Z_h(n)``
    (``log_z [T, H, N]`` → ``[H]``).  Fewer than two texts or no position: an error."""
    sel = np.asarray(positions) >= from_n
    if log_z.shape[0] < 2 or not sel.any():
        raise PosmechError(f"the denominator spread needs at least 2 texts and a position >= {from_n} "
                           "(`contextual.texts`, `contextual.denominator_from`)")
    return log_z[:, :, sel].std(axis=0).mean(axis=-1)


def most_varying(spread: np.ndarray, classes: Sequence[str], top: int) -> list[str]:
    """The ``top`` contextual heads with the largest spread (names, largest first)."""
    idx = [h for h in np.argsort(-spread) if classes[h] == "contextual"]
    return [head_name(0, int(h)) for h in idx[:top]]


#: the K7 classes whose heads are "broad" in K8's and the C claims' findings: the contextual
#: heads and "other" (the post: head 11 "behaves similarly to the contextual attention heads")
BROAD_CLASSES = ("contextual", "other")


def broad_spread_row(spread: np.ndarray, classes: Sequence[str], model: str, artifact: str) -> dict[str, Any]:
    """K8's finding row ``broad_max_spread``: the largest :func:`denominator_spread` among the
    broad layer-0 heads (:data:`BROAD_CLASSES`); no value, and why, when there is none."""
    broad = [h for h, c in enumerate(classes) if c in BROAD_CLASSES]
    row = {"claim": "K8", "model": model, "quantity": "broad_max_spread", "artifact": artifact}
    if not broad:
        return {**row, "value": None, "detail": "no layer-0 head is contextual or other (K7 classes: "
                + ", ".join(f"{head_name(0, h)} {c}" for h, c in enumerate(classes)) + ")"}
    h = max(broad, key=lambda i: spread[i])
    return {**row, "value": float(spread[h]),
            "detail": f"{head_name(0, h)} ({classes[h]}): std over texts of log Z, mean over destination positions; "
                      f"broad heads {', '.join(head_name(0, i) for i in broad)}"}


# --------------------------------------------------------------------------- K9
def denominator_table(dec: Layer0File, classes: Sequence[str], spread: dict[str, np.ndarray], from_n: int,
                      model: str) -> pd.DataFrame:
    """K8's table: one row per (text of ``dec``, layer-0 head ``h`` of class ``classes[h]``) with
    ``claim, model, layer, head, head_name, head_class, text`` (its title), ``corpus`` and, over
    the positions ``n >= from_n``: ``mean_log_z_linear`` / ``mean_log_z_exact`` (the mean of
    log Z_h(n), the softmax denominator with the destination token fixed, LayerNorm 1 linear /
    exact), ``std_log_z_linear_over_n`` (the std of the linear log Z_h(n) over n),
    ``spread_linear`` / ``spread_exact`` (the head's :func:`denominator_spread`, ``spread``:
    the mean over n of the std over texts of log Z_h(n); the same in every text's row) and
    ``tv_linear_exact_mean`` (the mean total variation distance of the linear and exact
    patterns)."""
    sel = dec.positions >= from_n
    rows = []
    for j, t in dec.texts.iterrows():
        for h, c in enumerate(classes):
            rows.append({"claim": "K8", "model": model, "layer": 0, "head": h, "head_name": head_name(0, h),
                         "head_class": c,
                         "text": t["title"], "corpus": t["corpus"],
                         "mean_log_z_linear": float(dec.log_z_linear[j, h, sel].mean()),
                         "mean_log_z_exact": float(dec.log_z_exact[j, h, sel].mean()),
                         "std_log_z_linear_over_n": float(dec.log_z_linear[j, h, sel].std()),
                         "spread_linear": float(spread["linear"][h]), "spread_exact": float(spread["exact"][h]),
                         "tv_linear_exact_mean": float(dec.tv_linear_exact[j, h, sel].mean())})
    return pd.DataFrame(rows)


def resampled_variance(p: np.ndarray, c_pop: np.ndarray, weights: np.ndarray, n_resamples: int,
                       rng: np.random.Generator, fixed: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The independent model of the denominator against resampling.

    ``p [H, m]``: positional-pattern weights of the ``m`` resampled keys; ``c_pop [H, U]``:
    content factors of the ``U`` token types of the population, drawn i.i.d. with
    probabilities ``weights [U]``; ``fixed [H]``: the part of ``Z`` from keys that are not
    resampled.  Predicted ``Var Z = Σ p² · Var(c)`` (``Var`` under ``weights``); observed:
    the sample variance (ddof 1) of ``Z`` over ``n_resamples`` draws, with its standard
    error ``var·sqrt(2/(R−1))`` (normal approximation).  Returns arrays ``[H]``."""
    weights = np.asarray(weights, dtype=float) / np.sum(weights)
    mean_c = c_pop @ weights
    var_c = np.square(c_pop - mean_c[:, None]) @ weights
    sum_p2 = np.square(p).sum(axis=-1)
    draws = rng.choice(len(weights), size=(n_resamples, p.shape[-1]), p=weights)  # [R, m]
    z = np.einsum("hm,hrm->hr", p, c_pop[:, draws]) + (0.0 if fixed is None else np.asarray(fixed)[:, None])
    obs = z.var(axis=-1, ddof=1)
    return {"sum_p2": sum_p2, "var_c": var_c, "predicted": sum_p2 * var_c, "observed": obs,
            "observed_se": obs * math.sqrt(2.0 / (n_resamples - 1)), "mean_z": z.mean(axis=-1)}


def variance_model(dec: Layer0File, ids: np.ndarray, n: int, n_resamples: int, seed: int) -> dict[str, np.ndarray]:
    """K9 on one text at destination position ``n`` (fixed destination token): keys
    ``1..n−1`` are redrawn i.i.d. from the text's own tokens at ``1..n−1`` (positions fixed;
    BOS at 0 and the destination at ``n`` kept), see :func:`resampled_variance`."""
    ids = np.asarray(ids, dtype=np.int64)
    if n < 2 or len(ids) < n:
        raise PosmechError(f"variance position {n} needs a text of at least {n} tokens and n >= 2 "
                           "(`contextual.variance_positions`)")
    p = dec.pattern(n)  # [H, n+1]
    scale = float(dec.attrs["attn_scale"])
    pop, counts = np.unique(ids[1:n], return_counts=True)
    q = dec.query[:, n]  # [H, dh]
    c_pop = np.exp(np.einsum("he,hue->hu", q, dec.content_key(pop)) / scale)
    ends = np.array([ids[0], int(dec.attrs["destination_id"])])
    c_ends = np.exp(np.einsum("he,hue->hu", q, dec.content_key(ends)) / scale)
    fixed = p[:, 0] * c_ends[:, 0] + p[:, n] * c_ends[:, 1]
    return resampled_variance(p[:, 1:n], c_pop, counts, n_resamples, np.random.default_rng(seed), fixed)


def within_text_variance(dec: Layer0File, j: int, from_n: int) -> dict[str, np.ndarray]:
    """K9 within one text (``j`` of ``layer0.h5``): the observed variance over destination
    positions ``n ≥ from_n`` of the stored ``Z_h(n)`` along the text, against the independent
    model's mean over those ``n`` of ``Σ_i p_h(n, i)² · Var(c_h(n, ·))``, with ``Var`` over
    the distribution of the text's tokens at ``1..n−1`` (a stationary text: each ``Z(n)`` is
    one draw).  Returns ``predicted, observed [H]`` and the number of positions."""
    pos = dec.positions
    sel = np.flatnonzero(pos >= from_n)
    if len(sel) < 2:
        raise PosmechError(f"fewer than 2 positions >= {from_n} (`contextual.denominator_from`)")
    ids = dec.token_ids[j]
    scale = float(dec.attrs["attn_scale"])
    vocab, inv = np.unique(ids, return_inverse=True)
    kc = dec.content_key(vocab)  # [H, U, dh]
    pred = np.zeros(dec.query.shape[0])
    for k in sel:
        n = int(pos[k])
        counts = np.bincount(inv[1:n], minlength=len(vocab)).astype(float)
        if counts.sum() == 0:
            continue
        w = counts / counts.sum()
        c = np.exp(np.einsum("he,hue->hu", dec.query[:, n], kc) / scale)
        var_c = np.square(c - (c @ w)[:, None]) @ w
        pred += np.square(dec.pattern(n)[:, 1:n]).sum(axis=-1) * var_c
    z = np.exp(dec.log_z_linear[j][:, sel])
    return {"predicted": pred / len(sel), "observed": z.var(axis=-1, ddof=1), "n_positions": np.full(len(pred), len(sel))}


def variance_table(dec: Layer0File, classes: Sequence[str], positions: Sequence[int], n_resamples: int, seed: int,
                   from_n: int, model: str) -> pd.DataFrame:
    """K9's table, rows ``claim, model, method, layer, head, head_name, head_class, text, corpus``
    and per method:

    * ``resampled`` — per text ``j`` of ``dec``, position ``n`` of ``positions`` and head: the
      :func:`variance_model` columns (predicted Var Z_h(n) = Σ_i p_h(n, i)² Var(c) and the
      variance observed over ``n_resamples`` redraws of the text's keys 1..n−1 from its own
      tokens; seed ``seed + 1000 j + n``), with ``n``;
    * ``within_text`` — per text and head: ``n_positions``, ``predicted``, ``observed`` of
      :func:`within_text_variance` (the variance along the text of Z(n) over n >= ``from_n``
      against the mean over those n of Σ p² Var(c))."""
    rows = []
    for j, t in dec.texts.iterrows():
        for n in positions:
            r = variance_model(dec, dec.token_ids[j], n, n_resamples, seed + 1000 * j + n)
            for h, c in enumerate(classes):
                rows.append({"claim": "K9", "model": model, "method": "resampled", "layer": 0, "head": h,
                             "head_name": head_name(0, h), "head_class": c, "text": t["title"], "corpus": t["corpus"],
                             "n": n, **{k: float(v[h]) for k, v in r.items()}})
        within = within_text_variance(dec, j, from_n)
        for h, c in enumerate(classes):
            rows.append({"claim": "K9", "model": model, "method": "within_text", "layer": 0, "head": h,
                         "head_name": head_name(0, h), "head_class": c, "text": t["title"], "corpus": t["corpus"],
                         "n_positions": int(within["n_positions"][h]), "predicted": float(within["predicted"][h]),
                         "observed": float(within["observed"][h])})
    return pd.DataFrame(rows)


def loglog_fit(predicted: np.ndarray, observed: np.ndarray) -> tuple[float, float]:
    """Pearson correlation and least-squares slope of log10 observed on log10 predicted
    (positive pairs only; fewer than 3: an error)."""
    ok = (np.asarray(predicted) > 0) & (np.asarray(observed) > 0)
    if ok.sum() < 3:
        raise PosmechError("fewer than 3 (predicted, observed) variance pairs: no fit")
    x, y = np.log10(np.asarray(predicted)[ok]), np.log10(np.asarray(observed)[ok])
    return float(np.corrcoef(x, y)[0, 1]), float(np.polyfit(x, y, 1)[0])


# --------------------------------------------------------------------------- K10
def loglog_fit_or_reason(predicted: np.ndarray, observed: np.ndarray) -> tuple[float, float, str]:
    """:func:`loglog_fit`, or ``(nan, nan, why)`` when fewer than 3 pairs have positive
    variances (every head's denominator is constant in the tokens: nothing to model, K9
    not measurable); ``why`` is empty when the fit exists."""
    ok = (np.asarray(predicted) > 0) & (np.asarray(observed) > 0)
    if ok.sum() < 3:
        return (float("nan"), float("nan"),
                f"only {int(ok.sum())} (predicted, observed) variance pairs are positive: no layer-0 head's "
                "denominator varies with the tokens (no content-dependent head), nothing to fit")
    return (*loglog_fit(predicted, observed), "")


def layer_rows(bridge: Any, ids: np.ndarray, n: int, layer: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """One forward pass of ``ids[: n + 1]``: the attention rows at ``n`` of every head of
    ``layer`` ``[H, n + 1]`` and the post-ln1 embedding at ``n`` ``[d_model]``."""
    import torch

    store: dict[str, np.ndarray] = {}

    def grab(key: str, index: Any) -> Any:
        def fn(t: Any, hook: Any) -> Any:
            store[key] = t[index].double().cpu().numpy()
            return t
        return fn

    dev = next(bridge.parameters()).device
    toks = torch.as_tensor(np.asarray(ids[: n + 1], dtype=np.int64), device=dev)[None]
    hooks = [(f"blocks.{layer}.attn.hook_pattern", grab("pattern", (0, slice(None), n))),
             (f"blocks.{layer}.ln1.hook_out", grab("x", (0, n)))]
    with torch.inference_mode():
        bridge.run_with_hooks(toks, fwd_hooks=hooks, return_type=None)
    return store["pattern"], store["x"]


def layer1_table(rows: np.ndarray, kernel: np.ndarray, n: int, k0: int, threshold: float, model: str,
                 layer: int = 1) -> pd.DataFrame:
    """K10: per head of ``layer``, TV between its real attention row at ``n`` and its
    positional kernel (K1's definition at the same ``n``), both over keys ``k0..n``
    renormalised; ``mostly_positional`` when the TV is below ``threshold``.  ``rows,
    kernel [H, ≥ n + 1]``."""
    r, k = renormalised(rows[:, : n + 1], k0), renormalised(kernel[:, : n + 1], k0)
    d = tv(r, k)
    H = rows.shape[0]
    return pd.DataFrame({"claim": "K10", "model": model, "layer": layer, "head": np.arange(H),
                         "head_name": [head_name(layer, h) for h in range(H)], "n": n,
                         "tv_row_vs_kernel": d, "etc_row": etc(r), "etc_kernel": etc(k),
                         "row_mass_before_k0": rows[:, :k0].sum(axis=-1), "mostly_positional": d < threshold})


# --------------------------------------------------------------------------- config
def resolved_positions(params: dict[str, Any], n_ctx: int, model: str) -> dict[str, Any]:
    """The ``contextual`` section's positions for a model of context ``n_ctx``, checked:
    ``max_position`` (null: ``n_ctx − 2``), ``positions``, ``classify_position``,
    ``variance_positions``, ``denominator_from``, ``grid`` (those left null scale with
    ``n_ctx``: :func:`posmech.config.scale_to_context`).  Any position beyond the context
    or beyond ``max_position`` is an error naming its key (raised before any job or
    forward pass)."""
    from posmech.config import scale_to_context

    params = scale_to_context("contextual", params, n_ctx)
    mp = params.get("max_position")
    mp = n_ctx - 2 if mp is None else int(mp)
    check_positions([mp], n_ctx, "contextual.max_position", model)
    for key in ("positions", "variance_positions"):
        check_positions(params[key], n_ctx, f"contextual.{key}", model)
        beyond = [int(n) for n in params[key] if int(n) > mp]
        if beyond:
            raise PosmechError(f"config key `contextual.{key}` (model {model}): {beyond} beyond "
                               f"`contextual.max_position` = {mp}; lower them or raise max_position")
    cp = params.get("classify_position")
    cp = max(params["positions"]) if cp is None else int(cp)
    if not params["k0"] + 1 <= cp <= mp:
        raise PosmechError(f"config key `contextual.classify_position` (model {model}): {cp} must be in "
                           f"{params['k0'] + 1}..{mp} (k0 + 1 .. max_position)")
    if params["local_window"] > cp - params["k0"] + 1:
        raise PosmechError(f"config key `contextual.local_window`: {params['local_window']} is more keys than "
                           f"position {cp} has after k0")
    return {"max_position": mp, "positions": sorted(int(n) for n in params["positions"]), "classify_position": cp,
            "variance_positions": sorted(int(n) for n in params["variance_positions"]),
            "denominator_from": int(params["denominator_from"]), "grid": int(params["grid"])}


# --------------------------------------------------------------------------- scorecard rows (K6–K10)
HEAD_CLASS_QUANTITIES = {"detokenization": "detokenization_heads", "contextual": "contextual_heads",
                         "duplicate_token": "duplicate_token_heads", "other": "other_heads"}
LAYER1_QUANTITIES = ("mostly_positional_heads", "mostly_positional_fraction")


def decomposition_scorecard(summary: dict[str, Any], n_tokens: int, scale_corpus: str, destination_token: str,
                            model: str, figure: str, h5: str) -> list[dict[str, Any]]:
    """K6 and K8 rows of rule layer0_decomposition from :func:`build_decomposition`'s
    ``summary`` (``quantiles`` of the LayerNorm scale, ``ln_scale_used``, ``tv_median``).

    * K6 ``ln1_scale_range`` — the 5th and 95th percentiles of ``blocks.0.ln1.hook_scale``
      over ``n_tokens`` tokens of ``scale_corpus`` (position 0 excluded); the detail adds the
      median, the 1st–99th percentiles and the scale ``s`` the linear LayerNorm uses;
    * K8 ``linear_vs_exact_tv`` — the median over texts, heads and destination positions of
      the total-variation distance between the attention with LayerNorm 1 linear at ``s``
      and the exact attention, destination token ``destination_token``."""
    q = summary["quantiles"]
    rows = [{"claim": "K6", "quantity": "ln1_scale_range", "value": [round(q[0.05], 4), round(q[0.95], 4)],
             "detail": f"5th and 95th percentiles of blocks.0.ln1.hook_scale over {n_tokens} "
             f"{scale_corpus} tokens (position 0 excluded); median {q[0.5]:.4f}, 1st-99th "
             f"{q[0.01]:.4f}-{q[0.99]:.4f}; linear LN uses s = {summary['ln_scale_used']:.4f}", "artifact": figure},
            {"claim": "K8", "quantity": "linear_vs_exact_tv", "value": round(summary["tv_median"], 6),
             "detail": "median over texts, heads and destination positions of TV(linear-LN attention, exact "
             f"attention), destination {destination_token!r}", "artifact": h5}]
    return [{**r, "model": model} for r in rows]


def head_class_scorecard(classes: pd.DataFrame, thresholds: dict[str, float], local_window: int, n: int,
                         n_duplicates: int, model: str, artifact: str) -> list[dict[str, Any]]:
    """K7 rows from :func:`head_classes`' table: for each class, the quantity
    :data:`HEAD_CLASS_QUANTITIES` names is the list of the layer-0 heads in that class (e.g.
    ``contextual_heads``); the detail gives the thresholds, the local window, the position
    ``n`` classified at and the number of destinations with an earlier copy of their token
    the duplicate score is measured over."""
    return [{"claim": "K7", "model": model, "quantity": q,
             "value": classes[classes["head_class"] == c]["head_name"].tolist(),
             "detail": f"thresholds {thresholds}, local window {local_window}, n = {n}; "
             f"duplicate score over {n_duplicates} destinations with an earlier copy", "artifact": artifact}
            for c, q in HEAD_CLASS_QUANTITIES.items()]


def positional_pattern_scorecard(table: pd.DataFrame, positions: Sequence[int], title: str, destination_token: str,
                                 model: str, figure: str, artifact: str) -> list[dict[str, Any]]:
    """K6 rows of rule layer0_positional_patterns from :func:`positional_patterns`' table
    (with ``head_name``), at the largest of the figure's ``positions`` ``n``:

    * ``layer0_pattern_grids`` — the word ``figures`` (the grids at ``positions`` on ``title``);
    * ``tv_fixed_token_vs_real_row`` — per head, the total-variation distance between the
      positional pattern of the fixed destination token and the real attention row;
    * ``tv_between_destination_tokens`` — per head, the total-variation distance between the
      positional patterns of the fixed destination token and of the text's own token."""
    n = max(positions)
    at = table[table["n"] == n]
    rows = [{"claim": "K6", "quantity": "layer0_pattern_grids", "value": "figures",
             "detail": f"n = {sorted(positions)} on {title}", "artifact": figure},
            {"claim": "K6", "quantity": "tv_fixed_token_vs_real_row",
             "value": {r.head_name: round(r.tv_fixed_vs_real, 4) for r in at.itertuples()},
             "detail": f"TV(positional pattern of {destination_token!r}, real attention row) at n = {n}",
             "artifact": artifact},
            {"claim": "K6", "quantity": "tv_between_destination_tokens",
             "value": {r.head_name: round(r.tv_fixed_vs_own, 4) for r in at.itertuples()},
             "detail": f"TV between the positional patterns of {destination_token!r} and of the text's own "
             f"token at n = {n}", "artifact": artifact}]
    return [{**r, "model": model} for r in rows]


def denominator_scorecard(spread: dict[str, np.ndarray], classes: Sequence[str], n_most_varying: int,
                          n_texts: int, from_n: int, model: str, figure: str,
                          artifact: str) -> list[dict[str, Any]]:
    """K8 rows of rule softmax_denominators from the per-head ``spread`` of log Z across texts
    (:func:`denominator_spread`, keys ``linear`` and ``exact`` LayerNorm):

    * ``most_varying_denominator_heads`` — the ``n_most_varying`` contextual heads with the
      largest spread (:func:`most_varying`), linear LayerNorm; the detail ranks every head;
    * ``most_varying_denominator_heads_exact`` — the same with the exact LayerNorm;
    * ``broad_max_spread`` — :func:`broad_spread_row`."""
    top = {k: most_varying(spread[k], classes, n_most_varying) for k in ("linear", "exact")}
    ranking = ", ".join(f"{head_name(0, int(h))} {spread['linear'][h]:.3f}" for h in np.argsort(-spread["linear"]))
    rows = [{"claim": "K8", "quantity": "most_varying_denominator_heads", "value": top["linear"],
             "detail": f"the {n_most_varying} contextual heads with the largest spread of log Z across "
             f"{n_texts} texts (linear LN, n >= {from_n}); all heads: {ranking}", "artifact": figure},
            {"claim": "K8", "quantity": "most_varying_denominator_heads_exact", "value": top["exact"],
             "detail": "the same with the exact LayerNorm", "artifact": artifact},
            broad_spread_row(spread["linear"], classes, model, figure)]
    return [{**r, "model": model} for r in rows]


def variance_scorecard(table: pd.DataFrame, from_n: int, model: str, figure: str,
                       artifact: str) -> list[dict[str, Any]]:
    """K9 rows of rule denominator_variance from its table (``method`` ``resampled``: one row
    per text, n and head; ``within_text``: one per text and head; columns ``predicted``,
    ``observed`` variances of Z), fitted by :func:`loglog_fit_or_reason` (no value, and why,
    when there is nothing to fit):

    * ``variance_model_fit`` — Pearson r of log10 observed variance of Z over i.i.d. redraws
      of the text's tokens against log10 predicted ``Σ_i p_h(n, i)² Var(c)``;
    * ``variance_model_within_text_fit`` — the same for the variance of Z(n) along each text
      (n >= ``from_n``);
    * ``variance_model_loglog_slope`` — the least-squares slope of the first fit (1 = the
      model's scaling)."""
    res = table[table["method"] == "resampled"]
    wt = table[table["method"] == "within_text"]
    r, slope, why = loglog_fit_or_reason(res["predicted"], res["observed"])
    r_within, slope_within, why_within = loglog_fit_or_reason(wt["predicted"], wt["observed"])
    rows = [{"claim": "K9", "quantity": "variance_model_fit", "value": None if why else round(r, 4),
             "detail": why or f"Pearson r of log10 observed (i.i.d. redraws) vs log10 predicted Var Z over {len(res)} "
             f"(text, n, head) rows; slope {slope:.3f}", "artifact": figure},
            {"claim": "K9", "quantity": "variance_model_within_text_fit",
             "value": None if why_within else round(r_within, 4),
             "detail": why_within or f"Pearson r of log10 observed vs predicted variance of Z(n) along each text (n >= "
             f"{from_n}) over {len(wt)} (text, head) rows; slope {slope_within:.3f}", "artifact": artifact},
            {"claim": "K9", "quantity": "variance_model_loglog_slope", "value": None if why else round(slope, 4),
             "detail": why or "least-squares slope of log10 observed on log10 predicted (1 = the model's scaling)",
             "artifact": artifact}]
    return [{**r, "model": model} for r in rows]


def layer1_scorecard(table: pd.DataFrame, title: str, n: int, max_tv: float, model: str, figure: str,
                     artifact: str) -> list[dict[str, Any]]:
    """K10 rows from :func:`layer1_table` (column ``mostly_positional``: the head's real
    layer-1 row on ``title`` at position ``n`` is within total variation ``max_tv`` of its
    positional kernel):

    * ``layer1_patterns`` — the word ``figures``;
    * ``mostly_positional_heads`` — the layer-1 heads that are mostly positional;
    * ``mostly_positional_fraction`` — their number over the number of layer-1 heads."""
    heads = table[table["mostly_positional"]]["head_name"].tolist()
    rows = [{"claim": "K10", "quantity": "layer1_patterns", "value": "figures", "detail": f"{title}, n = {n}",
             "artifact": figure},
            {"claim": "K10", "quantity": "mostly_positional_heads", "value": heads,
             "detail": f"layer-1 heads whose real row is within TV {max_tv} of their "
             f"positional kernel ({len(heads)} of {len(table)})", "artifact": artifact},
            {"claim": "K10", "quantity": "mostly_positional_fraction", "value": len(heads) / len(table),
             "detail": f"{len(heads)} of {len(table)} layer-1 heads within TV {max_tv} of their "
             "positional kernel", "artifact": artifact}]
    return [{**r, "model": model} for r in rows]
