"""How a model turns its queries and keys into pre-softmax attention scores, per position
scheme: the scale of ``q·k`` (:func:`attn_scale`), the scheme read from a loaded model's
config (:func:`position_scheme`: learned absolute, rotary or ALiBi), ALiBi's slopes
(:func:`alibi_slopes`), the rotary rotation (:func:`rotate`) and :class:`ScoreFunction`,
which gives the *raw scores* of every query–key pair. Shared by the forward engine
(:mod:`posmech.models.lens`) and every analysis that reads scores (anatomy, kernels,
attn_only, taxonomy): the model layer, not a family's."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from posmech.core.errors import PosmechError
from posmech.models.architecture import architecture, attention_windows, is_tl_config, score_divisor

#: Hugging Face architectures whose attention does not scale ``q·k`` (TransformerLens 4.3's
#: bridge config still says ``use_attn_scale``)
UNSCALED = ("GPTNeoForCausalLM",)


def attn_scale(cfg: Any) -> float:
    """The divisor of ``q·k`` in the model's attention, from a loaded model's ``cfg`` (the
    engine's or the bridge's, TransformerLens's names) by
    :func:`posmech.models.architecture.score_divisor`: ``cfg.attn_scale`` when positive,
    else ``sqrt(d_head)``; 1 when ``cfg.use_attn_scale`` is false or the architecture is
    GPT-Neo (:data:`UNSCALED`: the bridge's config says ``use_attn_scale`` there)."""
    arch = getattr(cfg, "architecture", None) or getattr(cfg, "original_architecture", None)
    use = bool(getattr(cfg, "use_attn_scale", True)) and arch not in UNSCALED
    tl = {"d_model": getattr(cfg, "d_model", None), "n_layers": getattr(cfg, "n_layers", None),  # a TL config
          "use_attn_scale": use, "attn_scale": getattr(cfg, "attn_scale", None)}
    return score_divisor(tl, int(cfg.d_head))


def position_scheme(cfg: Any) -> str:
    """How positions enter the scores, from TransformerLens's ``cfg.positional_embedding_type``:
    ``learned`` (``standard``/``shortformer``: learned absolute positions, already in ``q``
    and ``k``), ``rotary`` (``q`` and ``k`` rotated by their positions) or ``alibi`` (a
    per-head linear bias added to the scores)."""
    kind = str(getattr(cfg, "positional_embedding_type", "standard") or "standard")
    if kind in ("standard", "shortformer"):
        return "learned"
    if kind in ("rotary", "alibi"):
        return kind
    raise PosmechError(f"positional_embedding_type {kind!r}: raw attention scores are defined for learned "
                       "absolute, rotary and ALiBi positions only")


def alibi_slopes(n_heads: int) -> np.ndarray:
    """ALiBi's per-head slopes ``m_h`` (Press et al. 2022; BLOOM's ``build_alibi_tensor``):
    with ``c`` the largest power of two ``<= n_heads``, ``m_h = 2^(-8(h+1)/c)`` for ``h < c``;
    the other heads take every other slope of the ``2c`` sequence, ``2^(-4(2j+1)/c)``."""
    n = int(n_heads)
    c = 2 ** int(math.floor(math.log2(n)))
    slopes = [2.0 ** (-8.0 * (h + 1) / c) for h in range(c)]
    slopes += [2.0 ** (-4.0 * (2 * j + 1) / c) for j in range(min(c, n - c))]
    return np.asarray(slopes, dtype=np.float64)


def read_position_biases(hf_dir: str | os.PathLike[str], n_layers: int, n_heads: int
                         ) -> tuple[list[int], Any]:
    """What fixes a head's attention when its query–key scores are zero, from the ``config.json``
    in ``hf_dir``: ``(windows, slopes)``: the sliding window of each layer
    (:func:`posmech.models.architecture.attention_windows`) and, for an
    ALiBi model, the slope of each head (:func:`alibi_slopes`; ``None``
    for any other model)."""
    p = Path(hf_dir) / "config.json"
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise PosmechError(f"{str(p)!r} cannot be read as JSON ({err})") from None
    alibi = not is_tl_config(cfg) and architecture(cfg, repr(str(hf_dir))).positions == "alibi"
    return attention_windows(cfg, n_layers), alibi_slopes(n_heads) if alibi else None


def rotate(x: Any, cos: Any, sin: Any, interleaved: bool = False) -> Any:
    """Rotary position embedding of ``x [b, n, H, d_head]`` with the model's own ``cos, sin
    [b, n, r]`` (``r <= d_head``, the rotary dimensions: GPT-NeoX/Pythia and GPT-J rotate
    the first ``partial_rotary_factor·d_head`` / ``rotary_dim`` of them), the rest unchanged:
    ``x_r·cos + rot(x_r)·sin`` on the first ``r`` dimensions, ``rot`` the pairing of the
    model's layout:

    * halves (``interleaved`` false; GPT-NeoX, Llama's ``rotate_half``): dimension ``f`` turns
      with ``f + r/2``, ``rot(x) = (-x[r/2:], x[:r/2])``, ``cos``/``sin`` each frequency
      twice, one after the other (``[θ_0..θ_{r/2-1}, θ_0..θ_{r/2-1}]``);
    * interleaved (GPT-J's ``rotate_every_two``): dimension ``2f`` turns with ``2f + 1``,
      ``rot(x)_{2f} = -x_{2f+1}``, ``rot(x)_{2f+1} = x_{2f}``, ``cos``/``sin`` each
      frequency twice in a row (``[θ_0, θ_0, θ_1, θ_1, ..]``, HF's ``duplicate_interleave``)."""
    import torch

    r = int(cos.shape[-1])
    xr = x[..., :r]
    if interleaved:
        turned = torch.stack((-xr[..., 1::2], xr[..., 0::2]), -1).flatten(-2)
    else:
        turned = torch.cat((-xr[..., r // 2:], xr[..., : r // 2]), -1)
    c, s = cos[:, :, None].to(x.dtype), sin[:, :, None].to(x.dtype)
    rot = xr * c + turned * s
    return rot if r == x.shape[-1] else torch.cat((rot, x[..., r:]), -1)


def halves_order(x: Any, r: int, interleaved: bool) -> Any:
    """``x [..., d]`` with its first ``r`` dimensions reordered from the interleaved pairing
    (``2f, 2f + 1``) into the halves pairing (``f, f + r/2``): dimensions ``0, 2, .., r-2,
    1, 3, .., r-1``, then the rest; unchanged when not ``interleaved``. Applied to a query
    and its key alike it leaves ``q·k`` as it is, and a rotated interleaved vector becomes
    the halves rotation of the reordered one (the same ``cos``/``sin`` reordered too), so
    code written for the halves layout (frequency pairs, kernels) reads GPT-J's pairs."""
    if not interleaved:
        return x
    import numpy as np

    idx = [*range(0, r, 2), *range(1, r, 2), *range(r, x.shape[-1])]
    if isinstance(x, np.ndarray):
        return x[..., idx]
    import torch

    return x.index_select(-1, torch.as_tensor(idx, device=x.device))


@dataclass(frozen=True)
class ScoreFunction:
    """How a model turns ``hook_q`` and ``hook_k`` into its pre-softmax scores, for every
    query–key pair (the future included): the *raw scores*

    * ``learned``: ``q_n·k_i / scale`` (GPT-2, GPT-Neo with ``scale`` 1, OPT);
    * ``rotary``: ``R(n) q_n · R(i) k_i / scale``, ``R`` the model's rotation of the rotary
      dimensions (:func:`rotate`, with the ``cos``/``sin`` the model's rotary embedding hands
      its attention: ``blocks.L.attn.hook_cos``/``hook_sin``), pairs of the halves layout or,
      ``interleaved``, GPT-J's adjacent pairs;
    * soft-capped scores (Gemma 2): ``c·tanh(raw / c)`` of the above (:meth:`cap`);
    * ``alibi``: ``q_n·k_i / scale + m_h·(i - n)`` (:func:`alibi_slopes`): ALiBi's bias
      relative to the query, 0 on the diagonal, positive for future keys.  BLOOM adds
      ``m_h·i``, which differs by ``m_h·n``, a constant per query row that the softmax
      ignores; its scores are compared up to that constant.

    Grouped key heads (``k [b, n, H_kv, d_head]``, Llama-style grouped-query attention) are
    repeated, key head ``j`` serving query heads ``j·H/H_kv .. (j+1)·H/H_kv - 1``."""

    scheme: str
    scale: float
    slopes: tuple[float, ...] = ()
    #: Gemma 2's attention soft-capping ``c``: scores ``c·tanh(s / c)`` (None: none)
    softcap: float | None = None
    #: rotary pairs are adjacent dimensions (GPT-J's ``rotate_every_two``), not halves
    interleaved: bool = False

    def halves(self, x: Any, r: int) -> Any:
        """``x`` with its first ``r`` dimensions in the halves pairing (:func:`halves_order`)."""
        return halves_order(x, r, self.interleaved)

    def cap(self, s: Any) -> Any:
        """``s`` soft-capped as the model does (``c·tanh(s / c)``), unchanged without a cap."""
        import torch

        return s if not self.softcap else self.softcap * torch.tanh(s / self.softcap)

    @property
    def extra_hooks(self) -> tuple[str, ...]:
        """Attention hooks besides ``hook_q``/``hook_k`` the scores need."""
        return ("hook_cos", "hook_sin") if self.scheme == "rotary" else ()

    @property
    def row_constant(self) -> bool:
        """Whether the model's own scores may differ from the raw ones by a per-row constant."""
        return self.scheme == "alibi"

    def prepare(self, q: Any, k: Any, extra: dict[str, Any] | None = None) -> tuple[Any, Any]:
        """``(q, k)`` float32 (float64 when ``q`` is), rotated when rotary, key heads repeated
        per query group."""
        import torch

        dt = torch.float64 if q.dtype == torch.float64 else torch.float32
        q, k = q.to(dt), k.to(dt)
        if self.scheme == "rotary":
            if not extra or "hook_cos" not in extra or "hook_sin" not in extra:
                raise PosmechError("rotary scores need the model's hook_cos/hook_sin; this engine did not record them")
            cos, sin = extra["hook_cos"], extra["hook_sin"]
            q, k = rotate(q, cos, sin, self.interleaved), rotate(k, cos, sin, self.interleaved)
        if k.shape[2] != q.shape[2]:
            k = k.repeat_interleave(q.shape[2] // k.shape[2], dim=2)
        return q, k

    def bias(self, query_pos: Any, key_pos: Any, dtype: Any = None) -> Any:
        """ALiBi's ``m_h·(key - query)`` ``[H, *query_pos.shape]`` for integer position
        tensors ``query_pos``, ``key_pos`` of one shape (torch; ``dtype`` default float32)."""
        import torch

        dtype = dtype or torch.float32
        m = torch.as_tensor(self.slopes, dtype=dtype, device=query_pos.device)
        return m.view(-1, *([1] * query_pos.ndim)) * (key_pos - query_pos).to(dtype)[None]

    def full(self, q: Any, k: Any, extra: dict[str, Any] | None = None, positions: Any = None) -> Any:
        """Raw scores ``[b, H, n_q, n_k]`` float32 (float64 for float64 ``q``) of every pair,
        the tokens at ``positions`` (integer ``[n]``, default ``0..n-1``: ALiBi's bias reads
        them; a rotary model's positions are already in ``extra``'s ``hook_cos``/``hook_sin``).
        Every token at position 0 (the L rules' token-only input) switches ALiBi's bias off."""
        import torch

        q, k = self.prepare(q, k, extra)
        s = self.cap(torch.einsum("bqhd,bkhd->bhqk", q, k) / self.scale)
        if self.scheme == "alibi":
            pos = (torch.arange(q.shape[1], device=q.device) if positions is None
                   else torch.as_tensor(positions, device=q.device))
            pq = pos[:, None].expand(-1, k.shape[1])
            pk = pos[None, : k.shape[1]].expand(q.shape[1], -1)
            s = s + self.bias(pq, pk, s.dtype)[None]
        return s

    def window(self, q: Any, k: Any, rows: np.ndarray, window: int, extra: dict[str, Any] | None = None) -> Any:
        """Raw scores of queries ``rows`` at keys ``rows + o``, ``o = -W..W``:
        ``[b, H, len(rows), 2W+1]`` float32 (only these dot products are computed)."""
        import torch

        q, k = self.prepare(q, k, extra)
        r = torch.as_tensor(rows, device=q.device)
        keys = r[:, None] + torch.as_tensor(offsets(window), device=q.device)[None, :]  # [R, 2W+1]
        s = self.cap(torch.einsum("brhd,brohd->bhro", q[:, r], k[:, keys]) / self.scale)
        if self.scheme == "alibi":
            s = s + self.bias(r[:, None].expand_as(keys), keys, s.dtype)[None]
        return s


def score_function(cfg: Any) -> ScoreFunction:
    """The :class:`ScoreFunction` of a model from its (TransformerLens) ``cfg``: the scheme
    (:func:`position_scheme`), the scale (:func:`attn_scale`: ``sqrt(d_head)`` for GPT-2,
    GPT-NeoX, Llama, BLOOM and OPT, 1 for GPT-Neo) and, for ALiBi, the slopes of its
    ``n_heads`` heads; Gemma 2's soft-capping from ``cfg.attn_scores_soft_cap`` (checked
    against the bridge's ``hook_attn_scores`` on a tiny random Gemma 2: equal to 5e-7);
    interleaved rotary pairs from ``cfg.rotary_adjacent_pairs`` (TransformerLens's name: the
    posmech engine sets it for GPT-J; TransformerLens 4.3's bridge leaves it false on GPT-J,
    whose rotation it does not expose as ``hook_cos``/``hook_sin`` either, so
    :meth:`ScoreFunction.prepare` refuses it)."""
    scheme = position_scheme(cfg)
    slopes = tuple(float(m) for m in alibi_slopes(int(cfg.n_heads))) if scheme == "alibi" else ()
    cap = getattr(cfg, "attn_scores_soft_cap", None)  # TransformerLens's name; -1: none
    return ScoreFunction(scheme, attn_scale(cfg), slopes,
                         float(cap) if isinstance(cap, (int, float)) and cap > 0 else None,
                         scheme == "rotary" and bool(getattr(cfg, "rotary_adjacent_pairs", False)))


def key_head(k: Any, h: int, n_heads: int) -> Any:
    """Query head ``h``'s keys from ``k [b, n, H_kv, d_head]`` of a model with ``n_heads``
    query heads: key head ``h // (n_heads / H_kv)`` (grouped-query attention; multi-query:
    the one key head; ``H_kv = n_heads``: head ``h``), as :meth:`ScoreFunction.prepare`
    repeats them."""
    n_kv = int(k.shape[2])
    if n_heads % n_kv:
        raise PosmechError(f"{n_heads} query heads cannot share {n_kv} key heads evenly")
    return k[:, :, h // (n_heads // n_kv)]


def qk_scores(q: Any, k: Any, scale: float) -> Any:
    """Raw scores from ``q [b, n_q, H, d_head]`` and ``k [b, n_k, H_kv, d_head]`` (torch):
    ``[b, H, n_q, n_k]`` float32, ``q·k / scale`` for every pair (grouped key heads are
    repeated): :class:`ScoreFunction` of a model with learned positions."""
    return ScoreFunction("learned", scale).full(q, k)


def offsets(window: int) -> np.ndarray:
    """Key offsets ``-window..window`` of a row window."""
    return np.arange(-window, window + 1)
