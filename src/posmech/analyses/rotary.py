"""Rotary frequency usage (P17, P18): which 2-D rotary frequency pairs carry each head's
``q·k``, the rotary counterpart of the W_pos findings (Barbero et al. 2024, "Round and Round
We Go! What makes Rotary Positional Encodings useful?").

A rotary model rotates each head's query and key, pair of dimensions by pair of dimensions,
by an angle proportional to the position: pair ``f`` (dimensions ``f`` and ``f + r/2`` in the
``rotate_half`` layout of GPT-NeoX and Llama, ``2f`` and ``2f + 1`` in GPT-J's interleaved
layout, which is reordered into the former first: :func:`posmech.models.scores.halves_order`;
``r`` the rotated dimensions) turns by
``θ_f`` radians per position, ``θ_f = base^(-2f/r)`` in the standard scheme, so pair 0 has
the highest frequency and pair ``r/2 − 1`` the lowest. The frequencies are read from the
model's own rotation (``hook_cos``/``hook_sin`` at position 1), so a scaled or non-standard
rotary embedding is measured as it is. The raw score is a sum over the pairs (and, for a
partial rotation, the unrotated dimensions, counted as one component of frequency 0):

    s(n, i) = Σ_f c_f(n, i),   c_f(n, i) = (R(n) q_n)_f · (R(i) k_i)_f / scale.

A model that soft-caps its scores (Gemma 2's ``attn_logit_softcapping``) attends with
``c·tanh(s/c)``: the pairs still add up to ``s``, the logit before the cap, which the cap
only bends monotonically; the pattern below is then the softmax of the capped ``s`` (the
model's), and the shares split the selectivity of the logit ``s`` (still ``≥ 0``: the
weights grow with ``s``). Per head, on documents of the corpus (queries ``n ≥ 1``, keys
``i ≤ n``; ``a`` the head's pattern, the softmax of ``s`` (capped where the model caps it),
checked against the model's ``hook_pattern``):

* *selectivity* of component ``f`` at query ``n``: ``d_f(n) = Σ_i a(n, i) c_f(n, i) −
  mean_{i ≤ n} c_f(n, i)`` (the keys a sliding-window layer lets ``n`` see, where it has one), how much more the component scores the keys the head attends
  to than the average key. Summed over the components it is the head's selectivity,
  ``Σ_i a·s − mean s ≥ 0`` (softmax weights grow with the score); the *selectivity share*
  of ``f`` is ``Σ_n d_f(n) / Σ_n Σ_f d_f(n)`` (the shares sum to 1; a component that works
  against the pattern has a negative share). A head with no selectivity (total 0) has no
  shares (NaN).
* *usage* of pair ``f`` (Barbero et al.'s Fig. 3): ``mean ||q_f|| · mean ||k_f||`` over the
  tokens at positions ≥ 1 (the BOS position's vectors are often outliers), the size of the
  largest contribution the pair can make (the rotation keeps norms); the *usage share* is
  its fraction of the head's total over the rotated pairs.
* *previous-token score*: mean ``a(n, n − 1)`` over the queries ``n ≥ 1``.

The bands: the ``band`` highest-frequency pairs and the ``band`` lowest, ``band =
ceil(band_fraction · r/2)``.

* **P17** (positional heads are built from the highest frequencies): the share of the
  sharpest previous-token head's selectivity carried by the highest-frequency band; not
  measurable when no head's previous-token score reaches ``min_previous_token_score``.
* **P18** (the model's usage peaks in the lowest frequencies): the mean over every head of
  the usage share in the lowest band over that in the highest band (1: no preference; a
  random-init model, whose query and key weights favour no pair, scores about 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from posmech.analyses.attention import head_name
from posmech.core.errors import PosmechError
from posmech.models.scores import score_function

#: largest |pattern − hook_pattern| accepted: the decomposition's scores are the model's own
PATTERN_ATOL = 1e-3


@dataclass
class FrequencyUsage:
    """What :func:`frequency_usage` measures, per layer ``L``, head ``H`` and component
    ``C`` (the ``P = r/2`` rotated pairs, highest frequency first, then the unrotated
    dimensions when the rotation is partial): ``selectivity [L, H, C]`` (summed over the
    queries), ``usage [L, H, P]``, ``prev [L, H]`` (previous-token score), ``frequency
    [P]`` (radians per position), ``n_queries`` (queries summed over) and
    ``max_pattern_diff`` (the largest |pattern − hook_pattern|)."""

    selectivity: np.ndarray
    usage: np.ndarray
    prev: np.ndarray
    frequency: np.ndarray
    n_queries: int
    max_pattern_diff: float

    @property
    def n_pairs(self) -> int:
        return len(self.frequency)

    @property
    def shares(self) -> np.ndarray:
        """``[L, H, C]`` selectivity shares; NaN for a head whose total selectivity is not positive."""
        tot = self.selectivity.sum(-1, keepdims=True)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(tot > 0, self.selectivity / np.where(tot > 0, tot, 1.0), np.nan)

    @property
    def usage_shares(self) -> np.ndarray:
        """``[L, H, P]`` usage of each rotated pair over the head's total (NaN for a head with none)."""
        tot = self.usage.sum(-1, keepdims=True)
        return np.where(tot > 0, self.usage / np.where(tot > 0, tot, 1.0), np.nan)


