"""Contextual neurons in layer 0 (claims C1–C3, seed post 004, second half).

Builds on the layer-0 decomposition of :mod:`posmech.analyses.contextual.decomposition` (file
``layer0.h5``): the fixed-destination queries ``q_h(d, n)``, the positional keys, the
content keys, the measured LayerNorm scale ``s`` and every stored text's denominators
``Z_h(n)`` are read from it, never recomputed.

Definitions (layer 0, destination token fixed to ``d``, e.g. ``" the"``)
----------------------------------------------------------------------
* contextual heads ``C`` (K7's ``contextual`` class, or pinned in config);
* **calibration denominator** ``Z̄_h = median_{n ∈ [from, max_position]} Z_h(n)`` on one
  calibration text (one of ``layer0.h5``'s texts; config);
* **value circuits** with LayerNorm 1 linear at ``s``: content value
  ``cv_h(x) = (γ₁⊙ẽ(x)/s) W_V^h W_O^h`` and positional value
  ``pv_h(i) = ((γ₁⊙p̃_i/s + β₁) W_V^h + b_V^h) W_O^h`` ``[d_model]`` (``ẽ, p̃`` centred);
* **extended embedding** (C1) at the reference position ``n*``:
  ``E'(x) = Σ_{h∈C} exp κ_h(n*, x) / Z̄_h · cv_h(x)`` ``[V, d_model]`` with
  ``κ_h(n, x) = q_h(d, n)·kc_h(x)/σ_att`` (the content score);
* **token-contribution vector** of MLP neuron ``j`` (LayerNorm 2 linear at its measured scale
  ``s₂``, the median of ``blocks.0.ln2.hook_scale`` over the stored texts):
  ``TC_j(x) = (γ₂⊙(E'(x) − mean E'(x)) / s₂) · W_in[:, j]`` ``[V]``;
* **bag-of-tokens approximation** of the residual after layer-0 attention at position ``n``
  of a text ``x_0..x_T``:
  ``r̂(n) = e(x_n) + p_n + b_O + Σ_{h∈C} (1/Z̄_h) Σ_{i≤n} p_h(n, i) exp κ_h(n, x_i) (cv_h(x_i) + pv_h(i))
  + Σ_{h∉C} OV_h(LN₁(e(x_n) + p_n))`` — contextual heads with their positional pattern
  ``p_h(n, ·)`` of the fixed destination token and the calibration denominator, every other
  head attending only to the current token (its exact value through ``W_V, b_V, W_O``);
  the approximate pre-activation is ``â_j(n) = LN₂(r̂(n))·W_in[:, j] + b_in[j]`` with LN₂
  linear at ``s₂`` (``ln2: linear``, the post) or the real LayerNorm (``ln2: exact``).
  The **contextual term** of neuron ``j`` is the content part of the contextual heads,
  ``t_j(n) = Σ_{h∈C} (1/Z̄_h) Σ_i p_h(n, i) exp κ_h(n, x_i) (γ₂⊙centre(cv_h(x_i))/s₂)·W_in[:, j]``
  — at ``n = n*`` the decaying average ``Σ_i p(n, i) TC_j(x_i)`` of the post.
  When the real ``Z_h(n)`` equals ``Z̄_h``, LayerNorm 1 is exactly linear and the other
  heads attend only to the current token, ``r̂`` is the real residual and (``ln2: exact``)
  ``â`` the real ``blocks.0.mlp.hook_pre`` (tests check this on a hand-built model).

Rotary, ALiBi and no positional encoding (:class:`RelativeLayer0`)
----------------------------------------------------------------
No positional vector is in the residual stream: layer 0 reads ``e(x)`` alone (BLOOM: after its
embedding LayerNorm), so ``p_n`` above is absent and LayerNorm (RMSNorm) 1 is exact per token at
the token's own scale ``s₁(x)``: ``cv_h(x) = (γ₁⊙centre(e(x))/s₁(x)) W_V^h W_O^h`` and the
"positional" value ``pv_h(i) = (β₁ W_V^h + b_V^h) W_O^h``, the same at every ``i`` (``cv + pv`` is
the token's exact value). ``q_h(d, n)``, the positional and content keys are
layer0.h5's widened factors (:mod:`posmech.analyses.contextual.relative`): ``p_h`` is the
position-only input's pattern (destination token repeated), ``κ_h`` the token-only input's
score; every formula above then holds as written (docs/claims.md, C, "On every position scheme").

Every MLP layout (:mod:`posmech.models.mlp_layouts` reads them from the model's own weights)
-----------------------------------------------------------------------------------------------
* **The neuron** is a unit of the first MLP that reads layer 0's attention output, and its
  **pre-activation** ``a_j`` what that MLP's nonlinearity reads (``blocks.L.mlp.hook_pre``,
  :attr:`Layer0OV.hook`): ``x·W_in[:, j] + b_in[j]`` of a plain MLP (GPT-2, GPT-Neo, OPT,
  GPT-J, GPT-NeoX, Phi, Falcon, BLOOM, MPT; ``x`` the normalised residual); of a gated MLP
  (SwiGLU: Llama, Qwen2, Mistral; GeGLU: Gemma), whose activation is ``act(g_j)·u_j``, the
  **gate's** ``g_j = x·W_gate[:, j] + b_gate[j]``: C1's token contributions, C2's ranking and
  C3's fit read ``W_gate`` as ``W_in`` above. The up projection ``u_j`` is another linear read
  of the same ``x``, which the bag of tokens approximates in the same way; C1–C3 do not score it.
* **The norm in front of it** is LayerNorm (centred, as above) or RMSNorm (Llama, Qwen2,
  Mistral, Gemma: no centring; ``centre`` is the identity, ``TC_j(x) = (γ₂⊙E'(x)/s₂)·W_in[:, j]``
  with ``s₂`` the median RMS scale), read from the weights with its own scale and bias.
* **Sequential blocks** (GPT-2, GPT-Neo, OPT, Llama, Qwen2, Mistral, Gemma, BLOOM, MPT, GPT-NeoX
  without ``use_parallel_residual``, Falcon without ``parallel_attn``): the MLP is layer 0's
  and reads ``r̂`` above. **Parallel blocks** (GPT-J, GPT-NeoX, Phi, Falcon): layer 0's MLP
  reads the same normalised residual as layer 0's attention, ``LN(e(x_n) + p_n)``, never the
  heads' output, so it has no contextual term; the contextual neurons are then **layer 1's**
  MLP (``L = 1``), which reads ``r̂(n) + mlp₀(e(x_n) + p_n)``: the bag of tokens above plus
  layer 0's MLP output, a function of the current token and position only, entered exactly
  (:attr:`Layer0OV.embed_mlp`); a parallel layer 1 reads its own input only, so nothing else
  enters. Where the object is not there (a single parallel layer, a parallel layer 0 before a
  sequential layer 1) C1–C3 are not measurable with the reason
  (:class:`posmech.models.mlp_layouts.LayoutError`).
* **A normalised attention output** (Gemma 2's ``post_attention_layernorm``, an RMSNorm
  ``N_a(a) = γ_a⊙a/rms(a)`` of layer 0's whole attention output ``a`` before it is added to
  the residual, :attr:`Layer0OV.attn_norm`): the real residual is ``e(x_n) + N_a(a(n))``
  (exact: :func:`mlp_residual`, tested against Hugging Face's pre-activation), and the bag of
  tokens treats ``N_a`` as linear at its measured scale ``s_a`` (the median over the stored
  texts' positions ``≥ 1`` of ``blocks.0.ln1_post.hook_scale``, :func:`attn_norm_scale_median`),
  as it treats LayerNorm 2 at ``s₂``: every part of the attention output above (``b_O``, each
  head's ``cv`` and ``pv``, the other heads' values, hence ``E'`` and ``t_j``) is multiplied by
  ``γ_a/s_a`` (:meth:`Setup.out`). C3's fit carries the error of that linearisation (``rms(a)``
  is one number per position, shared by every head and attended token).

Shapes: ``H`` layer-0 heads, ``V`` vocabulary, ``d`` d_model, ``M`` d_mlp, ``T`` tokens.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from posmech.analyses import contextual as cx
from posmech.analyses.contextual.relative import RELATIVE_SCHEMES, Layer0Relative
from posmech.models import mlp_layouts as ml
from posmech.analyses.attention import head_name, parse_head
from posmech.core.errors import PosmechError

KIND = "extended_token_embeddings"
RULE = "extended_token_embeddings"


# --------------------------------------------------------------------------- weights
@dataclass
class Layer0OV:
    """Layer-0 value/output circuits and the MLP the contextual neurons are (float64).

    ``W_V [H, d, d_head]``, ``b_V [H, d_head]``, ``W_O [H, d_head, d]``, ``b_O [d]`` of layer
    0's heads (grouped key/value heads repeated to their query heads); ``ln2_w, ln2_b [d]``,
    ``ln2_eps``: the norm in front of the MLP (``ln2_rms``: an RMSNorm, not centred);
    ``W_in [d, M]``, ``b_in [M]``: the neurons' pre-activation (a gated MLP's gate,
    :attr:`posmech.models.mlp_layouts.MLP.W_pre`; ``gated`` says so); ``layer``: the block
    whose MLP that is (0; 1 when layer 0's block is parallel: the first MLP that reads layer
    0's attention output); ``embed_mlp``: for ``layer`` 1, layer 0's MLP output as a function
    of the residual before layer 0 ``[T, d] → [T, d]`` (it reads that residual only, so it is
    exact per token and position), else ``None``."""

    W_V: np.ndarray
    b_V: np.ndarray
    W_O: np.ndarray
    b_O: np.ndarray
    ln2_w: np.ndarray
    ln2_b: np.ndarray
    ln2_eps: float
    W_in: np.ndarray
    b_in: np.ndarray
    ln2_rms: bool = False
    gated: bool = False
    layer: int = 0
    embed_mlp: Callable[[np.ndarray], np.ndarray] | None = None
    #: Gemma 2's norm of layer 0's attention output before it is added (``post_attention_layernorm``,
    #: RMSNorm with scale ``1 + w``): ``None`` elsewhere
    attn_norm: ml.Norm | None = None

    def attention_output(self, x: np.ndarray, patterns: np.ndarray) -> np.ndarray:
        """What layer 0's attention adds to the residual ``[T, d]``: ``b_O + Σ_h A_h (x W_V^h +
        b_V^h) W_O^h`` for normalised inputs ``x [T, d]`` and patterns ``[H, T, T]``, normalised
        by :attr:`attn_norm` where the model has one (exact)."""
        out = self.b_O + sum(patterns[h] @ self.ov(h, x) for h in range(self.W_V.shape[0]))
        return self.attn_norm(out) if self.attn_norm is not None else out

    def attn_norm_scale(self, x: np.ndarray, patterns: np.ndarray) -> np.ndarray:
        """``blocks.0.ln1_post.hook_scale`` ``[T]``: the RMS of the attention output before
        :attr:`attn_norm` (``sqrt(mean a² + eps)``)."""
        if self.attn_norm is None:
            raise PosmechError("layer 0's attention output is not normalised: no ln1_post scale")
        out = self.b_O + sum(patterns[h] @ self.ov(h, x) for h in range(self.W_V.shape[0]))
        return self.attn_norm.scale(out)

    def attn_gain(self, s_a: float) -> np.ndarray | float:
        """The factor of a linear attention output ``[d]``: ``γ_a / s_a`` (:attr:`attn_norm`
        treated as linear at its measured scale ``s_a``), 1 without that norm."""
        return 1.0 if self.attn_norm is None else self.attn_norm.w / s_a

    @property
    def d_mlp(self) -> int:
        return int(self.W_in.shape[1])

    @property
    def d_model(self) -> int:
        return int(self.W_O.shape[-1])

    @property
    def hook(self) -> str:
        """The hook of the neurons' real pre-activation (the gate's for a gated MLP)."""
        return f"blocks.{self.layer}.mlp.hook_pre"

    def ov(self, h: int, x: np.ndarray, bias: bool = True) -> np.ndarray:
        """``(x W_V^h + b_V^h) W_O^h`` ``[T, d]`` for post-LN inputs ``x [T, d]``."""
        v = x @ self.W_V[h] + (self.b_V[h] if bias else 0.0)
        return v @ self.W_O[h]

    def centre(self, r: np.ndarray) -> np.ndarray:
        """What the MLP's norm subtracts: the mean over the last axis (LayerNorm), nothing (RMSNorm)."""
        return r if self.ln2_rms else r - r.mean(axis=-1, keepdims=True)

    def ln2(self, r: np.ndarray) -> np.ndarray:
        """The real norm in front of the MLP ``[T, d]``."""
        return self.centre(r) / self.ln2_scale(r)[..., None] * self.ln2_w + self.ln2_b

    def ln2_scale(self, r: np.ndarray) -> np.ndarray:
        """That norm's ``hook_scale`` ``[T]`` (``blocks.{layer}.ln2.hook_scale``)."""
        return np.sqrt(np.square(self.centre(r)).mean(axis=-1) + self.ln2_eps)

    def ln2_linear(self, r: np.ndarray, s2: float, bias: bool = True) -> np.ndarray:
        """That norm treated as linear at scale ``s2`` ``[T, d]``."""
        return self.centre(r) / s2 * self.ln2_w + (self.ln2_b if bias else 0.0)


