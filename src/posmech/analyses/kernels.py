"""Positional kernels and Effective Token Count (claims K1–K5, seed post 003).

For head ``h`` of layer ``l`` the *positional kernel* (positional pattern) at query
position ``n`` is

    π(i | x_n) = softmax_{i in [lo(n), n]}  (x_n W_Q + b_Q) · (p_i W_K + b_K) / scale

where ``p_i`` is the mean post-ln1 embedding at position ``i`` over a (web-text)
corpus, ``x_n`` the actual post-ln1 embedding at position ``n`` of a text (a Bible
chapter), ``lo(n) = k0`` (the first ``k0`` positions are omitted: later-layer heads park
attention on BOS) or, for a sliding-window layer (GPT-Neo ``local``), ``max(k0,
n - window + 1)``, and ``scale`` the model's score scale (``sqrt(d_head)`` for GPT-2, 1
for GPT-Neo).  The key bias adds ``q·b_K`` to every score of a query, a constant over
``i``, so it cancels in the softmax; it is kept in the computation (the tests check the
invariance).  The query bias does not cancel and counts.

Rotary and ALiBi models (no positional embedding in the residual stream): the kernel is
:func:`head_kernels` with ``rotary``/``slope``: the same softmax with ``q`` and the mean
key rotated to their positions and ALiBi's ``m·(i − n)`` added (definition in its
docstring and ``docs/claims.md``; without them it is the kernel above).

Effective Token Count: ``ETC = 1 / Σ_i π_i²``; a uniform kernel over the ``w = n - lo + 1``
keys in the softmax has ``ETC = w``, a one-hot kernel ``ETC = 1``.  Kernel types (K3) come
from ``ETC / w``: ``local`` below ``local_max``, ``uniform`` at or above ``uniform_min``,
``slow_decay`` in between.

Everything here is pure numpy on arrays, except :func:`query_embeddings` (a forward pass
of a TransformerBridge) and the artifact reader/writer.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from posmech.analyses.attention import head_name
from posmech.core.errors import PosmechError
from posmech.models.architecture import score_divisor
from posmech.core.progress import logged
from posmech.settings.kernels import KernelsSettings

KIND = "kernels"
DESCRIPTIONS = {
    "positions": "[Q] int32 query positions n at which the kernels are computed",
    "means_count": "[K] int64 documents behind each mean key embedding p_i",
    "chapters/doc_index": "[C] int64 query texts: document number in the query corpus's tokens file",
    "chapters/title": "[C] str query texts' titles (Bible: 'Genesis 1')",
    "chapters/length": "[C] int32 query texts' lengths in tokens",
    "kernel_mean": "[L, H, Q, K] float32 positional kernel pi(i | x_n) averaged over the query texts; "
                   "zero outside keys key_start..n",
    "kernel_std": "[L, H, Q, K] float32 standard deviation of the kernel over the query texts (K5)",
    "etc": "[C, L, H, Q] float64 Effective Token Count 1 / sum_i pi_i^2 of each query text's kernel",
    "tv_spread": "[C, L, H, Q] float64 total-variation distance of each text's kernel to the mean kernel (K5)",
    "etc_of_mean": "[L, H, Q] float64 Effective Token Count of kernel_mean",
    "key_start": "[L, Q] int32 first key position in the softmax (k0, or n - window + 1 for a sliding window)",
    "n_keys": "[L, Q] int32 keys in the softmax, n - key_start + 1 (the ETC of a uniform kernel)",
}
RULE = "positional_kernels"
KERNEL_TYPES = ("local", "slow_decay", "uniform")


# --------------------------------------------------------------------------- weights
@dataclass
class HeadWeights:
    """Query/key weights of every head, in TransformerLens orientation (float64).

    ``W_Q, W_K [L, H, d_model, d_head]``, ``b_Q, b_K [L, H, d_head]``, ``scale [L]``
    (scores are divided by it), ``window [L]`` (sliding-window size of the layer, 0 = full
    causal attention); ``rotary``: the model's ``(cos, sin)`` ``[P, r]`` of positions
    ``0..P-1`` (rotary models, :func:`rotary_tables`), ``slopes [H]``: ALiBi's slopes
    (ALiBi models); None otherwise (:func:`head_kernels` with ``rotary``/``slope``).
    """

    W_Q: np.ndarray
    b_Q: np.ndarray
    W_K: np.ndarray
    b_K: np.ndarray
    scale: np.ndarray
    window: np.ndarray
    rotary: tuple[np.ndarray, np.ndarray] | None = None
    slopes: np.ndarray | None = None

    @property
    def n_layers(self) -> int:
        return int(self.W_Q.shape[0])

    @property
    def n_heads(self) -> int:
        return int(self.W_Q.shape[1])


def attention_layout(hf_config: dict[str, Any], n_layers: int, d_head: int) -> tuple[np.ndarray, np.ndarray]:
    """Score scale ``[L]`` and sliding window ``[L]`` (0 = none) of each layer, from a
    Hugging Face ``config.json`` dict.

    The scale is :func:`posmech.models.architecture.score_divisor` of the config on every
    layer: GPT-2: ``sqrt(d_head)`` when ``scale_attn_weights`` (default), times ``layer + 1`` when
    ``scale_attn_by_inverse_layer_idx``.  GPT-Neo (TinyStories): no scaling, and layers
    listed ``local`` in ``attention_types`` see only the last ``window_size`` positions.
    Rotary and ALiBi models: ``sqrt(d_head)`` (Gemma: ``sqrt(query_pre_attn_scalar)``); the
    sliding windows of :func:`posmech.models.architecture.layer_windows` (GPT-Neo's local
    layers, Mistral's ``sliding_window``, ``layer_types``' ``sliding_attention`` layers).
    What the score function does not compute (a rotary pair order that cannot be told,
    soft-capped scores) is not scheduled (requirements ``raw_scores_layout``,
    ``plain_scores``, :mod:`posmech.pipeline.applicability`).
    """
    from posmech.models.architecture import layer_windows

    mtype = hf_config.get("model_type", "gpt2")
    scale = np.full(n_layers, score_divisor(hf_config, d_head))
    if mtype == "gpt2" and hf_config.get("scale_attn_by_inverse_layer_idx", False):
        scale *= np.arange(1, n_layers + 1)
    window = np.asarray(layer_windows(hf_config, n_layers), dtype=np.int64)
    return scale, window


def rotary_tables(bridge: Any, n_positions: int) -> tuple[np.ndarray, np.ndarray]:
    """The model's own rotary ``(cos, sin)`` ``[n_positions, r]`` float64 of positions
    ``0..n_positions-1``, from its rotary embedding module (``bridge.rotary_emb``, the
    Hugging Face module the attention layers read: rope type and scaling, and GPT-NeoX's
    partial rotation, ``r < d_head``, as the model has them)."""
    import torch

    emb = getattr(bridge, "rotary_emb", None)
    if emb is None:
        raise PosmechError("positional kernels of a rotary model need its rotary embedding (`rotary_emb`), which "
                           "this engine does not expose; load the model with `engine: bridge`")
    dev = next(bridge.parameters()).device
    with torch.inference_mode():
        cos, sin = emb(torch.zeros(1, n_positions, 1, device=dev), torch.arange(n_positions, device=dev)[None])
    return cos[0].double().cpu().numpy(), sin[0].double().cpu().numpy()


def bridge_head_weights(bridge: Any, hf_config: dict[str, Any] | None = None,
                        n_positions: int | None = None) -> HeadWeights:
    """The processed query/key weights of a TransformerBridge (``bridge.W_Q`` etc., i.e.
    with the layer-norm scale folded in under compatibility mode, consistent with the
    cached ``ln1_out``; zero biases for bias-free projections), and the attention layout
    of :func:`attention_layout`; for a rotary model its :func:`rotary_tables` of
    ``n_positions`` positions (default its context), for an ALiBi model its slopes. GPT-J's
    interleaved pairs are reordered into the halves layout (the query and key weights' rotary
    columns and the tables alike: :func:`posmech.models.scores.halves_order`), which leaves
    every ``q·k`` as the model computes it."""
    from posmech.models.scores import alibi_slopes, halves_order, position_scheme, score_function

    cfg = bridge.cfg
    scheme = position_scheme(cfg)
    if hf_config is None:  # the posmech engine keeps it as `hf_config`, the bridge as its original model's
        hf = getattr(bridge, "original_model", None)
        hf_config = getattr(bridge, "hf_config", None) or (
            hf.config.to_dict() if hf is not None and hasattr(hf, "config") else {})
    get = lambda t: t.detach().double().cpu().numpy()  # noqa: E731
    W_Q, W_K = get(bridge.W_Q), get(bridge.W_K)
    if W_K.shape != W_Q.shape:  # grouped-query attention: repeat key heads
        W_K = np.repeat(W_K, W_Q.shape[1] // W_K.shape[1], axis=1)

    def bias(name: str, W: np.ndarray) -> np.ndarray:  # zeros for a bias-free projection (Llama)
        b = getattr(bridge, name, None)  # the bridge raises AttributeError for one
        return np.zeros(W.shape[:2] + W.shape[-1:]) if b is None else get(b)

    b_K = bias("b_K", W_K)
    if b_K.shape[1] != W_Q.shape[1]:
        b_K = np.repeat(b_K, W_Q.shape[1] // b_K.shape[1], axis=1)
    scale, window = attention_layout(hf_config, W_Q.shape[0], W_Q.shape[-1])
    rotary = rotary_tables(bridge, int(n_positions or cfg.n_ctx)) if scheme == "rotary" else None
    slopes = alibi_slopes(W_Q.shape[1]) if scheme == "alibi" else None
    b_Q = bias("b_Q", W_Q)
    if rotary is not None and score_function(cfg).interleaved:  # GPT-J: its pairs (2f, 2f+1) as halves
        r = rotary[0].shape[-1]
        W_Q, b_Q, W_K, b_K = (halves_order(t, r, True) for t in (W_Q, b_Q, W_K, b_K))
        rotary = (halves_order(rotary[0], r, True), halves_order(rotary[1], r, True))
    return HeadWeights(W_Q, b_Q, W_K, b_K, scale, window, rotary, slopes)


# --------------------------------------------------------------------------- kernels
def key_start(positions: np.ndarray, k0: int, window: int = 0) -> np.ndarray:
    """First key position in the softmax for each query position ``n`` (``[Q]`` int):
    ``k0``, or ``max(k0, n - window + 1)`` for a sliding-window layer."""
    n = np.asarray(positions, dtype=np.int64)
    lo = np.full_like(n, k0)
    if window:
        lo = np.maximum(lo, n - window + 1)
    return lo


def n_keys(positions: np.ndarray, k0: int, window: int = 0) -> np.ndarray:
    """Number of keys in the softmax, ``n - lo(n) + 1`` (``[Q]`` int): the ETC of a
    uniform kernel."""
    n = np.asarray(positions, dtype=np.int64)
    return n - key_start(n, k0, window) + 1


def head_kernels(
    means: np.ndarray,
    x: np.ndarray,
    positions: Sequence[int] | np.ndarray,
    W_Q: np.ndarray,
    b_Q: np.ndarray,
    W_K: np.ndarray,
    b_K: np.ndarray,
    scale: float,
    k0: int = 2,
    window: int = 0,
    rotary: tuple[np.ndarray, np.ndarray] | None = None,
    slope: float = 0.0,
) -> np.ndarray:
    """Positional kernels of one head.

    ``means [P, d_model]`` (``p_i``), ``x [C, Q, d_model]`` (query embeddings ``x_n`` of
    ``C`` texts at the ``Q`` query ``positions``), ``W_Q, W_K [d_model, d_head]``,
    ``b_Q, b_K [d_head]``.  Returns ``π [C, Q, K]`` float64 with ``K = max(positions) + 1``:
    row ``(c, q)`` is a distribution over key positions ``lo(n)..n`` (``n = positions[q]``),
    zero elsewhere.

    **Rotary and ALiBi heads** (``rotary``, ``slope``; without them, learned positions: the
    module's kernel).  The kernel is the attention a query gives each key position with
    the keys' content averaged out, as a function of the query position ``n`` and the key
    position ``i`` (offset ``n − i``):

        π(i | x_n) = softmax_{i in [lo(n), n]} ( R(n)(x_n W_Q + b_Q) · R(i)(p_i W_K + b_K) / scale + m·(i − n) )

    with ``p_i`` the mean layer input (post-ln1) at position ``i`` over a corpus and ``x_n``
    the actual input at ``n`` of a text, as above; ``R(j)`` the model's rotation at
    position ``j`` (``rotary = (cos, sin)`` ``[P, r]`` tables covering every position,
    :func:`rope_tables` for the default RoPE; :func:`rotate_np`), identity without rotary;
    ``m`` = ``slope``, the head's ALiBi slope (0 without ALiBi).  Since the rotation is
    linear, ``R(i)(p_i W_K + b_K)`` is the corpus mean of the rotated key at ``i``: the
    kernel scores each position's mean key.  A rotary score depends on ``i`` and ``n``
    through ``n − i`` only when ``p_i`` is the same at every position; ALiBi's bias always
    depends on the offset only, but the softmax window ``lo(n)..n`` grows with ``n``, so
    neither kernel need be translation-invariant once the denominator is counted.  With
    zero query and key weights and biases an ALiBi kernel is ``∝ exp(−m·(n − i))`` over the
    window (:func:`alibi_kernel`), with ETC :func:`truncated_geometric_etc` ``(m, n − lo + 1)``.
    """
    pos = _checked(positions, k0, means)
    K = int(pos.max()) + 1
    k = means[:K] @ W_K + b_K  # [K, d_head]
    q = x @ W_Q + b_Q  # [C, Q, d_head]
    if rotary is not None:
        cos, sin = (np.asarray(t, dtype=np.float64) for t in rotary)
        if cos.shape[0] < K or sin.shape != cos.shape or cos.shape[-1] > k.shape[-1]:
            raise PosmechError(f"rotary tables {cos.shape}/{sin.shape} do not cover {K} positions of a "
                               f"{k.shape[-1]}-dimensional head")
        k = rotate_np(k, cos[:K], sin[:K])
        q = rotate_np(q, cos[pos], sin[pos])
    return _softmax_band(q, k, pos, key_start(pos, k0, window), 0, scale, slope)


def _checked(positions: Sequence[int] | np.ndarray, k0: int, means: np.ndarray) -> np.ndarray:
    pos = np.asarray(positions, dtype=np.int64)
    if pos.min() < k0:
        raise PosmechError(f"query position {int(pos.min())} is below k0={k0}: no key left in the softmax")
    if means.shape[0] < int(pos.max()) + 1:
        raise PosmechError(f"means cover {means.shape[0]} positions, query positions need {int(pos.max()) + 1}")
    if np.any(np.diff(pos) <= 0):
        raise PosmechError("query positions must be strictly increasing")
    return pos


def _softmax_band(q: np.ndarray, k: np.ndarray, pos: np.ndarray, lo: np.ndarray, offset: int, scale: float,
                  slope: float = 0.0) -> np.ndarray:
    """Masked softmax of ``q [C, Q, dh] · k [K', dh] / scale`` (plus ALiBi's ``slope·(key −
    query)`` when ``slope``) where ``k[j]`` is key position ``offset + j``; row ``q`` keeps
    keys ``lo[q]..pos[q]``.  Returns ``[C, Q, K']``."""
    s = q @ (k.T / scale)  # [C, Q, K']
    keys = np.arange(offset, offset + k.shape[0])
    if slope:
        s += float(slope) * (keys[None, :] - pos[:, None])
    valid = (keys[None, :] >= lo[:, None]) & (keys[None, :] <= pos[:, None])  # [Q, K']
    s += np.where(valid, 0.0, -np.inf)  # in place, broadcast over texts
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    return s


# --------------------------------------------------------------------------- rotary / ALiBi kernels
def rope_tables(n_positions: int, rotary_dim: int, base: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    """``(cos, sin) [n_positions, rotary_dim]`` float64 of the default rotary embedding
    (GPT-NeoX and Llama's ``rope_type`` ``default``): angle ``n·base^(-2j/r)`` for pair ``j``
    of the ``r = rotary_dim`` rotary dimensions, each angle twice (``rotate_half`` layout)."""
    if rotary_dim <= 0 or rotary_dim % 2:
        raise PosmechError(f"rotary dimension {rotary_dim}: must be a positive even number")
    inv = base ** (-np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim)
    ang = np.arange(n_positions, dtype=np.float64)[:, None] * inv[None, :]
    ang = np.concatenate([ang, ang], axis=-1)
    return np.cos(ang), np.sin(ang)


def rotate_np(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotary embedding of vectors ``x [..., P, d_head]`` at the positions of the rows of
    ``cos, sin [P, r]`` (numpy; :func:`posmech.models.scores.rotate`'s
    ``rotate_half`` convention): the first ``r`` dimensions rotated, the rest unchanged."""
    r = cos.shape[-1]
    xr = x[..., :r]
    half = np.concatenate([-xr[..., r // 2:], xr[..., : r // 2]], axis=-1)
    return np.concatenate([xr * cos + half * sin, x[..., r:]], axis=-1)


def alibi_kernel(positions: Sequence[int] | np.ndarray, slope: float, k0: int = 0, window: int = 0) -> np.ndarray:
    """The closed-form kernel of an ALiBi head with zero query and key weights and biases:
    ``π(i | n) = r^(n−i) (1 − r) / (1 − r^w)`` for ``i`` in ``lo(n)..n``, ``r = e^(−m)``,
    ``w = n − lo(n) + 1`` (uniform, ``1/w``, when ``m = 0``); ``[Q, max(positions) + 1]``."""
    pos = np.asarray(positions, dtype=np.int64)
    lo = key_start(pos, k0, window)
    i = np.arange(int(pos.max()) + 1)[None, :]
    inside = (i >= lo[:, None]) & (i <= pos[:, None])
    w = (pos - lo + 1)[:, None].astype(np.float64)
    off = np.where(inside, pos[:, None] - i, 0).astype(np.float64)
    if slope == 0:
        return np.where(inside, 1.0 / w, 0.0)
    r = math.exp(-float(slope))
    return np.where(inside, r ** off * (1 - r) / (1 - r ** w), 0.0)


def zero_score_etc_fraction(slope: float, n_keys: int) -> float:
    """ETC / ``n_keys`` of a head's kernel when its query–key scores are zero: 1 (uniform) for
    learned or rotary positions; for an ALiBi head of slope ``m`` its bias alone,
    :func:`truncated_geometric_etc` ``(m, n_keys) / n_keys`` — the kernel a random-init ALiBi
    head has (0.27 for m = 1/4 over 30 keys: a slowly decaying kernel before any training)."""
    return truncated_geometric_etc(float(slope), int(n_keys)) / int(n_keys)


def effective_token_count(kernel: np.ndarray) -> np.ndarray:
    """``ETC = 1 / Σ_i π_i²`` over the last axis (``[..., K] -> [...]``)."""
    return 1.0 / np.square(kernel).sum(axis=-1)


def truncated_geometric_etc(lam: float, m: int) -> float:
    """Analytic ETC of ``π_j ∝ exp(-λ j)``, ``j = 0..m-1`` (scores ``-λ(n - i)`` over ``m``
    keys): with ``r = e^{-λ}``, ``ETC = (1 - r^m)(1 + r) / ((1 - r)(1 + r^m))``; ``m`` when
    ``λ = 0``."""
    if lam == 0:
        return float(m)
    r = math.exp(-lam)
    return (1 - r**m) * (1 + r) / ((1 - r) * (1 + r**m))


def classify(etc_fraction: np.ndarray, local_max: float, uniform_min: float) -> np.ndarray:
    """Kernel type (K3) from ``ETC / n_keys``: ``local`` (< ``local_max``), ``uniform``
    (>= ``uniform_min``), ``slow_decay`` otherwise; ``undefined`` (none of the
    :data:`KERNEL_TYPES`) where the ETC is not finite (the head has no kernel, K1).  Same shape
    as the input, dtype object."""
    f = np.asarray(etc_fraction, dtype=float)
    out = np.full(f.shape, "slow_decay", dtype=object)
    out[f < local_max] = "local"
    out[f >= uniform_min] = "uniform"
    out[~np.isfinite(f)] = "undefined"
    return out


@dataclass
class LayerKernels:
    """Kernels of every head of one layer over ``C`` texts and ``Q`` query positions.

    ``mean, std [H, Q, K]`` (over texts), ``etc, tv [C, H, Q]`` (per text: ETC, and the total
    variation distance ``½ Σ_i |π_c - π̄|`` to the mean kernel), ``etc_of_mean [H, Q]``,
    ``start, n_keys [Q]``.
    """

    mean: np.ndarray
    std: np.ndarray
    etc: np.ndarray
    tv: np.ndarray
    etc_of_mean: np.ndarray
    start: np.ndarray
    n_keys: np.ndarray


def layer_kernels(
    means: np.ndarray, x: np.ndarray, positions: Sequence[int] | np.ndarray, w: HeadWeights, layer: int, k0: int = 2,
    block: int = 64,
) -> LayerKernels:
    """Kernels of all heads of ``layer``: ``means [P, d_model]``, ``x [C, Q, d_model]``
    (``positions`` sorted ascending); ``block`` query rows are computed at a time."""
    pos = _checked(positions, k0, means)
    win = int(w.window[layer])
    H = w.n_heads
    C, Q, K = x.shape[0], len(pos), int(pos.max()) + 1
    etc = np.empty((C, H, Q))
    tv = np.empty((C, H, Q))
    mean = np.zeros((H, Q, K))
    std = np.zeros((H, Q, K))
    lo_all = key_start(pos, k0, win)
    means = means[:K]
    # queries in blocks: each block only touches the keys its rows can see (the causal
    # band), which halves the work for full attention and more for sliding windows
    blocks = [slice(a, min(a + block, Q)) for a in range(0, Q, block)]
    if w.rotary is not None and w.rotary[0].shape[0] < K:
        raise PosmechError(f"the rotary tables cover {w.rotary[0].shape[0]} positions, the kernels need {K}")
    for h in range(H):
        keys = means @ w.W_K[layer, h] + w.b_K[layer, h]  # [K, d_head]
        queries = x @ w.W_Q[layer, h] + w.b_Q[layer, h]  # [C, Q, d_head]
        if w.rotary is not None:  # each to its position (head_kernels' definition)
            keys = rotate_np(keys, w.rotary[0][:K], w.rotary[1][:K])
            queries = rotate_np(queries, w.rotary[0][pos], w.rotary[1][pos])
        slope = float(w.slopes[h]) if w.slopes is not None else 0.0
        for b in blocks:
            lo, hi = int(lo_all[b].min()), int(pos[b].max()) + 1
            pi = _softmax_band(queries[:, b], keys[lo:hi], pos[b], lo_all[b], lo, float(w.scale[layer]), slope)
            m = pi.mean(axis=0)
            mean[h, b, lo:hi] = m
            etc[:, h, b] = effective_token_count(pi)
            pi -= m  # in place: centred over texts
            std[h, b, lo:hi] = np.sqrt(np.square(pi).mean(axis=0))
            np.abs(pi, out=pi)
            tv[:, h, b] = 0.5 * pi.sum(axis=-1)
    return LayerKernels(mean, std, etc, tv, effective_token_count(mean), key_start(pos, k0, win), n_keys(pos, k0, win))


def model_kernels(
    means: np.ndarray, x: np.ndarray, positions: Sequence[int] | np.ndarray, w: HeadWeights, k0: int = 2
) -> Iterator[LayerKernels]:
    """:func:`layer_kernels` for every layer, one at a time (to stream to disk):
    ``means [L, P, d_model]``, ``x [C, L, Q, d_model]``."""
    for layer in range(w.n_layers):
        yield layer_kernels(means[layer], x[:, layer], positions, w, layer, k0)


# --------------------------------------------------------------------------- inputs
def query_positions(k0: int, heatmap_max: int, etc_positions: Sequence[int]) -> np.ndarray:
    """Sorted query positions: every ``n`` in ``k0..heatmap_max`` (query × key heatmaps)
    and the ``etc_positions`` (``[Q]`` int64)."""
    pos = set(range(k0, heatmap_max + 1)) | {int(n) for n in etc_positions}
    return np.array(sorted(pos), dtype=np.int64)


def select_documents(lengths: np.ndarray, min_length: int, n: int, seed: int, key: str = "kernels.n_chapters") -> np.ndarray:
    """``n`` document indices (sorted) drawn with ``seed`` among those with at least
    ``min_length`` tokens."""
    eligible = np.flatnonzero(np.asarray(lengths) >= min_length)
    if len(eligible) < n:
        raise PosmechError(
            f"config key `{key}`: {n} query texts of at least {min_length} tokens are needed, the query "
            f"corpus has {len(eligible)}; lower `{key}` or the largest query position"
        )
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(eligible, size=n, replace=False))


def query_embeddings(bridge: Any, docs: Sequence[np.ndarray], positions: Sequence[int] | np.ndarray) -> np.ndarray:
    """Post-ln1 embeddings ``x_n`` (hook ``blocks.{l}.ln1.hook_out``) of each document at
    ``positions``: ``[C, L, Q, d_model]`` float64.  One forward pass per document, cut
    after the largest position (causal: the cut changes nothing before it)."""
    import torch

    pos = np.asarray(positions, dtype=np.int64)
    L = bridge.cfg.n_layers
    out = np.empty((len(docs), L, len(pos), bridge.cfg.d_model))
    dev = next(bridge.parameters()).device
    index = torch.as_tensor(pos, device=dev)
    for c, ids in enumerate(logged(docs, what="query texts")):
        toks = torch.as_tensor(np.asarray(ids[: pos.max() + 1], dtype=np.int64), device=dev)[None]
        store: dict[int, np.ndarray] = {}

        def grab(t: Any, hook: Any, layer: int = 0) -> Any:
            store[layer] = t[0, index].double().cpu().numpy()
            return t

        hooks = [(f"blocks.{i}.ln1.hook_out", lambda t, hook, i=i: grab(t, hook, i)) for i in range(L)]
        with torch.inference_mode():
            bridge.run_with_hooks(toks, fwd_hooks=hooks, return_type=None)
        for i in range(L):
            out[c, i] = store[i]
    return out


# --------------------------------------------------------------------------- artifact
def write_kernels(
    path: str | os.PathLike[str],
    layers: Iterator[LayerKernels],
    n_layers: int,
    n_heads: int,
    positions: np.ndarray,
    chapters: dict[str, Any],
    means_count: np.ndarray,
    attrs: dict[str, Any],
) -> None:
    """Stream layer results into ``kernels.h5`` (layout in docs/artifacts.md)."""
    from posmech.store.hdf5 import STR, artifact_writer, describe

    Q, K = len(positions), int(np.max(positions)) + 1
    C = len(chapters["doc_index"])
    with artifact_writer(path, KIND, RULE, attrs) as f:
        f.create_dataset("positions", data=np.asarray(positions, dtype=np.int32))
        f.create_dataset("means_count", data=np.asarray(means_count[:K], dtype=np.int64))
        g = f.create_group("chapters")
        g.create_dataset("doc_index", data=np.asarray(chapters["doc_index"], dtype=np.int64))
        g.create_dataset("title", data=[str(t) for t in chapters["title"]], dtype=STR)
        g.create_dataset("length", data=np.asarray(chapters["length"], dtype=np.int32))
        opts = {"chunks": (1, 1, Q, K), "compression": "gzip", "compression_opts": 4, "shuffle": True}
        kmean = f.create_dataset("kernel_mean", (n_layers, n_heads, Q, K), dtype="f4", **opts)
        kstd = f.create_dataset("kernel_std", (n_layers, n_heads, Q, K), dtype="f4", **opts)
        etc = f.create_dataset("etc", (C, n_layers, n_heads, Q), dtype="f8")
        tv = f.create_dataset("tv_spread", (C, n_layers, n_heads, Q), dtype="f8")
        etcm = f.create_dataset("etc_of_mean", (n_layers, n_heads, Q), dtype="f8")
        start = f.create_dataset("key_start", (n_layers, Q), dtype="i4")
        nk = f.create_dataset("n_keys", (n_layers, Q), dtype="i4")
        describe(f, DESCRIPTIONS)
        for layer, lk in enumerate(layers):
            kmean[layer] = lk.mean.astype(np.float32)
            kstd[layer] = lk.std.astype(np.float32)
            etc[:, layer] = lk.etc
            tv[:, layer] = lk.tv
            etcm[layer] = lk.etc_of_mean
            start[layer] = lk.start
            nk[layer] = lk.n_keys


@dataclass
class KernelSet:
    """``kernels.h5`` without the kernels themselves (read per head with :meth:`kernel`)."""

    path: Path
    positions: np.ndarray
    etc: np.ndarray  # [C, L, H, Q]
    tv: np.ndarray  # [C, L, H, Q]
    etc_of_mean: np.ndarray  # [L, H, Q]
    n_keys: np.ndarray  # [L, Q]
    titles: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def n_layers(self) -> int:
        return int(self.etc.shape[1])

    @property
    def n_heads(self) -> int:
        return int(self.etc.shape[2])

    def kernel(self, layer: int, head: int, which: str = "kernel_mean") -> np.ndarray:
        """``[Q, K]`` mean (or ``kernel_std``) kernel of one head."""
        from posmech.store.hdf5 import open_artifact

        with open_artifact(self.path, KIND) as f:
            return f[which][layer, head].astype(np.float64)


def read_kernels(path: str | os.PathLike[str]) -> KernelSet:
    from posmech.store.hdf5 import attr_json, open_artifact

    with open_artifact(path, KIND) as f:
        attrs = {k: attr_json(f, k) for k in f.attrs}
        titles = [t.decode() if isinstance(t, bytes) else str(t) for t in f["chapters/title"][()]]
        return KernelSet(
            Path(path), f["positions"][()].astype(np.int64), f["etc"][()], f["tv_spread"][()],
            f["etc_of_mean"][()], f["n_keys"][()].astype(np.int64), titles, attrs,
        )


# --------------------------------------------------------------------------- tables
def etc_frame(ks: KernelSet, model: str, local_max: float, uniform_min: float) -> pd.DataFrame:
    """Tidy ETC table (K3/K4/K5): one row per (layer, head, n) with the ETC's mean, std,
    min and max over the query texts, the ETC of the mean kernel, ``n_keys``, the fraction
    ``etc_mean / n_keys``, the kernel type and the mean TV distance of a text's kernel to
    the mean kernel (K5); ``zero_score_etc_fraction`` and ``zero_score_kernel_type``: the same
    for the head's kernel with zero query–key scores (:func:`zero_score_etc_fraction`: 1 and
    ``uniform`` without ALiBi), what the head has before any training."""
    C, L, H, Q = ks.etc.shape
    li, hi, qi = np.meshgrid(np.arange(L), np.arange(H), np.arange(Q), indexing="ij")
    li, hi, qi = li.ravel(), hi.ravel(), qi.ravel()
    etc = ks.etc[:, li, hi, qi]  # [C, rows]
    nk = ks.n_keys[li, qi]
    frac = etc.mean(axis=0) / nk
    slopes = np.asarray(ks.attrs.get("alibi_slopes") or np.zeros(H), dtype=np.float64)
    zero = np.array([zero_score_etc_fraction(float(slopes[h]), int(k)) for h, k in zip(hi, nk)])
    df = pd.DataFrame(
        {
            "claim": "K4",
            "model": model,
            "layer": li,
            "head": hi,
            "head_name": [head_name(a, b) for a, b in zip(li, hi)],
            "n": ks.positions[qi],
            "n_keys": nk,
            "etc_mean": etc.mean(axis=0),
            "etc_std": etc.std(axis=0),
            "etc_min": etc.min(axis=0),
            "etc_max": etc.max(axis=0),
            "etc_of_mean_kernel": ks.etc_of_mean[li, hi, qi],
            "etc_fraction": frac,
            "kernel_type": classify(frac, local_max, uniform_min),
            "zero_score_etc_fraction": zero,
            "zero_score_kernel_type": classify(zero, local_max, uniform_min),
            "tv_spread_mean": ks.tv[:, li, hi, qi].mean(axis=0),
            "tv_spread_max": ks.tv[:, li, hi, qi].max(axis=0),
            "n_texts": C,
        }
    )
    return df


def translation_tv(kernel: np.ndarray, positions: np.ndarray, k0: int, max_offset: int) -> float:
    """Translation equivariance of one head's kernel (K2): rows ``π_n(n - o)``,
    ``o = 0..max_offset``, of every query ``n >= k0 + max_offset`` in ``positions``,
    renormalised over those offsets; the mean TV distance of each row to their average
    (0 = a kernel that depends only on ``n - i``).  ``kernel [Q, K]``; NaN when fewer
    than two rows qualify."""
    rows = []
    for q, n in enumerate(positions):
        if n - max_offset < k0:
            continue
        r = kernel[q, n - max_offset : n + 1][::-1]
        s = r.sum()
        if s > 0:
            rows.append(r / s)
    if len(rows) < 2:
        return float("nan")
    R = np.stack(rows)
    return float(0.5 * np.abs(R - R.mean(axis=0)).sum(axis=1).mean())


def types_at(df: pd.DataFrame, n: int) -> pd.DataFrame:
    """Rows of an ETC table at query position ``n`` (one per head)."""
    sub = df[df["n"] == n]
    if sub.empty:
        raise PosmechError(f"no ETC row at n={n}; `kernels.etc_heatmap_position` must be a computed query position")
    return sub


def scorecard(df: pd.DataFrame, model: str, n: int, artifacts: dict[str, str], equivariance: dict[str, float]) -> pd.DataFrame:
    """Scorecard rows of K1–K5 for one model; quantities match ``resources/published.yaml``.

    ``artifacts``: paths of the ETC ``table``, the ``kernels`` heatmaps, the K4 ``heatmap``
    and the K5 ``profiles`` figure.  ``equivariance[head]``: :func:`translation_tv` of the
    local heads.
    """
    from posmech.store.tables import scorecard_rows

    at = types_at(df, n)
    heads = lambda layer, kind: [r.head_name for r in at.itertuples() if r.layer == layer and r.kernel_type == kind]  # noqa: E731
    n_layers, n_heads = int(at["layer"].max()) + 1, int(at["head"].max()) + 1
    ok = int(np.isfinite(at["etc_mean"]).sum())
    rows: list[dict[str, Any]] = [
        {"claim": "K1", "model": model, "quantity": "positional_kernels", "value": ok,
         "detail": f"{ok} of {n_layers * n_heads} heads have a positional kernel (ETC at n={n} finite)",
         "artifact": artifacts["table"]},
        {"claim": "K1", "model": model, "quantity": "kernel_defined_fraction", "value": ok / (n_layers * n_heads),
         "detail": f"fraction of the {n_layers * n_heads} heads whose kernel at n={n} has a finite ETC",
         "artifact": artifacts["table"]},
        {"claim": "K2", "model": model, "quantity": "kernel_heatmaps", "value": "figures",
         "detail": "query x key heatmaps of the layer-0 heads and of selected later heads", "artifact": artifacts["kernels"]},
    ]
    eq = {k: v for k, v in equivariance.items() if np.isfinite(v)}
    rows.append({"claim": "K2", "model": model, "quantity": "local_translation_tv",
                 "value": round(float(np.median(list(eq.values()))), 6) if eq else "no local head",
                 "detail": ("median over local heads of the mean TV distance between kernel rows aligned by the "
                            "offset n-i (0 = translation equivariant): " + json.dumps({k: round(v, 4) for k, v in eq.items()}))
                 if eq else "no head's kernel is local (kernel_type), so translation equivariance has no head to test",
                 "artifact": artifacts["kernels"]})
    counts = ", ".join(f"{t} {int((at['kernel_type'] == t).sum())}" for t in KERNEL_TYPES)
    rows.append({"claim": "K3", "model": model, "quantity": "kernel_types",
                 "value": [t for t in KERNEL_TYPES if (at["kernel_type"] == t).any()],
                 "detail": f"kernel types among all heads at n={n}: {counts}", "artifact": artifacts["table"]})
    for kind in KERNEL_TYPES:
        rows.append({"claim": "K4", "model": model, "quantity": f"layer0_{kind}_heads", "value": heads(0, kind),
                     "detail": f"layer-0 heads classified {kind} at n={n}", "artifact": artifacts["heatmap"]})
    if n_layers > 5:
        rows.append({"claim": "K4", "model": model, "quantity": "layer5_uniform_heads", "value": heads(5, "uniform"),
                     "detail": f"layer-5 heads classified uniform at n={n}", "artifact": artifacts["heatmap"]})
    rows.append({"claim": "K4", "model": model, "quantity": "log_etc_heatmap", "value": "figure",
                 "detail": f"log ETC over {n_layers} layers x {n_heads} heads at n={n}: {counts}",
                 "artifact": artifacts["heatmap"]})
    overlap = 1.0 - at["tv_spread_mean"]
    rows.append({"claim": "K5", "model": model, "quantity": "kernel_consistency", "value": round(float(overlap.median()), 6),
                 "detail": f"median over heads (n={n}) of the mean overlap sum_i min(pi_text, pi_mean) = 1 - TV between "
                 f"one query text's kernel and the mean over {int(at['n_texts'].iloc[0])} texts; "
                 f"lowest head {at.loc[overlap.idxmin(), 'head_name']} {float(overlap.min()):.3f}",
                 "artifact": artifacts["profiles"]})
    return scorecard_rows(rows)


def pick_heads(at: pd.DataFrame, configured: Sequence[str]) -> list[str]:
    """Heads for the "selected later heads" figure: the ``configured`` ones the model has;
    if none, one head per kernel type from layers >= 1 (the one with the median
    ``etc_fraction`` of its type), or from layer 0 for a one-layer model."""
    have = set(at["head_name"])
    chosen = [h for h in configured if h in have]
    if chosen:
        return chosen
    later = at[at["layer"] >= 1] if at["layer"].max() >= 1 else at
    out = []
    for kind in KERNEL_TYPES:
        sub = later[later["kernel_type"] == kind].sort_values("etc_fraction")
        if len(sub):
            out.append(str(sub["head_name"].iloc[len(sub) // 2]))
    return out


def check_means(count: np.ndarray, n_positions: int, attrs: dict[str, Any], processing: str, weights: str,
                path: str) -> None:
    """The cached means must cover every key position and come from the same weights and
    processing mode as the bridge whose W_Q/W_K are used."""
    if len(count) < n_positions or int(np.min(count[:n_positions])) < 1:
        have = int(np.flatnonzero(count > 0).max()) + 1 if np.any(count > 0) else 0
        raise PosmechError(
            f"{path}: position-wise means cover {have} positions but the kernels need {n_positions}; lower "
            "`kernels.etc_positions` / `kernels.heatmap_max_position` or use a `kernels.means_corpus` with longer documents"
        )
    if attrs.get("processing", processing) != processing:
        raise PosmechError(
            f"{path}: means were cached with processing {attrs.get('processing')!r}, the model is configured "
            f"{processing!r}; rerun `snakemake --forcerun cache_activations`"
        )
    if weights != "unknown" and attrs.get("weights_sha256_16", weights) != weights:
        raise PosmechError(f"{path}: cached from other weights than the model's manifest; rerun `cache_activations`")


def build_kernels(
    bridge: Any, hf_config: dict[str, Any], means: np.ndarray, count: np.ndarray, tokens: Any,
    settings: KernelsSettings, path: str | os.PathLike[str], attrs: dict[str, Any],
) -> dict[str, Any]:
    """Rule ``positional_kernels``: choose the query texts, run them through ``bridge`` for
    ``x_n``, compute every head's kernels from ``means [L, P, d_model]`` and stream them to
    ``path``.  ``tokens``: the query corpus (:class:`posmech.data.tokens.TokenSet`);
    ``settings``: the ``kernels`` section scaled to the model's context
    (:meth:`~posmech.settings.Settings.scaled`: no position left null).  Returns a small
    summary for the log."""
    k0 = int(settings.k0)
    pos = query_positions(k0, int(settings.heatmap_max_position), settings.etc_positions)
    if int(settings.etc_heatmap_position) not in set(pos.tolist()):
        raise PosmechError("config key `kernels.etc_heatmap_position` must be one of `kernels.etc_positions`")
    n_ctx = int(bridge.cfg.n_ctx)
    if pos.max() >= n_ctx:
        raise PosmechError(
            f"config key `kernels.etc_positions`/`kernels.heatmap_max_position`: position {int(pos.max())} is "
            f"beyond the model's context ({n_ctx} positions, 0..{n_ctx - 1})"
        )
    w = bridge_head_weights(bridge, hf_config, int(pos.max()) + 1)
    docs = select_documents(tokens.lengths(), int(pos.max()) + 1, int(settings.n_chapters), int(settings.seed))
    x = query_embeddings(bridge, [tokens.doc(int(j)) for j in docs], pos)
    chapters = {
        "doc_index": docs,
        "title": [tokens.titles[int(j)] for j in docs],
        "length": tokens.lengths()[docs],
    }
    meta = {
        **attrs, "k0": k0, "attn_scale": w.scale.tolist(), "attn_window": w.window.tolist(),
        "etc_heatmap_position": int(settings.etc_heatmap_position), "n_texts": len(docs),
        "key_bias_note": "key biases are included; they add q.b_K to every score of a query and cancel in the softmax"
                         if w.rotary is None else "key biases are included; rotated to each key position, they do "
                         "not cancel in the softmax",
        "position_scheme": "rotary" if w.rotary is not None else "alibi" if w.slopes is not None else "learned",
        **({"alibi_slopes": w.slopes.tolist()} if w.slopes is not None else {}),
    }
    write_kernels(path, model_kernels(means, x, pos, w, k0), w.n_layers, w.n_heads, pos, chapters, count, meta)
    return {"n_layers": w.n_layers, "n_heads": w.n_heads, "n_queries": len(pos), "texts": chapters["title"]}