def pair_frequencies(cos: Any, sin: Any) -> np.ndarray:
    """Radians per position of each rotated pair, from the model's ``cos, sin [b, n, r]``
    (position 0 unrotated): the angle at position 1 of dimension ``f < r/2`` (the
    ``rotate_half`` layout: dimensions ``f`` and ``f + r/2`` turn together)."""
    import torch

    c, s = (torch.as_tensor(t)[0, 1].double().cpu().numpy() for t in (cos, sin))
    r = len(c)
    if r % 2 or not np.allclose(c[: r // 2], c[r // 2:]) or not np.allclose(s[: r // 2], s[r // 2:]):
        raise PosmechError("the model's rotary cos/sin do not pair dimension f with f + r/2 (the rotate_half "
                           "layout of GPT-NeoX and Llama): an interleaved rotation is not decomposed here")
    return np.arctan2(s[: r // 2], c[: r // 2])


def components(qr: Any, kr: Any, r: int, scale: float) -> Any:
    """Per-component raw scores ``[b, H, C, n, n]`` (float64) from the *rotated* queries and keys
    ``qr, kr [b, n, H, d_head]`` (:meth:`ScoreFunction.prepare
    <posmech.models.scores.ScoreFunction.prepare>`: key heads repeated per query group) whose
    first ``r`` dimensions are rotated; ``scale`` the model's divisor of ``q·k``. Summed over
    ``C`` they are the raw scores ``ScoreFunction.full`` gives."""
    import torch

    P = r // 2
    qp = torch.stack((qr[..., :P], qr[..., P:r]), -2)  # [b, n, H, 2, P]
    kp = torch.stack((kr[..., :P], kr[..., P:r]), -2)
    c = torch.einsum("bqhtf,bkhtf->bhfqk", qp, kp)
    if r < qr.shape[-1]:
        rest = torch.einsum("bqhd,bkhd->bhqk", qr[..., r:], kr[..., r:])[:, :, None]
        c = torch.cat((c, rest), 2)
    return c / scale


def head_accumulate(c: Any, pattern: Any | None = None, cap: Any = None,
                    window: int = 0) -> tuple[Any, Any, Any, float]:
    """From one layer's components ``c [b, H, C, n, n]``: the selectivity summed over the
    queries ``n ≥ 1`` ``[H, C]``, the previous-token attention summed over them ``[H]``, the
    number of those queries, and the largest |softmax(cap(Σ c)) − pattern| (``pattern [b, H, n,
    n]``, the model's own; 0 without it; ``cap`` the model's soft-capping of its scores,
    :meth:`ScoreFunction.cap <posmech.models.scores.ScoreFunction.cap>`, none by default). The
    keys of query ``n`` are ``i ≤ n``, and ``i > n − window`` in a sliding-window layer
    (``window`` > 0: Gemma 2's and Mistral's sliding layers); the mean key is over them."""
    import torch

    n = c.shape[-1]
    causal = torch.ones(n, n, dtype=torch.bool, device=c.device).tril()
    if window:
        causal &= torch.ones(n, n, dtype=torch.bool, device=c.device).triu(1 - window)
    s = c.sum(2)
    s = (cap(s) if cap is not None else s).masked_fill(~causal, float("-inf"))
    a = s.softmax(-1)  # [b, H, n, n]
    diff = float((a - pattern.double()).abs().max()) if pattern is not None else 0.0
    keys = causal.sum(-1).to(c.dtype)  # [n]
    cm = c.masked_fill(~causal, 0.0)
    weighted = torch.einsum("bhqk,bhfqk->bhfq", a, cm)
    mean = cm.sum(-1) / keys  # [b, H, C, n]
    d = (weighted - mean)[..., 1:].sum((0, 3))  # [H, C]
    idx = torch.arange(1, n, device=c.device)
    prev = a[:, :, idx, idx - 1].sum((0, 2))
    return d, prev, c.shape[0] * (n - 1), diff


def pair_norms(x: Any, r: int) -> Any:
    """``||x_f||`` of each rotated pair ``[b, n, H, P]`` of ``x [b, n, H, d_head]``."""
    P = r // 2
    return (x[..., :P].double() ** 2 + x[..., P:r].double() ** 2).sqrt()


class _Totals:
    """The sums :func:`frequency_usage` accumulates over the batches, per layer and head."""

    def __init__(self, n_layers: int, n_heads: int, freq: np.ndarray, d_head: int) -> None:
        P = len(freq)
        self.freq, self.r = freq, 2 * P
        self.sel = np.zeros((n_layers, n_heads, P + (1 if 2 * P < d_head else 0)))
        self.norm_q, self.norm_k = np.zeros((n_layers, n_heads, P)), np.zeros((n_layers, n_heads, P))
        self.prev = np.zeros((n_layers, n_heads))
        self.n_queries = self.n_tokens = 0
        self.diff = 0.0

    def add(self, layer: int, q: Any, k: Any, extra: dict[str, Any], pattern: Any, fn: Any, window: int = 0) -> None:
        """One batch's layer: ``q [b, n, H, d]``, ``k [b, n, H_kv, d]`` before the rotation."""
        qr, kr = fn.prepare(q.double(), k.double(), extra)
        # the halves pairing (f, f + r/2) that components and pair_norms read (GPT-J's (2f, 2f + 1) reordered)
        qr, kr, q, k = (fn.halves(t, self.r) for t in (qr, kr, q, k))
        for h in range(qr.shape[2]):  # one head at a time: C x n x n scores per document
            d, p, nq, df = head_accumulate(components(qr[:, :, h:h + 1], kr[:, :, h:h + 1], self.r, fn.scale),
                                           pattern[:, h:h + 1], fn.cap, window)
            self.sel[layer, h] += d[0].cpu().numpy()
            self.prev[layer, h] += float(p[0])
            self.diff = max(self.diff, df)
        kn = pair_norms(k, self.r)  # per key head: repeated for its group of query heads
        if kn.shape[2] != q.shape[2]:
            kn = kn.repeat_interleave(q.shape[2] // kn.shape[2], dim=2)
        self.norm_q[layer] += pair_norms(q, self.r)[:, 1:].sum((0, 1)).cpu().numpy()
        self.norm_k[layer] += kn[:, 1:].sum((0, 1)).cpu().numpy()
        if layer == 0:
            self.n_queries += nq
            self.n_tokens += q.shape[0] * (q.shape[1] - 1)

    def result(self) -> FrequencyUsage:
        usage = (self.norm_q / self.n_tokens) * (self.norm_k / self.n_tokens)
        return FrequencyUsage(self.sel / self.n_queries, usage, self.prev / self.n_queries, self.freq,
                              self.n_queries, self.diff)


def _layer_windows(model: Any, n_layers: int) -> list[int]:
    """Each layer's sliding window (0: none) from the model's Hugging Face config (the
    engine's ``hf_config``, the bridge's original model's), by
    :func:`posmech.models.architecture.layer_windows`; none without a config."""
    from posmech.models.architecture import layer_windows

    hf = getattr(model, "original_model", None)
    config = getattr(model, "hf_config", None) or (hf.config.to_dict() if hasattr(hf, "config") else {})
    return layer_windows(config, n_layers) if config else [0] * n_layers


def frequency_usage(bridge: Any, documents: np.ndarray, batch_size: int) -> FrequencyUsage:
    """:class:`FrequencyUsage` of every head of a rotary model on ``documents [B, n]``
    (token ids, equal lengths ``n ≥ 2``), ``batch_size`` documents a forward pass."""
    import torch

    cfg = bridge.cfg
    fn = score_function(cfg)
    if fn.scheme != "rotary":
        raise PosmechError(f"rotary frequencies: the model's positions are {fn.scheme}, not rotary")
    B, n = documents.shape
    if n < 2 or B == 0:
        raise PosmechError(f"rotary frequencies: {B} documents of {n} tokens; need at least one of 2 tokens")
    L = int(cfg.n_layers)
    windows = _layer_windows(bridge, L)
    names = ("hook_q", "hook_k", "hook_cos", "hook_sin", "hook_pattern")
    totals: _Totals | None = None
    for start in range(0, B, batch_size):
        got: dict[tuple[str, int], Any] = {}

        def grab(name: str, layer: int) -> Any:
            def keep(t: Any, hook: Any) -> None:
                got[(name, layer)] = t.detach().to("cpu")

            return keep

        hooks = [(f"blocks.{la}.attn.{k}", grab(k, la)) for la in range(L) for k in names]
        x = torch.as_tensor(np.asarray(documents[start:start + batch_size], dtype=np.int64), device=cfg.device)
        with torch.inference_mode(), bridge.hooks(fwd_hooks=hooks):
            bridge(x, return_type=None)
        for la in range(L):
            missing = [k for k in names if (k, la) not in got]
            if missing:
                raise PosmechError(f"rotary frequencies: layer {la}'s {'/'.join(missing)} did not fire; this "
                                   "architecture does not expose its rotation to TransformerLens hooks")
            extra = {"hook_cos": got[("hook_cos", la)], "hook_sin": got[("hook_sin", la)]}
            if totals is None:
                r = int(extra["hook_cos"].shape[-1])
                totals = _Totals(L, int(cfg.n_heads), pair_frequencies(fn.halves(extra["hook_cos"], r),
                                                                       fn.halves(extra["hook_sin"], r)),
                                 int(cfg.d_head))
            totals.add(la, got[("hook_q", la)], got[("hook_k", la)], extra, got[("hook_pattern", la)], fn, windows[la])
    assert totals is not None
    if totals.diff > PATTERN_ATOL:
        raise PosmechError(f"rotary frequencies: the softmax of the decomposed scores differs from the model's "
                           f"hook_pattern by {totals.diff:.3g} (> {PATTERN_ATOL}); its rotation or scale is not one "
                           "posmech knows, so its q·k cannot be split into frequency pairs")
    return totals.result()


def band_size(n_pairs: int, band_fraction: float) -> int:
    """Pairs in each band: ``ceil(band_fraction · n_pairs)``, at least 1, at most half."""
    if n_pairs < 2:
        raise PosmechError(f"rotary frequencies: {n_pairs} rotated pair(s); the bands need at least 2")
    return max(1, min(n_pairs // 2, math.ceil(band_fraction * n_pairs)))


def frequency_table(fu: FrequencyUsage, model: str) -> pd.DataFrame:
    """One row per (head, component): layer, head, head_name, component (the pair index, 0 =
    the highest frequency; ``P`` = the unrotated dimensions), frequency (radians per
    position; 0 unrotated), selectivity, selectivity_share, usage and usage_share (NaN for
    the unrotated component) and the head's previous_token_score."""
    rows = []
    shares, ushares = fu.shares, fu.usage_shares
    L, H, C = fu.selectivity.shape
    for la in range(L):
        for h in range(H):
            for f in range(C):
                rotated = f < fu.n_pairs
                rows.append({"claim": "P17, P18", "model": model, "layer": la, "head": h,
                             "head_name": head_name(la, h), "component": f, "rotated": rotated, "frequency": float(fu.frequency[f]) if rotated else 0.0,
                             "selectivity": float(fu.selectivity[la, h, f]),
                             "selectivity_share": float(shares[la, h, f]),
                             "usage": float(fu.usage[la, h, f]) if rotated else math.nan,
                             "usage_share": float(ushares[la, h, f]) if rotated else math.nan,
                             "previous_token_score": float(fu.prev[la, h])})
    return pd.DataFrame(rows)


def usage_profile(fu: FrequencyUsage) -> np.ndarray:
    """``[P]``: the usage share of each pair, averaged over the heads that use any pair."""
    us = fu.usage_shares.reshape(-1, fu.n_pairs)
    used = us[~np.isnan(us).any(-1)]
    if not len(used):
        raise PosmechError("rotary frequencies: no head has any query or key norm in its rotated pairs")
    return used.mean(0)


def sharpest_previous_token_head(fu: FrequencyUsage) -> tuple[int, int]:
    """``(layer, head)`` of the largest previous-token score."""
    la, h = np.unravel_index(int(np.argmax(fu.prev)), fu.prev.shape)
    return int(la), int(h)


def frequency_scorecard(fu: FrequencyUsage, model: str, band_fraction: float, min_prev: float,
                        artifact: str) -> list[dict[str, Any]]:
    """P17's and P18's rows (module docstring): ``high_band_share`` of the sharpest
    previous-token head (no value, with the reason, when its score is under ``min_prev``),
    and ``low_over_high_usage``; neither has a value when the rotation has a single pair (no
    highest and lowest band to tell apart)."""
    if fu.n_pairs < 2:
        why = f"{fu.n_pairs} rotated pair per head: no highest- and lowest-frequency band to tell apart"
        return [{"claim": c, "model": model, "quantity": q, "artifact": artifact, "value": None, "detail": why}
                for c, q in (("P17", "high_band_share"), ("P18", "low_over_high_usage"))]
    band = band_size(fu.n_pairs, band_fraction)
    la, h = sharpest_previous_token_head(fu)
    score = float(fu.prev[la, h])
    share = float(np.nansum(fu.shares[la, h, :band])) if not np.isnan(fu.shares[la, h]).all() else math.nan
    bands = f"band = the {band} of {fu.n_pairs} pairs of highest frequency"
    if score < min_prev:
        p17 = {"value": None, "detail": f"no previous-token head: the sharpest, {head_name(la, h)}, scores {score:.3f} "
                                        f"< rotary_frequencies.min_previous_token_score {min_prev:g}"}
    elif math.isnan(share):
        p17 = {"value": None, "detail": f"{head_name(la, h)} has no selectivity to split"}
    else:
        p17 = {"value": share, "detail": f"{head_name(la, h)} (previous-token score {score:.3f}); {bands}"}
    prof = usage_profile(fu)
    low, high = float(prof[-band:].mean()), float(prof[:band].mean())
    ratio = low / high if high > 0 else math.nan
    return [
        {"claim": "P17", "model": model, "quantity": "high_band_share", "artifact": artifact, **p17},
        {"claim": "P18", "model": model, "quantity": "low_over_high_usage", "artifact": artifact,
         "value": None if math.isnan(ratio) else ratio,
         "detail": (f"mean usage share of the {band} lowest-frequency pairs {low:.3f} over the {band} highest "
                    f"{high:.3f}, {len(fu.prev.ravel())} heads") if not math.isnan(ratio)
         else "no head uses the highest-frequency pairs (a ratio over nothing)"},
    ]