def no_mlp_error(name: str) -> PosmechError:
    return PosmechError(f"model {name!r} has no MLP in layer 0 (attention-only): contextual neurons need one; "
                        "remove it from `neurons.models`")


#: why C1-C3 are not measurable on a parallel block with a normalised attention output
NORMED_ATTENTION = ("layer 0's block is parallel and normalises its attention output before adding it: the bag "
                    "of tokens is defined for a normalised attention output (Gemma 2's post_attention_layernorm, "
                    "linear at its measured scale) in a sequential block only")


def ov_from_blocks(b0: ml.Block, b1: ml.Block | None, name: str = "model") -> Layer0OV:
    """:class:`Layer0OV` of blocks 0 and 1 read by :func:`posmech.models.mlp_layouts.read_block`.

    Sequential block 0: its MLP (norm ``ln_mlp``, the gate of a gated MLP). Parallel block 0
    (GPT-J, GPT-NeoX, Phi, Falcon): its MLP reads the residual before layer 0's attention,
    never that attention's output, so the contextual neurons are block 1's MLP, which reads
    ``r + attn₀ + mlp₀`` (block 1 parallel: its input; sequential: plus its own attention,
    which the bag of tokens does not model: :class:`~posmech.models.mlp_layouts.LayoutError`);
    ``mlp₀`` reads ``r`` only and enters exactly (``embed_mlp``). A sequential block's norm of its
    attention output (Gemma 2) is kept (``attn_norm``); in a parallel block it is a
    :class:`~posmech.models.mlp_layouts.LayoutError` (:data:`NORMED_ATTENTION`)."""
    if b0.attn_out_norm is not None and b0.parallel:
        raise ml.LayoutError(NORMED_ATTENTION)
    if b0.mlp is None or b0.ln_mlp is None:
        raise no_mlp_error(name)
    reader, embed_mlp = b0, None
    if b0.parallel:
        if b1 is None or b1.mlp is None or b1.ln_mlp is None:
            raise ml.LayoutError("layer 0's block is parallel (its MLP reads the residual before layer 0's "
                                 "attention) and no layer-1 MLP reads layer 0's attention output")
        if not b1.parallel:
            raise ml.LayoutError("layer 0's block is parallel and layer 1's sequential: layer 1's MLP also reads "
                                 "layer 1's attention, which the bag of tokens does not model")
        if b1.attn_out_norm is not None:
            raise ml.LayoutError(NORMED_ATTENTION)
        mlp0, ln0 = b0.mlp, b0.ln_mlp
        reader, embed_mlp = b1, lambda r: mlp0.out(ln0(r))
    mlp, norm = reader.mlp, reader.ln_mlp
    assert mlp is not None and norm is not None
    return Layer0OV(b0.W_V, b0.b_V, b0.W_O, b0.b_O, norm.w, norm.b, norm.eps, mlp.W_pre, mlp.b_pre,
                    ln2_rms=norm.rms, gated=mlp.gated, layer=1 if b0.parallel else 0, embed_mlp=embed_mlp,
                    attn_norm=b0.attn_out_norm)


def ov_from_hf(model: Any, name: str = "model") -> Layer0OV:
    """:class:`Layer0OV` of a Hugging Face model or of its directory's
    :class:`posmech.models.loading.WeightView`, read from its own weights in any layout of
    :mod:`posmech.models.mlp_layouts` (GPT-2, GPT-Neo, OPT, GPT-J, GPT-NeoX, Llama, Qwen2,
    Mistral, Gemma, Phi, Falcon, BLOOM, MPT): :func:`ov_from_blocks` of blocks 0 and 1. A
    layout it cannot read: :class:`~posmech.models.mlp_layouts.LayoutError` with the reason."""
    return ov_from_blocks(*blocks_from_hf(model, name), name)


def blocks_from_hf(model: Any, name: str = "model") -> tuple[ml.Block, ml.Block | None]:
    """Blocks 0 and 1 (``None`` unless block 0 is parallel) of a Hugging Face model or of its
    directory's :class:`posmech.models.loading.WeightView`, read by
    :func:`posmech.models.mlp_layouts.read_block`; no MLP in block 0: an error."""
    cfg = model.config.to_dict()
    if callable(getattr(model, "state_dict", None)):  # a torch model: its parameter names as the checkpoint's files hold them
        sd = {k.removeprefix("transformer."): v for k, v in model.state_dict().items()}
        get, names = sd.get, frozenset(sd)
    else:
        get, names = model._get, model._keys
    b0 = ml.read_block(get, names, cfg, 0)
    if b0.mlp is None:
        raise no_mlp_error(name)
    b1 = ml.read_block(get, names, cfg, 1) if b0.parallel and ml.find_layout(names, 1) is not None else None
    return b0, b1


