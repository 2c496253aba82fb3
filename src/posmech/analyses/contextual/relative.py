"""Layer 0 of a model whose positions are not in the residual stream — rotary, ALiBi or no
positional encoding — as the layer-0 decomposition reads it (K6–K10; the learned-positions
counterpart is :class:`~posmech.analyses.contextual.weights.Layer0Weights`).

Layer 0 reads ``r_i = e(x_i)`` (BLOOM: its embedding LayerNorm's output), so its LayerNorm
(or RMSNorm) is exact per token: no linearisation, and the scale ``s`` the learned case
uses is ignored here. With ``q(x)``, ``k(x)`` ``[d_head]`` the model's layer-0 query and key
of token ``x`` before any position enters (``hook_q``/``hook_k`` of a one-token forward,
grouped key heads repeated) and ``σ_att`` the score divisor, the split follows the
position-only and token-only inputs of docs/claims.md ("Position-only and token-only
inputs"), destination token ``d`` at position ``n``:

* **rotary** (``R(n)`` the model's rotation): exact score ``R(n)q(d)·R(i)k(x_i)/σ_att``;
  positional score ``π(n, i) = R(n)q(d)·R(i)k(d)/σ_att`` (one token repeated: only the
  rotation varies); content score ``κ(n, x) = q(d)·k(x)/σ_att`` (every query and key at the
  same position: no rotation). The split is not an identity: ``softmax(π + κ)`` (the
  decomposition's "linear" attention) differs from the exact attention, by the stored
  ``TV(A, A*)``;
* **ALiBi** (slope ``m_h``): exact score ``q(d)·k(x_i)/σ_att + m_h(i − n)``; ``π(n, i) =
  q(d)·k(d)/σ_att + m_h(i − n)`` (one token repeated: the bias and one constant per row);
  ``κ(x) = q(d)·k(x)/σ_att`` (the bias switched off). ``π + κ`` is the exact score plus a
  constant per row: the split is an identity (``TV = 0``), the positional pattern is
  ``softmax(m_h(i − n))``;
* **none**: ``π`` is one constant per row (no position part: the positional pattern is
  uniform over the keys the causal mask leaves), ``κ`` the exact score.

The stored factors keep the learned case's contract — every score is one dot product of a
query factor and a key factor, divided by ``σ_att`` — by widening the vectors: rotary
``query(d, n) = [R(n)q(d), q(d)]``, positional key ``[R(i)k(d), 0]``, content key ``[0,
k(x)]``, exact key ``[R(i)k(x), 0]`` (``2·d_head``); ALiBi ``query = [q(d), σ_att·m_h,
−σ_att·m_h·n]``, positional key ``[k(d), i, 1]``, content key ``[k(x), 0, 0]``, exact key
``[k(x), i, 1]`` (``d_head + 2``); none: the plain vectors. The positional key depends on
the token repeated (``d``): :meth:`Layer0Relative.positional_keys` takes it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from posmech.core.errors import PosmechError

#: schemes :class:`Layer0Relative` reads
RELATIVE_SCHEMES = ("rotary", "alibi", "none")


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """``x [H, T, d_head]`` rotated by ``cos, sin [T, r]`` on its first ``r`` dimensions
    (the ``rotate_half`` convention of GPT-NeoX and Llama, as
    :func:`posmech.models.scores.rotate`), the rest unchanged."""
    r = cos.shape[-1]
    xr = x[..., :r]
    half = np.concatenate([-xr[..., r // 2:], xr[..., : r // 2]], axis=-1)
    return np.concatenate([xr * cos[None] + half * sin[None], x[..., r:]], axis=-1)


@dataclass
class Layer0Relative:
    """Layer 0 of a rotary, ALiBi or position-free model (module docstring).

    ``token_qk(ids)`` → ``(q, k [H, U, d_head], scale [U])`` float64: each token's layer-0
    query and key before positions (key heads repeated per query group) and
    ``blocks.0.ln1.hook_scale``; ``cos, sin [n_ctx, r]`` (rotary), ``slopes [H]`` (ALiBi);
    ``window`` and ``softcap``: layer 0's sliding window and score cap, which the decomposition
    applies (:func:`posmech.analyses.contextual.decomposition.decompose`)."""

    scheme: str
    token_qk: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]
    n_heads: int
    n_ctx: int
    d_vocab: int
    d_head: int
    eps: float
    attn_scale: float
    cos: np.ndarray | None = None
    sin: np.ndarray | None = None
    slopes: np.ndarray | None = None
    #: keys a query of layer 0 sees, itself included (a sliding layer 0: Gemma 2's, Mistral's; 0: all)
    window: int = 0
    #: layer 0's scores soft-capped ``c·tanh(s / c)`` (Gemma 2's ``attn_logit_softcapping``; None: not)
    softcap: float | None = None
    _cache: dict[int, tuple[np.ndarray, np.ndarray, float]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.scheme not in RELATIVE_SCHEMES:
            raise PosmechError(f"Layer0Relative: scheme {self.scheme!r} is not one of {', '.join(RELATIVE_SCHEMES)}")
        if self.scheme == "rotary" and (self.cos is None or self.sin is None):
            raise PosmechError("Layer0Relative: a rotary model needs its cos/sin tables")
        if self.scheme == "alibi" and self.slopes is None:
            raise PosmechError("Layer0Relative: an ALiBi model needs its slopes")

    @property
    def width(self) -> int:
        """The width of the stored query and key factors."""
        return {"rotary": 2 * self.d_head, "alibi": self.d_head + 2, "none": self.d_head}[self.scheme]

    def _tokens(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``q, k [H, T, d_head]`` and the LN scale ``[T]`` of tokens ``ids [T]`` (each unique
        token computed once per instance)."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        new = np.array(sorted(set(ids.tolist()) - set(self._cache)), dtype=np.int64)
        for a in range(0, len(new), 4096):
            chunk = new[a : a + 4096]
            q, k, s = self.token_qk(chunk)
            for j, t in enumerate(chunk.tolist()):
                self._cache[t] = (q[:, j], k[:, j], float(s[j]))
        got = [self._cache[t] for t in ids.tolist()]
        if not got:
            z = np.zeros((self.n_heads, 0, self.d_head))
            return z, z, np.zeros(0)
        return (np.stack([g[0] for g in got], 1), np.stack([g[1] for g in got], 1),
                np.array([g[2] for g in got]))

    def _rot(self, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        assert self.cos is not None and self.sin is not None
        pos = np.asarray(pos, dtype=np.int64)
        if pos.size and int(pos.max()) >= len(self.cos):
            raise PosmechError(f"position {int(pos.max())} is beyond the model's {len(self.cos)} rotary positions")
        return rotate(x, self.cos[pos], self.sin[pos])

    def ln_scale(self, ids: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """``blocks.0.ln1.hook_scale`` per token ``[T]`` (it does not depend on the position)."""
        return self._tokens(ids)[2]

    def queries(self, ids: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """Query factors ``[H, T, width]`` of tokens ``ids`` at positions ``pos``."""
        q = self._tokens(ids)[0]
        pos = np.asarray(pos, dtype=np.int64)
        if self.scheme == "rotary":
            return np.concatenate([self._rot(q, pos), q], axis=-1)
        if self.scheme == "alibi":
            assert self.slopes is not None
            m = self.attn_scale * self.slopes[:, None, None] * np.ones((1, len(pos), 1))
            return np.concatenate([q, m, -m * pos[None, :, None]], axis=-1)
        return q

    def exact_keys(self, ids: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """Exact key factors ``[H, T, width]`` of tokens ``ids`` at positions ``pos``."""
        k = self._tokens(ids)[1]
        return self._placed(k, np.asarray(pos, dtype=np.int64))

    def _placed(self, k: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """Key factors of keys ``k [H, T, d_head]`` at positions ``pos`` (rotated / with the
        ALiBi position coordinates)."""
        if self.scheme == "rotary":
            return np.concatenate([self._rot(k, pos), np.zeros_like(k)], axis=-1)
        if self.scheme == "alibi":
            ones = np.ones((k.shape[0], len(pos), 1))
            return np.concatenate([k, ones * pos[None, :, None], ones], axis=-1)
        return k

    def content_keys(self, s: float, ids: np.ndarray | None = None) -> np.ndarray:
        """Content key factors ``[H, U, width]`` of tokens ``ids`` (all when None); ``s`` is
        not used (layer 0's norm is exact per token)."""
        k = self._tokens(np.arange(self.d_vocab) if ids is None else ids)[1]
        if self.scheme == "rotary":
            return np.concatenate([np.zeros_like(k), k], axis=-1)
        if self.scheme == "alibi":
            return np.concatenate([k, np.zeros(k.shape[:2] + (2,))], axis=-1)
        return k

    def positional_keys(self, s: float, token: int | None = None) -> np.ndarray:
        """Positional key factors ``[H, n_ctx, width]`` of ``token`` repeated at every
        position (the position-only input); ``s`` is not used."""
        if token is None:
            raise PosmechError("the positional keys of a rotary, ALiBi or position-free model are those of one "
                               "repeated token: pass it")
        k = self._tokens(np.full(self.n_ctx, int(token)))[1]
        return self._placed(k, np.arange(self.n_ctx))

    def positional_scores(self, q: np.ndarray, dest: np.ndarray, pos: np.ndarray, K: int, s: float) -> np.ndarray:
        """``π [H, N, K]``: query factors ``q [H, N, width]`` of destination tokens ``dest
        [N]`` at the positional keys of each row's own destination token."""
        out = np.empty((q.shape[0], len(dest), K))
        for t in np.unique(dest):
            rows = np.flatnonzero(dest == t)
            kp = self._placed(self._tokens(np.full(K, int(t)))[1], np.arange(K))
            out[:, rows] = q[:, rows] @ kp.transpose(0, 2, 1) / self.attn_scale
        return out


def relative_from_model(model: Any, name: str = "model", n_ctx: int | None = None) -> Layer0Relative:
    """:class:`Layer0Relative` of a loaded model (the posmech engine or a TransformerBridge):
    its position scheme from ``cfg.positional_embedding_type``, each token's query and key
    from layer 0's ``hook_q``/``hook_k`` and its LN scale from ``blocks.0.ln1.hook_scale``
    in one-token forward passes (position 0, nothing positional in them), the rotary tables
    of its own rotary embedding, ALiBi's slopes. ``n_ctx``: the positions analysed (default
    the model's ``cfg.n_ctx``; the pipeline passes ``models.<name>.n_ctx`` or the context its
    config records: BLOOM records none). Layer 0's sliding window (``cfg.windows``, the
    engine's) and score cap (Gemma 2) are recorded for the decomposition."""
    import torch

    from posmech.analyses.kernels import rotary_tables
    from posmech.models.scores import alibi_slopes, attn_scale, halves_order, score_function

    cfg = model.cfg
    kind = str(getattr(cfg, "positional_embedding_type", "standard") or "standard")
    scheme = {"rotary": "rotary", "alibi": "alibi", "none": "none"}.get(kind)
    if scheme is None:
        raise PosmechError(f"model {name!r}: positional_embedding_type {kind!r} is not rotary, ALiBi or none; "
                           "its layer 0 is read from its weights (contextual.weights)")
    H = int(cfg.n_heads)
    dev = getattr(cfg, "device", "cpu")
    n_ctx = int(n_ctx or cfg.n_ctx)
    # GPT-J's interleaved pairs (2f, 2f+1) read in the halves layout rotate() uses: queries,
    # keys and tables reordered alike (posmech.models.scores.halves_order), q·k unchanged
    interleaved = scheme == "rotary" and score_function(cfg).interleaved
    tables = rotary_tables(model, n_ctx) if scheme == "rotary" else None
    r = tables[0].shape[-1] if tables is not None else 0

    def token_qk(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        got: dict[str, Any] = {}

        def keep(key: str) -> Callable[..., None]:
            def fn(t: Any, hook: Any) -> None:
                got[key] = t.detach().to("cpu", torch.float64)
            return fn

        hooks = [("blocks.0.attn.hook_q", keep("q")), ("blocks.0.attn.hook_k", keep("k")),
                 ("blocks.0.ln1.hook_scale", keep("s"))]
        x = torch.as_tensor(np.asarray(ids, dtype=np.int64)[:, None], device=dev)
        with torch.inference_mode(), model.hooks(fwd_hooks=hooks):
            model(x, return_type=None)
        q, k = got["q"][:, 0], got["k"][:, 0]  # [U, heads, d_head]
        if k.shape[1] != H:
            k = k.repeat_interleave(H // k.shape[1], dim=1)
        q, k = halves_order(q, r, interleaved), halves_order(k, r, interleaved)
        return (q.permute(1, 0, 2).numpy(), k.permute(1, 0, 2).numpy(), got["s"].reshape(-1).numpy())

    windows = list(getattr(cfg, "windows", None) or [])  # the engine's per-layer windows
    cos = sin = slopes = None
    if tables is not None:
        cos, sin = (halves_order(t, r, interleaved) for t in tables)
    if scheme == "alibi":
        slopes = alibi_slopes(H)
    return Layer0Relative(scheme, token_qk, H, n_ctx, int(cfg.d_vocab), int(cfg.d_head), float(cfg.eps),
                          float(attn_scale(cfg)), cos, sin, slopes, int(windows[0]) if windows else 0,
                          score_function(cfg).softcap)