def ov_from_tl(state: dict[str, Any], cfg: dict[str, Any], name: str = "model") -> Layer0OV:
    """:class:`Layer0OV` of a legacy TransformerLens checkpoint (``blocks.0.attn.W_V/W_O``,
    ``blocks.0.ln2.w/b``, ``blocks.0.mlp.W_in/b_in``); attention-only: a clear error."""
    if cfg.get("attn_only") or "blocks.0.mlp.W_in" not in state:
        raise no_mlp_error(name)
    get = lambda k: np.asarray(state[k], dtype=np.float64)  # noqa: E731
    d = int(cfg["d_model"])
    opt = lambda k, n: get(k) if k in state else np.full(n, 1.0 if k.endswith(".w") else 0.0)  # noqa: E731
    H, dh = get("blocks.0.attn.W_V").shape[0], get("blocks.0.attn.W_V").shape[2]
    b_V = get("blocks.0.attn.b_V") if "blocks.0.attn.b_V" in state else np.zeros((H, dh))
    return Layer0OV(get("blocks.0.attn.W_V"), b_V, get("blocks.0.attn.W_O"), opt("blocks.0.attn.b_O", d),
                    opt("blocks.0.ln2.w", d), opt("blocks.0.ln2.b", d), float(cfg.get("eps", 1e-5)),
                    get("blocks.0.mlp.W_in"), opt("blocks.0.mlp.b_in", int(cfg["d_mlp"])))


def load_weights(manifest: dict[str, Any], name: str, tokenizer: bool = True, entry: dict[str, Any] | None = None,
                 model: Any = None) -> tuple[cx.Layer0Weights | RelativeLayer0, Layer0OV, Any]:
    """Layer-0 query/key weights, the value/MLP weights and the tokenizer (``None`` when
    ``tokenizer`` is false) of a configured model. Learned positions: read from its files (no
    model is built, :class:`posmech.analyses.contextual.Layer0Weights`). Rotary, ALiBi or no
    positional encoding (the manifest's architecture): :class:`RelativeLayer0` of the model
    (``model``, or loaded with ``entry``'s ``device``, ``dtype``, ``processing``, ``engine``)."""
    from posmech.models.architecture import architecture
    from posmech.models.loading import is_tl_legacy_dir, load_tokenizer, verify_weights, weight_view

    hf_dir = Path(manifest["hf_dir"])
    verify_weights(manifest)
    cfg = json.loads((hf_dir / "config.json").read_text())
    if is_tl_legacy_dir(hf_dir):
        if cfg.get("attn_only"):
            raise no_mlp_error(name)
        from safetensors.numpy import load_file

        w, tok = cx.load_weights(manifest, name, tokenizer)
        return w, ov_from_tl(load_file(str(hf_dir / "model.safetensors")), cfg, name), tok
    view = weight_view(manifest)
    b0, b1 = blocks_from_hf(view, name)
    ov = ov_from_blocks(b0, b1, name)  # first: a layout without the object is a LayoutError, its reason
    tok = load_tokenizer(hf_dir) if tokenizer else None
    scheme = (manifest.get("architecture") or {}).get("positions") or architecture(cfg, f"model {name!r}").positions
    if scheme in RELATIVE_SCHEMES:
        from posmech.models.loading import analysis_context, load_model

        e = entry or {}
        if model is None:
            model = load_model(manifest, e.get("device", "cpu"), e.get("dtype", "float32"),
                               e.get("processing", "compatibility"), e.get("engine", "auto"))
        return relative_layer0(model, b0.ln1, name, analysis_context(name, e, hf_dir)), ov, tok
    cx.refuse_unsupported(cfg, name, "neurons.models")
    return cx.weights_from_hf(view, name), ov, tok


@dataclass
class RelativeLayer0:
    """Layer 0 of a rotary, ALiBi or position-free model as the contextual neurons read it
    (module docstring, "Rotary, ALiBi and no positional encoding"): the residual before layer
    0 is the token's own vector ``e(x)`` (``blocks.0.hook_resid_pre`` of a one-token forward;
    BLOOM: after its embedding LayerNorm; no position is added to it), layer 0's norm ``ln1``
    is exact per token, and the scores are those of ``rel``
    (:class:`posmech.analyses.contextual.relative.Layer0Relative`, whose widened factors
    give the exact score as one dot product). ``embed(ids) → [U, d]``: ``e`` of tokens."""

    rel: Layer0Relative
    embed: Callable[[np.ndarray], np.ndarray]
    ln1: ml.Norm
    _cache: dict[int, np.ndarray] = field(default_factory=dict, repr=False)

    @property
    def n_heads(self) -> int:
        return self.rel.n_heads

    @property
    def d_vocab(self) -> int:
        return self.rel.d_vocab

    @property
    def attn_scale(self) -> float:
        return self.rel.attn_scale

    def resid(self, ids: np.ndarray, pos: np.ndarray | None = None) -> np.ndarray:
        """``e(x)`` ``[T, d]`` of tokens ``ids`` (the same at every position; each token read once)."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        new = np.array(sorted(set(ids.tolist()) - set(self._cache)), dtype=np.int64)
        for a in range(0, len(new), 4096):
            chunk = new[a : a + 4096]
            for t, v in zip(chunk.tolist(), self.embed(chunk)):
                self._cache[t] = np.asarray(v, dtype=np.float64)
        return np.stack([self._cache[t] for t in ids.tolist()]) if len(ids) else np.zeros((0, len(self.ln1.w)))

    def ln(self, ids: np.ndarray, pos: np.ndarray | None = None) -> np.ndarray:
        """What layer 0's heads read ``[T, d]``: ``ln1(e(x))``, exact."""
        return self.ln1(self.resid(ids))

    def queries(self, ids: np.ndarray, pos: np.ndarray) -> np.ndarray:
        return self.rel.queries(ids, pos)

    def exact_keys(self, ids: np.ndarray, pos: np.ndarray) -> np.ndarray:
        return self.rel.exact_keys(ids, pos)

    def content_input(self, ids: np.ndarray) -> np.ndarray:
        """``γ₁⊙centre(e(x))/s₁(x)`` ``[U, d]``: ``ln1(e(x))`` without its bias, at each token's own scale."""
        e = self.resid(ids)
        return self.ln1.centre(e) / self.ln1.scale(e)[:, None] * self.ln1.w

    def constant_input(self, T: int) -> np.ndarray:
        """``β₁`` at ``T`` positions ``[T, d]``: the part of ``ln1(e(x))`` that is the same for every token."""
        return np.broadcast_to(self.ln1.b, (T, len(self.ln1.b)))


def token_residuals(model: Any) -> Callable[[np.ndarray], np.ndarray]:
    """``ids → e [U, d]`` (float64): ``blocks.0.hook_resid_pre`` of one-token forward passes
    of a loaded model (the posmech engine or a TransformerBridge), as
    :func:`posmech.analyses.contextual.relative.relative_from_model` reads ``hook_q``/``hook_k``."""
    import torch

    dev = getattr(model.cfg, "device", "cpu")

    def embed(ids: np.ndarray) -> np.ndarray:
        got: dict[str, Any] = {}

        def keep(t: Any, hook: Any) -> None:
            got["r"] = t.detach().to("cpu", torch.float64)

        x = torch.as_tensor(np.asarray(ids, dtype=np.int64)[:, None], device=dev)
        with torch.inference_mode(), model.hooks(fwd_hooks=[("blocks.0.hook_resid_pre", keep)]):
            model(x, return_type=None)
        return got["r"][:, 0].numpy()

    return embed


def relative_layer0(model: Any, ln1: ml.Norm, name: str = "model", n_ctx: int | None = None) -> RelativeLayer0:
    """:class:`RelativeLayer0` of a loaded rotary, ALiBi or position-free model and its layer-0
    norm ``ln1`` (:func:`posmech.models.mlp_layouts.read_block`'s, from the checkpoint)."""
    from posmech.analyses.contextual.relative import relative_from_model

    return RelativeLayer0(relative_from_model(model, name, n_ctx), token_residuals(model), ln1)


# --------------------------------------------------------------------------- per-text memo
#: per process, the per-text arrays the neurons family's analyses each compute on the same
#: texts of layer0.h5 (the exact layer-0 residual: the LN2 scale of C1 and the real
#: pre-activations of C2; the bag-of-tokens sums: C2's contextual term and C3's approximation),
#: computed once in a job that runs them in turn (:func:`memoised`); at most :data:`MEMO_BYTES`
#: of arrays (gpt2's six texts of 1024 tokens: ~110 MB), the oldest dropped first (then recomputed)
_MEMO: dict[tuple, Any] = {}
MEMO_BYTES = 512 * 2**20


def files_key(*paths: str | os.PathLike[str]) -> tuple:
    """``(real path, mtime_ns, size)`` of each file (of each file in a folder): a memo key that
    changes when a file is rewritten."""
    out = []
    for p in paths:
        p = Path(p).resolve()
        for f in sorted(p.iterdir()) if p.is_dir() else [p]:
            st = f.stat()
            out.append((str(f), st.st_mtime_ns, st.st_size))
    return tuple(out)


def weights_key(manifest: dict[str, Any], name: str, entry: dict[str, Any] | None) -> tuple:
    """The memo key of :func:`load_weights`' result for this model: its files and the entry
    (device, dtype, processing, engine) it is loaded with; the same in every analysis of a job."""
    return (name, json.dumps(entry or {}, sort_keys=True, default=str), files_key(manifest["hf_dir"]))


def memoised(key: tuple | None, compute: Callable[[], Any]) -> Any:
    """``compute()``, or (``key`` not None) its value stored under ``key`` by an earlier call in
    this process; its arrays are made read-only (a caller that wrote to one would change it for
    every later reader: it raises instead)."""
    if key is None:
        return compute()
    if key in _MEMO:
        return _MEMO[key]
    value = compute()
    arrays = [a for a in (value if isinstance(value, tuple) else (value,)) if isinstance(a, np.ndarray)]
    for a in arrays:
        a.flags.writeable = False
    size = sum(a.nbytes for a in arrays)
    while _MEMO and _memo_bytes() + size > MEMO_BYTES:
        _MEMO.pop(next(iter(_MEMO)))
    if size <= MEMO_BYTES:
        _MEMO[key] = value
    return value


def _memo_bytes() -> int:
    return sum(a.nbytes for v in _MEMO.values() for a in (v if isinstance(v, tuple) else (v,))
               if isinstance(a, np.ndarray))


def text_key(memo: tuple | None, what: str, ids: np.ndarray) -> tuple | None:
    """``memo`` (:func:`weights_key`, extended by :func:`setup_from_artifact`) for ``what`` of
    text ``ids``; None (no memo) when ``memo`` is."""
    return None if memo is None else (what, memo, np.asarray(ids, dtype=np.int64).tobytes())


# --------------------------------------------------------------------------- exact layer 0
def layer0_residual(w: cx.Layer0Weights | RelativeLayer0, ov: Layer0OV, ids: np.ndarray,
                    memo: tuple | None = None) -> np.ndarray:
    """The real residual the contextual neurons' MLP reads, of text ``ids [T]`` from position 0,
    in float64 from the weights ``[T, d]``: after layer-0 attention (``blocks.0.hook_resid_mid``),
    plus layer 0's MLP output when that block is parallel (``blocks.1.hook_resid_pre``).
    ``memo`` (:func:`weights_key` of ``w, ov``): computed once per text in this process
    (read-only)."""
    return memoised(text_key(memo, "layer0_residual", ids), lambda: _layer0_residual(w, ov, ids))


def _layer0_residual(w: cx.Layer0Weights | RelativeLayer0, ov: Layer0OV, ids: np.ndarray) -> np.ndarray:
    ids = np.asarray(ids, dtype=np.int64)
    T = len(ids)
    pos = np.arange(T)
    r = w.resid(ids, pos)
    x = w.ln(ids, pos)
    return mlp_residual(ov, r, x, layer0_patterns(w, ids))


def layer0_patterns(w: cx.Layer0Weights | RelativeLayer0, ids: np.ndarray) -> np.ndarray:
    """Layer 0's real attention patterns ``[H, T, T]`` of text ``ids`` from position 0: its exact
    scores, soft-capped and over the keys its sliding window leaves where the model does so
    (Gemma 2: :attr:`~posmech.analyses.contextual.relative.Layer0Relative.window`, ``softcap``)."""
    ids = np.asarray(ids, dtype=np.int64)
    T = len(ids)
    pos = np.arange(T)
    q, k = w.queries(ids, pos), w.exact_keys(ids, pos)
    scores = q @ k.transpose(0, 2, 1) / w.attn_scale  # [H, T, T]
    rel = getattr(w, "rel", None)
    cap = getattr(rel, "softcap", None)
    if cap:
        scores = cap * np.tanh(scores / cap)
    scores = np.where(cx.visible_keys(pos, T, int(getattr(rel, "window", 0) or 0)), scores, -np.inf)
    return cx.softmax(scores)


def mlp_residual(ov: Layer0OV, r: np.ndarray, x: np.ndarray, patterns: np.ndarray) -> np.ndarray:
    """The residual the contextual neurons' MLP reads ``[T, d]`` from the residual before
    layer 0 ``r [T, d]``, its normalisation ``x [T, d]`` (what layer 0's heads read) and
    layer 0's attention ``patterns [H, T, T]``: ``r + b_O + Σ_h A_h (x W_V^h + b_V^h) W_O^h``,
    plus ``mlp₀(r)`` when layer 0's block is parallel (:attr:`Layer0OV.embed_mlp`)."""
    return r + ov.attention_output(x, patterns) + (ov.embed_mlp(r) if ov.embed_mlp is not None else 0.0)


def hook_pre(w: cx.Layer0Weights | RelativeLayer0, ov: Layer0OV, ids: np.ndarray,
             memo: tuple | None = None) -> np.ndarray:
    """The neurons' real pre-activation (``ov.hook``: ``blocks.0.mlp.hook_pre``, the gate's of a
    gated MLP) of text ``ids`` from the weights ``[T, M]`` (``memo``: :func:`layer0_residual`)."""
    return ov.ln2(layer0_residual(w, ov, ids, memo)) @ ov.W_in + ov.b_in


# --------------------------------------------------------------------------- inputs
def select_heads(classes: pd.DataFrame, pinned: Sequence[str] | None, use_classes: Sequence[str],
                 n_heads: int) -> list[int]:
    """Layer-0 heads of the bag of tokens: ``pinned`` names (``neurons.heads``) or every
    head whose K7 class is in ``use_classes`` (``neurons.head_classes``); none is an error."""
    if pinned:
        heads = []
        for name in pinned:
            layer, h = parse_head(name, "neurons.heads")
            if layer != 0 or not 0 <= h < n_heads:
                raise PosmechError(f"config key `neurons.heads`: {name!r} is not a layer-0 head of this model "
                                   f"(L0H0..L0H{n_heads - 1})")
            heads.append(h)
        return sorted(set(heads))
    heads = sorted(int(h) for h, c in zip(classes["head"], classes["head_class"]) if c in set(use_classes))
    if not heads:
        found = ", ".join(f"{n}: {c}" for n, c in zip(classes["head_name"], classes["head_class"]))
        raise PosmechError(f"config key `neurons.head_classes`: no layer-0 head is in {list(use_classes)} ({found}); "
                           "add a class there or pin heads in `neurons.heads`")
    return heads


def missing_heads(classes: pd.DataFrame, pinned: Sequence[str] | None, use_classes: Sequence[str]) -> str | None:
    """Why the bag of tokens has no head on this model (no head pinned and none of the K7
    classes ``use_classes``), in words; ``None`` when it has one.  The C rules then write
    their tables empty and C1-C3 are not measurable, instead of failing the run."""
    if pinned or any(c in set(use_classes) for c in classes["head_class"]):
        return None
    found = ", ".join(f"{n}: {c}" for n, c in zip(classes["head_name"], classes["head_class"]))
    return f"no broad layer-0 head: none is in neurons.head_classes {list(use_classes)} (K7 classes {found})"


def write_not_measurable(path: str | os.PathLike[str], why: str, attrs: dict[str, Any]) -> None:
    """``extended_tokens.h5`` of a model without a head for the bag of tokens: no datasets,
    the reason in the attribute ``not_measurable`` (:func:`not_measurable`)."""
    from posmech.store.hdf5 import artifact_writer

    with artifact_writer(path, KIND, RULE, {**attrs, "heads": [], "not_measurable": why}):
        pass


def not_measurable(path: str | os.PathLike[str]) -> str | None:
    """The reason an ``extended_tokens.h5`` holds nothing (:func:`write_not_measurable`), or ``None``."""
    from posmech.store.hdf5 import attr_json, open_artifact

    with open_artifact(path, KIND) as f:
        return attr_json(f, "not_measurable") if "not_measurable" in f.attrs else None


#: why C2 and C3 are not measurable when no neuron's real pre-activation varies (e.g. a model
#: whose layer-0 MLP input weights are zero: it has the modules but they read nothing)
CONSTANT_PRE = ("the real pre-activation (blocks.0.mlp.hook_pre) of every neuron is constant along the texts "
                "(the layer-0 MLP reads nothing that varies, e.g. zero input weights): the variance explained "
                "and Pearson r are undefined")


def best_explained_row(ranking: pd.DataFrame, model: str, artifact: str) -> dict[str, Any]:
    """C2's finding row ``best_explained_variance``: the best-ranked neuron's variance explained
    by the contextual term (:func:`neuron_ranking`)."""
    row = {"claim": "C2", "model": model, "quantity": "best_explained_variance", "artifact": artifact}
    best = float(ranking["explained"].iloc[0])
    if not np.isfinite(best):  # the ranking sorts undefined fractions last: every neuron's is
        return {**row, "value": None, "detail": CONSTANT_PRE}
    return {**row, "value": best, "detail": f"neuron {int(ranking['neuron'].iloc[0])}: 1 - Var(a - t) / Var(a), "
            "a = its real pre-activation, t = the contextual term"}


C1_QUANTITIES = ("extended_embeddings", "ln2_scale_range")
C2_QUANTITIES = ("top_tokens", "best_explained_neurons", "best_explained_variance")
C3_QUANTITIES = ("median_pearson_r", "median_sign_agreement", "median_fvu")
POST_NEURONS = (300, 1621, 1710)  # the post's C2 neurons (gpt2)


def extended_scorecard(st: Setup, ln2: dict[str, Any], d_vocab: int, d_model: int, d_mlp: int,
                       heads: Sequence[int], from_position: int, title: str, model: str,
                       artifact: str, vocabulary: bool = True) -> list[dict[str, Any]]:
    """C1's scorecard rows for the stored extended embeddings (rule extended_token_embeddings).

    * ``extended_embeddings`` — the word ``stored``; its detail names the shapes of ``E'``
      ``[V x d_model]`` and of the token contributions ``[V x d_mlp]``, the heads used and
      their calibration denominators ``Z̄_h`` (median over ``n >= from_position`` of the
      calibration text ``title``);
    * ``ln2_scale_range`` — the 5th and 95th percentiles of ``blocks.0.ln2.hook_scale`` over
      the stored texts' positions (``ln2``: :func:`ln2_scale_summary`); the detail gives the
      scale ``s₂`` at which LayerNorm 2 is treated as linear.

    ``vocabulary`` false (a twin's null, :func:`write_extended`): ``extended_embeddings`` is
    the words ``not computed`` and its detail says why (:data:`NO_VOCABULARY`)."""
    names = [head_name(0, h) for h in heads]
    z = {head_name(0, h): round(float(st.z_bar[h]), 4) for h in heads}
    setup = f"through heads {names} (Z̄ {z}, median over n >= {from_position} of {title!r})"
    rows = [{"claim": "C1", "quantity": "extended_embeddings", "value": "stored" if vocabulary else "not computed",
             "detail": f"E' [{d_vocab} x {d_model}] {setup}; token contributions [{d_vocab} x {d_mlp}] float16"
             if vocabulary else f"E' and token contributions {NO_VOCABULARY}; setup {setup}",
             "artifact": artifact},
            {"claim": "C1", "quantity": "ln2_scale_range", "value": [round(ln2["p05"], 4), round(ln2["p95"], 4)],
             "detail": f"5th and 95th percentiles of blocks.{st.ov.layer}.ln2.hook_scale (the norm in front of the "
             f"neurons' MLP{', an RMSNorm' if st.ov.ln2_rms else ''}) over {ln2['n_tokens']} positions of "
             f"layer0.h5's texts; LN2 treated as linear at s2 = {st.s2:.4f}", "artifact": artifact}]
    return [{**r, "model": model} for r in rows]


def contextual_scorecard(df: pd.DataFrame, ranking: pd.DataFrame, neurons: Sequence[int], model: str,
                         table: str, ranking_path: str, vocabulary: bool = True) -> list[dict[str, Any]]:
    """C2's scorecard rows from the top/bottom tokens ``df`` (:func:`top_tokens`) and the
    neuron ``ranking`` (:func:`neuron_ranking`).

    * ``top_tokens`` — the word ``table``; the detail lists each chosen neuron's five most
      positive (+) and most negative (−) contributing tokens;
    * ``best_explained_neurons`` — the five neurons whose pre-activation variance the
      contextual term explains best, best first (the detail gives each fraction explained);
    * ``best_explained_variance`` — :func:`best_explained_row`;
    * ``post_neurons_rank_percent`` (only when the model has neurons 300, 1621 and 1710, the
      post's) — the largest of their ranks by explained variance, in percent of all neurons.

    ``vocabulary`` false (a twin's null: no token contribution computed, :func:`write_extended`):
    ``top_tokens`` is the words ``not computed`` and its detail says why."""
    tops = ("; ".join(f"{j}: +{df[(df.neuron == j) & (df.side == 'top')]['token'].head(5).tolist()} "
                      f"-{df[(df.neuron == j) & (df.side == 'bottom')]['token'].head(5).tolist()}" for j in neurons)
            if vocabulary else f"the token contributions are {NO_VOCABULARY}")
    rows = [{"claim": "C2", "quantity": "top_tokens", "value": "table" if vocabulary else "not computed",
             "detail": tops, "artifact": table},
            {"claim": "C2", "quantity": "best_explained_neurons", "value": [int(j) for j in ranking["neuron"][:5]],
             "detail": "explained " + ", ".join(f"{e:.2f}" for e in ranking["explained"][:5]),
             "artifact": ranking_path},
            best_explained_row(ranking, model, ranking_path)]
    M = len(ranking)
    post = [j for j in POST_NEURONS if j < M]
    if len(post) == len(POST_NEURONS):
        worst = max(100.0 * int(ranking.loc[ranking["neuron"] == j, "rank"].iloc[0]) / M for j in post)
        rows.append({"claim": "C2", "quantity": "post_neurons_rank_percent", "value": round(worst, 2),
                     "detail": "largest rank (in % of all neurons, by explained variance) of neurons 300, 1621, "
                     "1710", "artifact": ranking_path})
    return [{**r, "model": model} for r in rows]


def fit_scorecard(df: pd.DataFrame, from_position: int, model: str, artifact: str) -> list[dict[str, Any]]:
    """C3's scorecard rows from the per (neuron, text) fit table ``df`` (:func:`fit_metrics`
    columns ``neuron, pearson_r, sign_agreement, fvu``), positions ``n >= from_position``.

    * ``median_pearson_r`` — the smallest over neurons of the median over texts of the Pearson
      correlation of the real and the bag-of-tokens pre-activation;
    * ``median_sign_agreement`` — the smallest over neurons of the median over texts of the
      fraction of positions where both have the same sign;
    * ``median_fvu`` — the median over neurons and texts of the fraction of variance
      unexplained."""
    med = df.groupby("neuron")[["pearson_r", "sign_agreement", "fvu"]].median()
    constant = [int(j) for j, r in med["pearson_r"].items() if not np.isfinite(r)]
    measured = med["pearson_r"].drop(constant)
    if measured.empty:
        r_row = {"value": None, "detail": CONSTANT_PRE}
    else:
        r_row = {"value": round(float(measured.min()), 4),
                 "detail": "smallest over neurons of the median over texts of Pearson r (positions n >= "
                 f"{from_position}): " + ", ".join(f"{j}: {r:.3f}" for j, r in measured.items())
                 + (f"; neurons {constant} left out: their real pre-activation is constant along every text"
                    if constant else "")}
    fvu = float(np.nanmedian(df["fvu"])) if np.isfinite(df["fvu"]).any() else None
    rows = [{"claim": "C3", "quantity": "median_pearson_r", **r_row, "artifact": artifact},
            {"claim": "C3", "quantity": "median_sign_agreement", "value": round(float(med["sign_agreement"].min()), 4),
             "detail": "smallest over neurons of the median over texts of the sign agreement: "
             + ", ".join(f"{j}: {r:.3f}" for j, r in med["sign_agreement"].items()), "artifact": artifact},
            {"claim": "C3", "quantity": "median_fvu", "value": None if fvu is None else round(fvu, 4),
             "detail": "median over neurons and texts of the fraction of variance unexplained (texts where the "
             "real pre-activation is constant left out)" if fvu is not None else CONSTANT_PRE, "artifact": artifact}]
    return [{**r, "model": model} for r in rows]


def check_neurons(neurons: Sequence[int], d_mlp: int, model: str) -> list[int]:
    """Neuron indices within ``0..d_mlp−1``, else an error naming ``neurons.neurons``."""
    bad = [int(j) for j in neurons if not 0 <= int(j) < d_mlp]
    if bad:
        raise PosmechError(f"config key `neurons.neurons` (model {model}): neuron(s) {bad} beyond the layer-0 MLP "
                           f"(d_mlp = {d_mlp}: indices 0..{d_mlp - 1}); lower them")
    return [int(j) for j in neurons]


def calibration_index(dec: cx.Layer0File, heads: Sequence[int], text: str | int | None, from_n: int) -> int:
    """The calibration text among ``layer0.h5``'s texts: ``text`` = its title or index
    (``neurons.calibration_text``), or None: the **typical** text — the one whose median
    ``log Z`` over positions ``≥ from_n`` (mean over ``heads``) is the median across texts."""
    n = len(dec.texts)
    if n == 0:
        raise PosmechError("layer0.h5 stores no texts: nothing to calibrate the denominators on")
    if isinstance(text, str):
        if not text.strip():
            raise PosmechError("config key `neurons.calibration_text`: empty; give a title of a stored text "
                               f"({list(dec.texts['title'])}), its index, or null for the typical text")
        hits = np.flatnonzero(dec.texts["title"].to_numpy() == text)
        if not len(hits):
            raise PosmechError(f"config key `neurons.calibration_text`: {text!r} is none of the stored texts "
                               f"{list(dec.texts['title'])}")
        return int(hits[0])
    if text is not None:
        if not 0 <= int(text) < n:
            raise PosmechError(f"config key `neurons.calibration_text`: index {text} outside 0..{n - 1}")
        return int(text)
    sel = calibration_positions(dec, from_n)
    med = np.median(dec.log_z_linear[:, heads][:, :, sel], axis=2).mean(axis=1)  # [texts]
    return int(np.argsort(med)[(n - 1) // 2])


def calibration_positions(dec: cx.Layer0File, from_n: int) -> np.ndarray:
    """Mask of the stored destination positions ``n ≥ from_n``; empty: an error."""
    sel = dec.positions >= from_n
    if not sel.any():
        raise PosmechError(f"config key `neurons.from_position`: {from_n} leaves no destination position of the "
                           f"calibration text (stored positions {int(dec.positions[0])}..{int(dec.positions[-1])}): "
                           "the median over an empty calibration text is undefined; lower it")
    return sel


def calibration_denominators(dec: cx.Layer0File, text: int, from_n: int) -> np.ndarray:
    """``Z̄_h`` ``[H]`` (every head): the median over stored positions ``n ≥ from_n`` of the
    stored linear-LN denominator ``Z_h(n)`` of text ``text``."""
    return np.median(np.exp(dec.log_z_linear[text][:, calibration_positions(dec, from_n)]), axis=1)


# --------------------------------------------------------------------------- C1
@dataclass
class Setup:
    """Everything the approximation needs, from ``layer0.h5`` and the weights.

    ``heads`` (contextual heads), ``z_bar [H]``, ``s`` (LN1 scale), ``s2`` (LN2 scale),
    ``query [H, P, d_head]`` (fixed destination), ``positional_key [H, P, d_head]``,
    ``attn_scale``, ``n_ref`` (reference position of the extended embeddings), ``s_a``: the
    scale at which Gemma 2's norm of the attention output is treated as linear (1 without it)."""

    w: cx.Layer0Weights | RelativeLayer0
    ov: Layer0OV
    heads: list[int]
    z_bar: np.ndarray
    s: float
    s2: float
    query: np.ndarray
    positional_key: np.ndarray
    attn_scale: float
    n_ref: int
    s_a: float = 1.0
    #: the memo key of this setup's per-text bag-of-tokens sums (:func:`setup_from_artifact`), or None
    memo: tuple | None = None

    def out(self, a: np.ndarray) -> np.ndarray:
        """A part ``a [.., d]`` of layer 0's attention output as the residual receives it: through
        Gemma 2's norm of the attention output linear at ``s_a`` (``γ_a⊙a/s_a``), else ``a``."""
        return a * self.ov.attn_gain(self.s_a)

    def content_values(self, h: int, ids: np.ndarray) -> np.ndarray:
        """``cv_h(x)`` ``[U, d]`` of tokens ``ids``."""
        if isinstance(self.w, RelativeLayer0):
            return self.out(self.ov.ov(h, self.w.content_input(ids), bias=False))
        e = self.w.W_E[np.asarray(ids)]
        e = e - e.mean(axis=-1, keepdims=True)
        return self.out(self.ov.ov(h, e / self.s * self.w.ln_w, bias=False))

    def positional_values(self, h: int, T: int) -> np.ndarray:
        """``pv_h(i)`` ``[T, d]`` of positions ``0..T−1``."""
        if isinstance(self.w, RelativeLayer0):  # no position in the residual: the same for every i
            return self.out(self.ov.ov(h, self.w.constant_input(T)))
        p = self.w.W_pos[:T] - self.w.W_pos[:T].mean(axis=-1, keepdims=True)
        return self.out(self.ov.ov(h, p / self.s * self.w.ln_w + self.w.ln_b))

    def kappa(self, h: int, n: np.ndarray | int, content_key: np.ndarray) -> np.ndarray:
        """``κ_h(n, x)`` ``[N, U]`` (or ``[U]``) for content keys ``content_key [U, d_head]``."""
        return self.query[h, n] @ content_key.T / self.attn_scale

    def patterns(self, h: int, T: int) -> np.ndarray:
        """Positional patterns ``p_h(n, i)`` ``[T, T]`` for ``n = 0..T−1`` (0 after ``n`` and
        beyond a sliding layer 0's window)."""
        pi = self.query[h, :T] @ self.positional_key[h, :T].T / self.attn_scale
        window = int(getattr(getattr(self.w, "rel", None), "window", 0) or 0)
        return cx.softmax(np.where(cx.visible_keys(np.arange(T), T, window), pi, -np.inf))

    def win(self) -> np.ndarray:
        """``γ₂[:, None] ⊙ W_in / s₂`` ``[d, M]``: a centred residual direction to pre-activation units."""
        return self.ov.ln2_w[:, None] * self.ov.W_in / self.s2


def ln2_scale_summary(w: cx.Layer0Weights | RelativeLayer0, ov: Layer0OV, texts: Sequence[np.ndarray],
                      memo: tuple | None = None) -> dict[str, Any]:
    """``blocks.0.ln2.hook_scale`` over the positions ``≥ 1`` of ``texts`` (the real layer 0):
    its median (the scale ``s₂`` of the linear LayerNorm 2) and 5th/95th percentiles
    (``memo``: :func:`layer0_residual`)."""
    vals = np.concatenate([ov.ln2_scale(layer0_residual(w, ov, t, memo))[1:] for t in texts if len(t) > 1])
    if not len(vals):
        raise PosmechError("no text position to measure blocks.0.ln2.hook_scale on")
    q = np.quantile(vals, [0.05, 0.5, 0.95])
    return {"median": float(q[1]), "p05": float(q[0]), "p95": float(q[2]), "n_tokens": int(len(vals))}


def attn_norm_scale_median(w: cx.Layer0Weights | RelativeLayer0, ov: Layer0OV, texts: Sequence[np.ndarray]) -> float:
    """``s_a``: the median over the positions ``≥ 1`` of ``texts`` of ``blocks.0.ln1_post.hook_scale``,
    the RMS of layer 0's real attention output before Gemma 2's norm of it (the scale at which
    the bag of tokens treats that norm as linear, as it treats LayerNorm 2 at ``s₂``)."""
    vals = [ov.attn_norm_scale(w.ln(t, np.arange(len(t))), layer0_patterns(w, t))[1:] for t in texts if len(t) > 1]
    if not vals:
        raise PosmechError("no text position to measure blocks.0.ln1_post.hook_scale on")
    return float(np.median(np.concatenate(vals)))


def build_setup(dec: cx.Layer0File, w: cx.Layer0Weights | RelativeLayer0, ov: Layer0OV, heads: Sequence[int], calibration: int,
                from_position: int, n_ref: int | None, ln2_scale: float | None = None,
                memo: tuple | None = None) -> tuple[Setup, dict]:
    """:class:`Setup` from ``layer0.h5`` (``dec``): ``Z̄`` on text ``calibration``, ``n* = n_ref``
    (None: the largest stored position), ``s₂`` measured on the stored texts unless given, and
    (Gemma 2) ``s_a`` measured on them (:func:`attn_norm_scale_median`; in the returned summary
    as ``attn_out_scale``). ``memo``: :func:`layer0_residual`."""
    P = dec.query.shape[1]
    n_ref = int(dec.positions[-1]) if n_ref is None else int(n_ref)
    if not 1 <= n_ref < P:
        raise PosmechError(f"config key `neurons.reference_position`: {n_ref} outside 1..{P - 1}")
    ln2 = ln2_scale_summary(w, ov, list(dec.token_ids), memo)
    s2 = float(ln2_scale) if ln2_scale is not None else ln2["median"]
    s_a = attn_norm_scale_median(w, ov, list(dec.token_ids)) if ov.attn_norm is not None else 1.0
    st = Setup(w, ov, sorted(int(h) for h in heads), calibration_denominators(dec, calibration, from_position),
               float(dec.attrs["ln_scale_used"]), s2, dec.query, dec.positional_key, float(dec.attrs["attn_scale"]),
               n_ref, s_a)
    return st, {**ln2, "attn_out_scale": s_a} if ov.attn_norm is not None else ln2


def content_keys(dec: cx.Layer0File) -> Callable[[np.ndarray], np.ndarray]:
    """``ids → kc [H, U, d_head]`` (float64) from layer0.h5's content keys, read once into
    memory as stored (float32: gpt2 154 MB) instead of one HDF5 point selection per call."""
    from posmech.store.hdf5 import open_artifact

    with open_artifact(dec.path, cx.KIND) as f:
        K = f["factors/content_key"][()]
    return lambda ids: K[:, np.asarray(ids, dtype=np.int64)].astype(np.float64)


def extended_embeddings(st: Setup, content_key: Callable[[np.ndarray], np.ndarray], ids: np.ndarray) -> np.ndarray:
    """``E'(x)`` ``[U, d]`` of tokens ``ids`` at ``n*`` (``content_key(ids) → [H, U, d_head]``)."""
    kc = content_key(ids)
    out = np.zeros((len(ids), st.ov.d_model))
    for h in st.heads:
        out += (np.exp(st.kappa(h, st.n_ref, kc[h])) / st.z_bar[h])[:, None] * st.content_values(h, ids)
    return out


def token_contributions(E: np.ndarray, win: np.ndarray, rms: bool = False) -> np.ndarray:
    """``TC [U, M]`` (float32) from extended embeddings ``E [U, d]`` and :meth:`Setup.win`:
    one float32 matrix product (relative error ~1e-7, far below the float16 it is stored in;
    half the time of float64 for gpt2's 50257 × 768 × 3072)."""
    E = E if rms else E - E.mean(axis=-1, keepdims=True)  # what LayerNorm 2 subtracts; RMSNorm: nothing
    return E.astype(np.float32) @ win.astype(np.float32, copy=False)


#: why a twin's null computes no token's extended embedding (config ``twins.claims_only``)
NO_VOCABULARY = ("not computed: a random-init twin's null computes only what its claims read (config "
                 "twins.claims_only); C1's claim reads the LN2 scale over the texts, C2's and C3's the texts' "
                 "bag of tokens, none the vocabulary's extended embeddings or token contributions")


def write_extended(st: Setup, content_key: Callable[[np.ndarray], np.ndarray], path: str | os.PathLike[str],
                   attrs: dict[str, Any], block: int = 4096, progress: Any = None,
                   vocabulary: bool = True) -> dict[str, Any]:
    """Rule ``extended_token_embeddings``: ``E'`` (float32) and ``TC`` (float16, chunked
    ``[≤4096 tokens, ≤64 neurons]``) of every token, in blocks of ``block`` tokens (memory
    ``~block·(d + M)`` floats), plus per neuron the largest |TC| and its float32 norm.
    ``vocabulary`` false (a twin's null, :func:`posmech.core.null.only_claims`): the setup
    alone (``z_bar``, ``heads``, ``positional_pattern``, the scales), no token's ``E'`` or
    ``TC`` (no claim reads them: :data:`NO_VOCABULARY`, the attribute ``vocabulary``)."""
    from posmech.store.hdf5 import artifact_writer, describe

    V, d, M = st.w.d_vocab, st.ov.d_model, st.ov.d_mlp
    win = st.win().astype(np.float32)
    meta = {**attrs, "heads": [head_name(0, h) for h in st.heads], "reference_position": st.n_ref,
            "ln1_scale": st.s, "ln2_scale": st.s2, "attn_out_scale": st.s_a, "d_vocab": V, "d_model": d, "d_mlp": M,
            "contributions_dtype": "float16", "vocabulary": "every token" if vocabulary else NO_VOCABULARY}
    norm2 = np.zeros(M)
    amax = np.zeros(M)
    with artifact_writer(path, KIND, RULE, meta) as f:
        f.create_dataset("z_bar", data=st.z_bar)
        f.create_dataset("heads", data=np.array(st.heads, dtype=np.int64))
        f.create_dataset("positional_pattern", data=np.stack([st.patterns(h, st.n_ref + 1)[-1] for h in st.heads]))
        setup_doc = {
            "z_bar": "[H] calibration denominator of every layer-0 head: median over positions n >= from_position "
                     "of Z_h(n) on the calibration text (only `heads` are used)",
            "heads": "[Hc] indices of the layer-0 heads whose bag of tokens is modelled",
            "positional_pattern": "[Hc, n*+1] positional pattern p_h(n*, i) of the fixed destination token",
        }
        if not vocabulary:  # a twin's null: the setup alone
            describe(f, setup_doc)
            return {"max_abs": 0.0, "overflow": False}
        ext = f.create_dataset("extended_embeddings", shape=(V, d), dtype="float32", chunks=(min(V, 4096), d))
        tc = f.create_dataset("contributions", shape=(V, M), dtype="float16",
                              chunks=(min(V, 4096), min(M, 64)))
        for a in range(0, V, block):
            ids = np.arange(a, min(a + block, V))
            E = extended_embeddings(st, content_key, ids)
            C = token_contributions(E, win, st.ov.ln2_rms)
            ext[a : a + len(ids)] = E.astype(np.float32)
            tc[a : a + len(ids)] = C.astype(np.float16)
            norm2 += np.square(C, dtype=np.float64).sum(axis=0)
            amax = np.maximum(amax, np.abs(C).max(axis=0))
            if progress:
                progress(a + len(ids), V)
        f.create_dataset("contribution_norm", data=np.sqrt(norm2))
        f.create_dataset("contribution_absmax", data=amax)
        describe(f, {
            **setup_doc,
            "extended_embeddings": "[V, d_model] extended embedding E'(x) = sum over heads of exp(kappa_h(n*, x)) / "
                                   "Z_bar_h * cv_h(x), residual units before LayerNorm 2",
            "contributions": "[V, d_mlp] float16 token-contribution vectors TC_j(x) = (gamma2 * centred E'(x) / s2) "
                             ". W_in[:, j]",
            "contribution_norm": "[d_mlp] L2 norm over tokens of TC_j, before float16 rounding",
            "contribution_absmax": "[d_mlp] largest |TC_j(x)| over tokens, before float16 rounding",
        })
    return {"max_abs": float(amax.max()), "overflow": bool(amax.max() > 65504)}


def read_contributions(path: str | os.PathLike[str], neurons: Sequence[int]) -> np.ndarray:
    """``TC [V, len(neurons)]`` (float64) of ``neurons`` from the artifact."""
    from posmech.store.hdf5 import open_artifact

    with open_artifact(path, KIND) as f:
        ds = f["contributions"]
        return np.stack([ds[:, int(j)].astype(np.float64) for j in neurons], axis=1)


def read_extended_attrs(path: str | os.PathLike[str]) -> dict[str, Any]:
    from posmech.store.hdf5 import attr_json, open_artifact

    with open_artifact(path, KIND) as f:
        out = {k: attr_json(f, k) for k in f.attrs}
        out["z_bar"] = f["z_bar"][()]
        out["heads_index"] = [int(h) for h in f["heads"][()]]
    return out


def setup_from_artifact(path: str | os.PathLike[str], dec: cx.Layer0File, w: cx.Layer0Weights | RelativeLayer0,
                        ov: Layer0OV, memo: tuple | None = None) -> Setup:
    """The :class:`Setup` that wrote ``extended_tokens.h5`` (heads, ``Z̄``, ``s₂``, ``n*`` read back).
    ``memo`` (:func:`weights_key` of ``w, ov``): :func:`approximate`'s sums computed once per
    text in this process, keyed also by this artifact and ``layer0.h5``."""
    a = read_extended_attrs(path)
    return Setup(w, ov, a["heads_index"], a["z_bar"], float(dec.attrs["ln_scale_used"]), float(a["ln2_scale"]),
                 dec.query, dec.positional_key, float(dec.attrs["attn_scale"]), int(a["reference_position"]),
                 float(a.get("attn_out_scale", 1.0)), None if memo is None else (memo, files_key(path, dec.path)))


def resolve_neurons(configured: Sequence[int], ranking: pd.DataFrame, n_auto: int, d_mlp: int,
                    model: str) -> list[int]:
    """The neurons of C2/C3: ``neurons.neurons`` (checked against ``d_mlp``), or when empty
    the ``n_auto`` best ranked by explained variance."""
    if configured:
        return check_neurons(configured, d_mlp, model)
    return [int(j) for j in ranking["neuron"][:n_auto]]


# --------------------------------------------------------------------------- C3 approximation
def approximate(st: Setup, content_key: Callable[[np.ndarray], np.ndarray], ids: np.ndarray,
                ln2: str = "linear") -> dict[str, np.ndarray]:
    """The bag-of-tokens approximation along text ``ids [T]`` (module docstring):
    ``resid [T, d]`` (``r̂``), ``pre [T, M]`` (``â``, LN2 ``linear`` or ``exact``),
    ``context [T, M]`` (the contextual term ``t_j(n)``). With ``st.memo`` the sums over heads
    (``r̂`` and the contextual residual) are computed once per text in this process
    (:func:`memoised`: C2's ranking and C3's fit read the same texts)."""
    if ln2 not in ("exact", "linear"):
        raise PosmechError(f"config key `neurons.ln2`: {ln2!r} is neither 'linear' nor 'exact'")
    ids = np.asarray(ids, dtype=np.int64)
    r, ctx = memoised(text_key(st.memo, "bag_of_tokens", ids), lambda: _bag_of_tokens(st, content_key, ids))
    ov = st.ov
    if ln2 == "exact":
        pre = ov.ln2(r) @ ov.W_in + ov.b_in
    else:
        pre = ov.ln2_linear(r, st.s2) @ ov.W_in + ov.b_in
    context = ov.centre(ctx) @ st.win()
    return {"resid": r, "pre": pre, "context": context}


def _bag_of_tokens(st: Setup, content_key: Callable[[np.ndarray], np.ndarray],
                   ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`approximate`'s sums over layer 0's heads: ``r̂ [T, d]`` and the contextual heads'
    content part ``[T, d]``."""
    T = len(ids)
    pos = np.arange(T)
    w, ov = st.w, st.ov
    r = w.resid(ids, pos)
    r = r + st.out(ov.b_O) + (ov.embed_mlp(r) if ov.embed_mlp is not None else 0.0)
    x = w.ln(ids, pos)
    ctx = np.zeros_like(r)
    u, inv = np.unique(ids, return_inverse=True)
    kc = content_key(u)
    for h in range(w.n_heads):
        if h not in st.heads:
            r = r + st.out(ov.ov(h, x))  # attends to the current token only
            continue
        weight = st.patterns(h, T) * np.exp(st.kappa(h, pos, kc[h]))[:, inv] / st.z_bar[h]  # [T(n), T(i)]
        cv = st.content_values(h, u)[inv]
        content = weight @ cv
        ctx += content
        r = r + content + weight @ st.positional_values(h, T)
    return r, ctx


def fit_metrics(real: np.ndarray, approx: np.ndarray) -> dict[str, float]:
    """C3 metrics of one neuron on one text (vectors over positions): Pearson r, FVU =
    Σ(a − â)² / Σ(a − ā)², sign agreement (fraction of positions where ``sign a = sign â``),
    RMSE.  Fewer than 2 positions: an error.  A constant real activation (a neuron that reads
    nothing that varies): r and FVU are NaN, undefined (:func:`fit_scorecard` says why)."""
    real, approx = np.asarray(real, dtype=np.float64), np.asarray(approx, dtype=np.float64)
    if len(real) < 2:
        raise PosmechError("fewer than 2 positions: no fit")
    ss = np.square(real - real.mean()).sum()
    if ss == 0:
        r = fvu = float("nan")
    else:
        r = float(np.corrcoef(real, approx)[0, 1]) if approx.std() > 0 else float("nan")
        fvu = float(np.square(real - approx).sum() / ss)
    return {"pearson_r": r, "fvu": fvu,
            "sign_agreement": float(np.mean(np.sign(real) == np.sign(approx))),
            "rmse": float(np.sqrt(np.mean(np.square(real - approx))))}


def real_pre_activations(bridge: Any, ids: np.ndarray, hook: str = "blocks.0.mlp.hook_pre") -> np.ndarray:
    """One forward pass of text ``ids [T]`` through ``bridge`` (batch of one, no logits): the
    activation at ``hook`` of that text, ``[T, d_mlp]`` float64 — by default the real layer-0
    MLP pre-activation ``a_j(n)`` that :func:`approximate` approximates."""
    import torch

    store: dict[str, np.ndarray] = {}

    def grab(t: Any, hook: Any) -> Any:
        store["pre"] = t[0].double().cpu().numpy()
        return t

    dev = next(bridge.parameters()).device
    why = f"hook {hook!r} did not fire: this architecture does not expose it (rule neurons, analysis bag_of_tokens_fit)"
    with torch.inference_mode():
        try:
            bridge.run_with_hooks(torch.as_tensor(ids, device=dev)[None], fwd_hooks=[(hook, grab)], return_type=None)
        except KeyError as e:  # TransformerLens: no hook of that name
            raise PosmechError(why) from e
    if "pre" not in store:
        raise PosmechError(why)
    return store["pre"]


def fit_table(bridge: Any, st: Setup, content_key: Callable[[np.ndarray], np.ndarray], dec: cx.Layer0File,
              neurons: Sequence[int], from_position: int, ln2: str, model: str,
              log: Any = None) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    """C3's table: for every text of ``layer0.h5`` (``dec``) one forward pass
    (:func:`real_pre_activations`) and the bag-of-tokens approximation (:func:`approximate`,
    LayerNorm 2 ``ln2``); one row per (neuron, text) with ``claim, model, neuron, text`` (the
    text's index in ``dec``), ``corpus, title``, ``n_positions`` (positions
    ``n >= from_position``, the ones scored) and the :func:`fit_metrics` of the real against
    the approximate pre-activation over those positions (Pearson r, FVU, sign agreement, RMSE).
    Also the figure's traces: for the first text of each corpus and every neuron, the real and
    approximate pre-activation along the whole text with its metrics.  ``log`` (a logger)
    gets one line per text."""
    rows, traces = [], []
    first = set(dec.texts.drop_duplicates("corpus").index)
    for t, ids in enumerate(dec.token_ids):
        real = real_pre_activations(bridge, ids, st.ov.hook)
        approx = approximate(st, content_key, ids, ln2)["pre"]
        for j in neurons:
            m = fit_metrics(real[from_position:, j], approx[from_position:, j])
            title = dec.texts["title"][t]
            rows.append({"claim": "C3", "model": model, "neuron": j, "text": t, "corpus": dec.texts["corpus"][t],
                         "title": title, "n_positions": len(real) - from_position, **m})
            if t in first:
                traces.append({"neuron": j, "text": f"{dec.texts['corpus'][t]}: {title}", "real": real[:, j],
                               "approx": approx[:, j], **m})
        if log is not None:
            log.info("text %d of %d", t + 1, len(dec.token_ids))
    return pd.DataFrame(rows), traces


# --------------------------------------------------------------------------- C2
def token_counts(corpora: Sequence[Any], d_vocab: int) -> np.ndarray:
    """How often each token id occurs in ``corpora`` (:class:`posmech.data.tokens.TokenSet`) ``[V]``."""
    out = np.zeros(d_vocab, dtype=np.int64)
    for toks in corpora:
        out += np.bincount(np.asarray(toks.flat, dtype=np.int64), minlength=d_vocab)[:d_vocab]
    return out


def top_tokens(tc: np.ndarray, counts: np.ndarray, neurons: Sequence[int], k: int, min_count: int,
               decode: Callable[[int], str], model: str) -> pd.DataFrame:
    """C2 tidy table: per neuron, the ``k`` largest (``top``) and smallest (``bottom``)
    token contributions among tokens occurring at least ``min_count`` times in the corpora.
    ``tc [V, len(neurons)]``."""
    ok = np.flatnonzero(counts >= min_count)
    if not len(ok):
        raise PosmechError(f"config key `neurons.min_token_count`: no token occurs {min_count} times in the corpora")
    rows = []
    for c, j in enumerate(neurons):
        v = tc[ok, c]
        order = np.argsort(v, kind="stable")
        for side, idx in (("top", order[::-1][:k]), ("bottom", order[:k])):
            for rank, i in enumerate(idx, 1):
                t = int(ok[i])
                rows.append({"claim": "C2", "model": model, "neuron": int(j), "side": side, "rank": rank,
                             "token_id": t, "token": decode(t), "contribution": float(v[i]),
                             "corpus_count": int(counts[t])})
    return pd.DataFrame(rows)


def neuron_ranking(real: Sequence[np.ndarray], context: Sequence[np.ndarray], model: str,
                   from_n: int) -> pd.DataFrame:
    """C2 ranking of every neuron by the variance of its real pre-activation explained by the
    contextual term, over the positions ``n ≥ from_n`` of all texts (pooled):
    ``explained = 1 − Var(a − t) / Var(a)`` (negative when the term adds more variance than it
    explains), with ``Var(a)``, ``Var(t)`` and ``corr(a, t)``.  ``real, context``: ``[T, M]`` per text."""
    a = np.concatenate([x[from_n:] for x in real])
    t = np.concatenate([x[from_n:] for x in context])
    if len(a) < 2:
        raise PosmechError(f"config key `neurons.from_position`: {from_n} leaves fewer than 2 positions")
    va, vt = a.var(axis=0), t.var(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        explained = 1 - (a - t).var(axis=0) / va
        corr = ((a - a.mean(0)) * (t - t.mean(0))).mean(0) / np.sqrt(va * vt)
    df = pd.DataFrame({"claim": "C2", "model": model, "neuron": np.arange(a.shape[1]), "explained": explained,
                       "var_real": va, "var_context": vt, "corr": corr, "n_positions": len(a)})
    df = df.sort_values("explained", ascending=False, kind="stable").reset_index(drop=True)
    df.insert(3, "rank", np.arange(1, len(df) + 1))
    return df
