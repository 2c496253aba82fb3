"""A transformer block's value/output circuit, its norms and its MLP read from a Hugging Face
checkpoint's own weights, for every MLP layout the contextual neurons (C1–C3) study.

The contextual neurons (:mod:`posmech.analyses.neurons`) need, of the block whose MLP reads
layer 0's attention output, the value/output weights of layer 0's heads, the norm in front of
the MLP and the MLP's input weights. This module reads them from the parameter names of the
checkpoint (the tensors of its safetensors files, :func:`posmech.models.lens.hf_dir_reader`),
so a layout is recognised by the weights it has, not by a list of model types:

========================  =============================================  ==========================
parameters of block ``i``  layout (families)                             MLP
========================  =============================================  ==========================
``h.i.attn.c_attn``        GPT-2 (``Conv1D``: ``[in, out]``); GPT-BigCode ``c_fc``/``c_proj``
                           (``nn.Linear``, told by the weight's shape:
                           multi-query ``q | k | v`` or per head
                           ``[q, k, v]``)
``h.i.attn.attention.*``   GPT-Neo                                        ``c_fc``/``c_proj``
``h.i.attn.q_proj``        GPT-J (one LayerNorm: parallel)                ``fc_in``/``fc_out``
``h.i.self_attention.``    BLOOM, Falcon (fused ``query_key_value``:      ``dense_h_to_4h``/
``query_key_value``        per head ``[q, k, v]``, or Falcon's grouped    ``dense_4h_to_h``
                           ``[q…, k, v]`` per key/value head)
``blocks.i.attn.Wqkv``     MPT (fused ``q | k | v``)                      ``ffn.up_proj``/``down_proj``
``model.decoder.layers.i`` OPT                                            ``fc1``/``fc2``
``gpt_neox.layers.i``      GPT-NeoX (per head fused ``[q, k, v]``)        ``dense_h_to_4h``/…
``model.layers.i``         Llama, Mistral, Qwen2, Gemma, Gemma 2, Phi     ``gate_proj``, ``up_proj``,
                                                                          ``down_proj`` (gated) or
                                                                          ``fc1``/``fc2`` (Phi)
========================  =============================================  ==========================

What the weights cannot say is read from ``config.json``: the norms' epsilon, RMSNorm (a
config with ``rms_norm_eps``) against LayerNorm, Gemma's RMSNorm scale ``1 + w``
(``model_type`` gemma*), the activation (``hidden_activation``, ``hidden_act``,
``activation_function``, ``activation``; BLOOM's tanh GELU and MPT's exact GELU, which
their configs do not name), the head width (``head_dim``) and GPT-NeoX's
``use_parallel_residual``. A block whose weights match none of the rows, or whose config
lacks what is needed, is :class:`LayoutError` with the reason (the contextual neurons are
then not measurable with it, :func:`posmech.analyses.neurons.load_weights`).

**The neuron's pre-activation and activation.** A plain MLP computes ``act(x W_in + b_in)``:
neuron ``j``'s pre-activation is ``a_j = x W_in[:, j] + b_in[j]`` (TransformerLens's
``blocks.i.mlp.hook_pre``) and its activation ``act(a_j)`` (``hook_post``). A gated MLP
(SwiGLU: Llama, Mistral, Qwen2; GeGLU: Gemma) computes ``act(x W_gate + b_gate) ⊙ (x W_up +
b_up)``: neuron ``j``'s activation is ``act(g_j)·u_j``; its **pre-activation** is the gate's
``g_j = x W_gate[:, j] + b_gate[j]``, the input of the nonlinearity that decides whether the
neuron fires (TransformerLens's ``hook_pre``; the up projection ``u_j`` is ``hook_pre_linear``).
:attr:`MLP.W_pre` is that matrix (``W_in`` of a plain MLP, ``W_gate`` of a gated one).

**Block layouts.** In a sequential block the MLP reads ``norm₂(r + attn(norm₁(r)))``, the
residual after the block's attention; Gemma 2 normalises the attention output before adding
it (``post_attention_layernorm``) and reads ``pre_feedforward_layernorm`` of the sum. In a
parallel block (GPT-J, Phi, Falcon with ``parallel_attn``, GPT-NeoX with
``use_parallel_residual``) attention and MLP both read the block's input residual ``r``:
through the same LayerNorm (GPT-J, Phi, Falcon with one input norm), or through a norm of
their own (GPT-NeoX's ``post_attention_layernorm``, Falcon's ``ln_mlp``); the block writes
``r + attn + mlp``. A post-LayerNorm block (OPT with ``do_layer_norm_before: false``) is
:class:`LayoutError`: its MLP reads a LayerNorm of the residual, not a norm in front of the MLP.

:meth:`Block.forward` recomputes a block from its input residual and its attention pattern in
float64; tests/models/test_mlp_layouts.py checks every hook of it against the Hugging Face
forward of a random-init tiny model of each family. Shapes: ``H`` query heads, ``d`` model
width, ``dh`` head width, ``M`` MLP width, ``T`` positions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from posmech.core.errors import PosmechError

#: activations by their ``transformers`` names (``ACT2FN``)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x**3)))


def _gelu_erf(x: np.ndarray) -> np.ndarray:
    from scipy.special import erf

    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "gelu": _gelu_erf,
    "gelu_new": _gelu_tanh,
    "gelu_pytorch_tanh": _gelu_tanh,
    "gelu_fast": _gelu_tanh,
    "relu": lambda x: np.maximum(x, 0.0),
    "silu": lambda x: x / (1.0 + np.exp(-x)),
    "swish": lambda x: x / (1.0 + np.exp(-x)),
}


class LayoutError(PosmechError):
    """A block whose weights (or config) posmech cannot read: the reason in words."""


@dataclass(frozen=True)
class Norm:
    """LayerNorm (centred, ``rms`` False) or RMSNorm (``rms`` True) with scale ``w [d]``
    (Gemma's ``1 + w`` already added), bias ``b [d]`` (zeros without one) and ``eps``."""

    rms: bool
    w: np.ndarray
    b: np.ndarray
    eps: float

    def centre(self, x: np.ndarray) -> np.ndarray:
        """``x`` minus its mean over the last axis (LayerNorm); ``x`` itself (RMSNorm)."""
        return x if self.rms else x - x.mean(axis=-1, keepdims=True)

    def scale(self, x: np.ndarray) -> np.ndarray:
        """``hook_scale`` ``[...]``: ``sqrt(var x + eps)``; RMSNorm ``sqrt(mean x² + eps)``."""
        return np.sqrt(np.square(self.centre(x)).mean(axis=-1) + self.eps)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.centre(x) / self.scale(x)[..., None] * self.w + self.b

    def linear(self, x: np.ndarray, s: float, bias: bool = True) -> np.ndarray:
        """The norm treated as linear at scale ``s``."""
        return self.centre(x) / s * self.w + (self.b if bias else 0.0)


@dataclass(frozen=True)
class MLP:
    """``W_in [d, M]``, ``b_in [M]`` (a gated MLP's up projection), ``W_gate, b_gate``
    (``None`` without a gate), ``act`` (a name of :data:`ACTIVATIONS`), ``W_out [M, d]``,
    ``b_out [d]``."""

    W_in: np.ndarray
    b_in: np.ndarray
    W_gate: np.ndarray | None
    b_gate: np.ndarray | None
    act: str
    W_out: np.ndarray
    b_out: np.ndarray

    @property
    def gated(self) -> bool:
        return self.W_gate is not None

    @property
    def W_pre(self) -> np.ndarray:
        """The matrix of the neuron's pre-activation (module docstring): ``W_gate`` of a
        gated MLP, else ``W_in`` ``[d, M]``."""
        return self.W_gate if self.W_gate is not None else self.W_in

    @property
    def b_pre(self) -> np.ndarray:
        return self.b_gate if self.b_gate is not None else self.b_in

    @property
    def d_mlp(self) -> int:
        return int(self.W_in.shape[1])

    def pre(self, x: np.ndarray) -> np.ndarray:
        """The neurons' pre-activations ``[T, M]`` of the normalised input ``x [T, d]``
        (``hook_pre``: the gate's of a gated MLP)."""
        return x @ self.W_pre + self.b_pre

    def linear(self, x: np.ndarray) -> np.ndarray:
        """A gated MLP's up projection ``x W_in + b_in`` ``[T, M]`` (``hook_pre_linear``)."""
        return x @ self.W_in + self.b_in

    def post(self, x: np.ndarray) -> np.ndarray:
        """The neurons' activations ``[T, M]``: ``act(g)·u`` (gated) or ``act(a)``."""
        a = ACTIVATIONS[self.act](self.pre(x))
        return a * self.linear(x) if self.gated else a

    def out(self, x: np.ndarray) -> np.ndarray:
        """What the MLP writes to the residual stream ``[T, d]``."""
        return self.post(x) @ self.W_out + self.b_out


@dataclass(frozen=True)
class Block:
    """One block's norms, value/output circuit and MLP (module docstring).

    ``parallel``: attention and MLP read the block's input; ``ln1`` the attention's norm,
    ``ln_mlp`` the MLP's (the same object when a parallel block shares one);
    ``attn_out_norm``/``mlp_out_norm``: Gemma 2's norms of the attention and MLP outputs
    (``None`` elsewhere); ``W_V [H, d, dh]``, ``b_V [H, dh]`` per query head (grouped key/
    value heads repeated to their query heads), ``W_O [H, dh, d]``, ``b_O [d]``; ``mlp``
    ``None`` for an attention-only block; ``layout``: the row of the module docstring's
    table it was read as (for messages)."""

    layout: str
    parallel: bool
    ln1: Norm
    ln_mlp: Norm | None
    attn_out_norm: Norm | None
    mlp_out_norm: Norm | None
    W_V: np.ndarray
    b_V: np.ndarray
    W_O: np.ndarray
    b_O: np.ndarray
    mlp: MLP | None

    @property
    def n_heads(self) -> int:
        return int(self.W_V.shape[0])

    def ov(self, h: int, x: np.ndarray, bias: bool = True) -> np.ndarray:
        """``(x W_V^h + b_V^h) W_O^h`` ``[T, d]`` of normalised inputs ``x [T, d]``."""
        return (x @ self.W_V[h] + (self.b_V[h] if bias else 0.0)) @ self.W_O[h]

    def attention(self, resid: np.ndarray, patterns: np.ndarray) -> np.ndarray:
        """The attention output ``[T, d]`` the block adds to the residual (after Gemma 2's
        norm of it), for input residual ``resid [T, d]`` and patterns ``[H, T, T]``."""
        x = self.ln1(resid)
        out = self.b_O + sum(patterns[h] @ self.ov(h, x) for h in range(self.n_heads))
        return self.attn_out_norm(out) if self.attn_out_norm is not None else out

    def mlp_residual(self, resid: np.ndarray, attn: np.ndarray) -> np.ndarray:
        """The residual the MLP's norm reads ``[T, d]``: the block's input (parallel) or the
        input plus the attention output (sequential, ``hook_resid_mid``)."""
        return resid if self.parallel else resid + attn

    def forward(self, resid: np.ndarray, patterns: np.ndarray) -> dict[str, np.ndarray]:
        """The block recomputed in float64 from its input ``resid [T, d]`` and attention
        ``patterns [H, T, T]``: ``attn``, ``mlp_resid``, ``mlp_in`` (normalised), ``pre``,
        ``linear`` (gated only), ``post``, ``mlp_out``, ``resid_post``."""
        if self.mlp is None or self.ln_mlp is None:
            raise LayoutError(f"{self.layout}: the block has no MLP")
        resid = np.asarray(resid, dtype=np.float64)
        attn = self.attention(resid, np.asarray(patterns, dtype=np.float64))
        r = self.mlp_residual(resid, attn)
        x = self.ln_mlp(r)
        mlp_out = self.mlp.out(x)
        if self.mlp_out_norm is not None:
            mlp_out = self.mlp_out_norm(mlp_out)
        out = {"attn": attn, "mlp_resid": r, "mlp_in": x, "pre": self.mlp.pre(x), "post": self.mlp.post(x),
               "mlp_out": mlp_out, "resid_post": resid + attn + mlp_out}
        if self.mlp.gated:
            out["linear"] = self.mlp.linear(x)
        return out


# --------------------------------------------------------------------------- reading
Getter = Callable[[str], Any]


def _f64(t: Any) -> np.ndarray | None:
    if t is None:
        return None
    if hasattr(t, "detach"):
        t = t.detach().double().cpu().numpy()
    return np.asarray(t, dtype=np.float64)


def _int(cfg: Mapping[str, Any], *keys: str) -> int | None:
    for k in keys:
        v = cfg.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def _eps(cfg: Mapping[str, Any]) -> float:
    for k in ("rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps", "norm_eps"):
        v = cfg.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return 1e-5  # torch.nn.LayerNorm's default, what MPT and GPT-J fall back to


def activation(cfg: Mapping[str, Any], layout: str) -> str:
    """The MLP's activation: the config's ``hidden_activation``, ``hidden_act``,
    ``activation_function`` or ``activation``; BLOOM's MLP is the tanh GELU and MPT's the
    exact GELU (``nn.GELU()``), fixed in their code, not named in their configs."""
    for k in ("hidden_activation", "hidden_act", "activation_function", "activation"):
        v = cfg.get(k)
        if isinstance(v, str):
            if v not in ACTIVATIONS:
                raise LayoutError(f"config key {k}: activation {v!r} is not one posmech computes "
                                  f"({', '.join(ACTIVATIONS)})")
            return v
    if layout == "bloom":
        return "gelu_new"
    if layout == "mpt":
        return "gelu"
    if layout == "llama":  # transformers' LlamaConfig/GemmaConfig default
        return "gelu_pytorch_tanh" if str(cfg.get("model_type", "")).startswith("gemma") else "silu"
    raise LayoutError("config.json names no MLP activation (hidden_act, activation_function, activation)")


@dataclass(frozen=True)
class _Layout:
    """Parameter names of one layout, relative to block ``i``'s prefix."""

    name: str
    prefix: str  # with {i}
    marker: str  # a parameter only this layout has
    v: str  # value weight: fused ("qkv:<kind>") or the v projection
    o: str
    norms: tuple[str, ...]  # candidate norm names, attention's first
    mlp: tuple[str, ...]  # (in, out) or (gate, up, down)


LAYOUTS = (
    _Layout("gpt2", "h.{i}.", "attn.c_attn.weight", "qkv:conv1d", "attn.c_proj", ("ln_1", "ln_2"),
            ("mlp.c_fc", "mlp.c_proj")),
    _Layout("gpt_neo", "h.{i}.", "attn.attention.v_proj.weight", "attn.attention.v_proj", "attn.attention.out_proj",
            ("ln_1", "ln_2"), ("mlp.c_fc", "mlp.c_proj")),
    _Layout("gptj", "h.{i}.", "attn.v_proj.weight", "attn.v_proj", "attn.out_proj", ("ln_1", "ln_2"),
            ("mlp.fc_in", "mlp.fc_out")),
    _Layout("bloom", "h.{i}.", "self_attention.query_key_value.weight", "qkv:grouped", "self_attention.dense",
            ("input_layernorm", "post_attention_layernorm", "ln_attn", "ln_mlp"),
            ("mlp.dense_h_to_4h", "mlp.dense_4h_to_h")),
    _Layout("mpt", "blocks.{i}.", "attn.Wqkv.weight", "qkv:split", "attn.out_proj", ("norm_1", "norm_2"),
            ("ffn.up_proj", "ffn.down_proj")),
    _Layout("opt", "model.decoder.layers.{i}.", "self_attn.v_proj.weight", "self_attn.v_proj", "self_attn.out_proj",
            ("self_attn_layer_norm", "final_layer_norm"), ("fc1", "fc2")),
    _Layout("gpt_neox", "gpt_neox.layers.{i}.", "attention.query_key_value.weight", "qkv:grouped", "attention.dense",
            ("input_layernorm", "post_attention_layernorm"), ("mlp.dense_h_to_4h", "mlp.dense_4h_to_h")),
    _Layout("llama", "model.layers.{i}.", "self_attn.v_proj.weight", "self_attn.v_proj", "self_attn.o_proj|self_attn.dense",
            ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm"),
            ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")),
)

#: GPT-BigCode (StarCoder): GPT-2's parameter names with ``nn.Linear`` weights (``[out, in]``),
#: its fused ``c_attn`` of ``(H + 2·Hkv)·d_head`` rows: multi-query ``q | k | v`` (one key and one
#: value head) or, multi-head, per head ``q, k, v`` (the ``grouped`` kind covers both). Told from
#: GPT-2's by the orientation of that weight (:func:`_linear_qkv`), not by the model type
BIGCODE = _Layout("gpt_bigcode", "h.{i}.", "attn.c_attn.weight", "qkv:grouped", "attn.c_proj", ("ln_1", "ln_2"),
                  ("mlp.c_fc", "mlp.c_proj"))


def _linear_qkv(get: Getter, name: str, d: int) -> bool:
    """Whether the fused ``c_attn`` weight ``name`` is an ``nn.Linear`` (``[rows, d]``, rows > d:
    GPT-BigCode) rather than GPT-2's ``Conv1D`` (``[d, 3·d]``)."""
    W = get(name)
    return W is not None and tuple(W.shape)[0] != d


def find_layout(names: frozenset[str] | set[str], layer: int = 0) -> _Layout | None:
    """The layout whose marker parameter block ``layer`` has (``names``: the checkpoint's
    parameter names, ``transformer.`` stripped as :func:`posmech.models.lens.hf_dir_reader` does)."""
    for lay in LAYOUTS:
        if lay.prefix.format(i=layer) + lay.marker in names:
            return lay
    return None


def layout_problem(names: frozenset[str] | set[str], cfg: Mapping[str, Any], layer: int = 0) -> str | None:
    """Why block ``layer``'s weights cannot be read (:func:`read_block`), in words; ``None``
    when they can. Reads the parameter names only (no tensor)."""
    lay = find_layout(names, layer)
    if lay is None:
        some = sorted(n for n in names if f".{layer}." in n)[:6]
        return (f"block {layer}'s weights are in no layout posmech reads (parameters {some}; "
                "posmech.models.mlp_layouts.LAYOUTS)")
    try:
        _check_config(lay, names, cfg, layer)
    except LayoutError as e:
        return str(e)
    return None


def block_kind(names: frozenset[str] | set[str], cfg: Mapping[str, Any], layer: int = 0) -> dict[str, Any]:
    """What block ``layer`` is, from the checkpoint's parameter names and ``config.json``
    alone (no tensor is read; for a manifest or a check before any job): ``layout`` (the row
    of the module docstring's table, named after its first family: Falcon's is ``bloom``,
    Phi's, Qwen2's, Mistral's and Gemma's ``llama``), ``block`` (``parallel``: attention and MLP read the
    block's input; ``sequential``), ``mlp`` (``gated``, ``plain`` or ``none``), ``norm``
    (``rms`` or ``layer``), ``attention_output_norm`` (Gemma 2). Unreadable:
    :class:`LayoutError` with the reason (:func:`layout_problem`).

    A block with one norm feeds attention and MLP from it: parallel (GPT-J, Phi, Falcon with
    ``parallel_attn``); Falcon's ``ln_attn``/``ln_mlp``: parallel; GPT-NeoX's two norms:
    parallel unless ``use_parallel_residual`` is false; any other two norms: sequential."""
    why = layout_problem(names, cfg, layer)
    if why is not None:
        raise LayoutError(why)
    lay = find_layout(names, layer)
    assert lay is not None
    p = lay.prefix.format(i=layer)
    has = lambda n: p + n + ".weight" in names  # noqa: E731
    present = [n for n in lay.norms if has(n)]
    if not present:
        raise LayoutError(f"{lay.name}: block {layer} has no norm ({', '.join(lay.norms)})")
    gemma2 = lay.name == "llama" and has("pre_feedforward_layernorm")
    if gemma2:
        parallel = False
    elif has("ln_attn") or len(present) == 1:
        parallel = True
    else:
        parallel = lay.name == "gpt_neox" and bool(cfg.get("use_parallel_residual", True))
    mlp = "gated" if has("mlp.gate_proj") else "plain" if any(has(n) for n in (*lay.mlp, "mlp.fc1")) else "none"
    return {"layout": lay.name, "block": "parallel" if parallel else "sequential", "mlp": mlp,
            "norm": "rms" if "rms_norm_eps" in cfg else "layer", "attention_output_norm": gemma2}


def _check_config(lay: _Layout, names: Any, cfg: Mapping[str, Any], layer: int) -> None:
    if lay.name == "opt" and cfg.get("do_layer_norm_before") is False:
        raise LayoutError("post-LayerNorm blocks (OPT's do_layer_norm_before: false): the MLP reads a LayerNorm of "
                          "the residual after the block's attention, there is no norm in front of it to read")
    if lay.name == "bloom" and cfg.get("apply_residual_connection_post_layernorm"):
        raise LayoutError("BLOOM's apply_residual_connection_post_layernorm: the residual stream is the normalised "
                          "one; posmech reads the usual pre-LayerNorm block only")
    if lay.name == "llama" and lay.prefix.format(i=layer) + "mlp.gate_proj.weight" not in names \
            and lay.prefix.format(i=layer) + "mlp.fc1.weight" not in names \
            and any(n.startswith(lay.prefix.format(i=layer) + "mlp.") for n in names):
        raise LayoutError("the MLP is neither gated (gate_proj, up_proj, down_proj) nor fc1/fc2 (e.g. a fused "
                          "gate_up_proj)")
    activation(cfg, lay.name)


def _norm(get: Getter, name: str, cfg: Mapping[str, Any]) -> Norm | None:
    w = _f64(get(name + ".weight"))
    if w is None:
        return None
    b = _f64(get(name + ".bias"))
    rms = "rms_norm_eps" in cfg
    if rms and str(cfg.get("model_type", "")).startswith("gemma"):
        w = 1.0 + w  # GemmaRMSNorm: x / rms · (1 + w)
    return Norm(rms, w, np.zeros_like(w) if b is None else b, _eps(cfg))


def _lin(get: Getter, name: str, conv1d: bool = False) -> tuple[np.ndarray | None, np.ndarray | None]:
    """``(W [in, out], b [out] or None)`` of an ``nn.Linear`` (``[out, in]``) or ``Conv1D``."""
    W = _f64(get(name + ".weight"))
    if W is None:
        return None, None
    return (W if conv1d else W.T), _f64(get(name + ".bias"))


def read_block(get: Getter, names: frozenset[str] | set[str], cfg: Mapping[str, Any], layer: int = 0) -> Block:
    """:class:`Block` ``layer`` of a checkpoint: ``get(name)`` its tensors (torch or numpy;
    ``None`` when absent), ``names`` its parameter names, ``cfg`` its ``config.json``.
    Unreadable: :class:`LayoutError` with the reason (:func:`layout_problem`)."""
    kind = block_kind(names, cfg, layer)  # the reason, if any, before any tensor is read
    lay = find_layout(names, layer)
    assert lay is not None
    p = lay.prefix.format(i=layer)
    d = _int(cfg, "hidden_size", "n_embd", "d_model", "n_embed")
    H = _int(cfg, "num_attention_heads", "n_head", "num_heads", "n_heads")
    if d is None or H is None:
        raise LayoutError("config.json gives no model width or head count (hidden_size/n_embd/d_model, "
                          "num_attention_heads/n_head/num_heads/n_heads)")
    if lay.name == "gpt2" and _linear_qkv(get, p + lay.marker, d):
        lay = BIGCODE
    conv1d = lay.name == "gpt2"
    dh = _int(cfg, "head_dim") or d // H
    W_V, b_V = _values(get, p, lay, cfg, d, H, dh, conv1d)
    o_name = next((n for n in lay.o.split("|") if p + n + ".weight" in names), lay.o.split("|")[0])
    W_o, b_o = _lin(get, p + o_name, conv1d)
    if W_o is None:
        raise LayoutError(f"{lay.name}: no output projection {p + o_name}.weight")
    W_O = W_o.reshape(H, dh, W_o.shape[1])
    b_O = np.zeros(W_o.shape[1]) if b_o is None else b_o
    norms = {n: _norm(get, p + n, cfg) for n in lay.norms}
    present = [n for n in lay.norms if norms[n] is not None]
    mlp = _mlp(get, p, lay, cfg, conv1d)
    attn_out_norm = mlp_out_norm = None
    parallel = kind["block"] == "parallel"
    if kind["attention_output_norm"]:  # Gemma 2
        attn_out_norm, ln_mlp = norms["post_attention_layernorm"], norms["pre_feedforward_layernorm"]
        mlp_out_norm = _norm(get, p + "post_feedforward_layernorm", cfg)
        ln1 = norms["input_layernorm"]
    elif norms.get("ln_attn") is not None:  # Falcon's new decoder architecture: a norm each
        ln1, ln_mlp = norms["ln_attn"], norms["ln_mlp"]
    elif len(present) == 1:  # one norm in front of both
        ln1 = ln_mlp = norms[present[0]]
    else:
        ln1, ln_mlp = norms[present[0]], norms[present[1]]
    if mlp is None:
        ln_mlp = None
    return Block(lay.name, parallel, ln1, ln_mlp, attn_out_norm, mlp_out_norm, W_V, b_V, W_O, b_O, mlp)


def _values(get: Getter, p: str, lay: _Layout, cfg: Mapping[str, Any], d: int, H: int, dh: int,
            conv1d: bool) -> tuple[np.ndarray, np.ndarray]:
    """``W_V [H, d, dh]``, ``b_V [H, dh]`` per query head."""
    if lay.v.startswith("qkv:"):
        name = p + lay.marker.removesuffix(".weight")
        W, b = _lin(get, name, conv1d)  # [d, rows]
        assert W is not None
        rows = W.shape[1]
        b = np.zeros(rows) if b is None else b
        kind = lay.v.split(":")[1]
        if kind in ("conv1d", "split"):  # q | k | v, each [H·dh]
            if rows != 3 * H * dh:  # e.g. GPT-BigCode's multi-query c_attn [d, d + 2·d_head]
                raise LayoutError(f"{lay.name}: fused q|k|v projection of {rows} columns, not 3 × {H} heads × {dh}: "
                                  "grouped or multi-query keys/values in a layout read as full multi-head")
            Wv, bv = W[:, 2 * H * dh :], b[2 * H * dh :]
            return Wv.reshape(d, H, dh).transpose(1, 0, 2), bv.reshape(H, dh)
        # grouped: [Hkv, H/Hkv + 2, dh] (per head [q, k, v] when Hkv = H: GPT-NeoX, BLOOM, Falcon)
        if rows % dh or (rows // dh - H) % 2 or (rows // dh - H) // 2 < 1:
            raise LayoutError(f"{lay.name}: fused query_key_value has {rows} rows, not (H + 2·Hkv)·d_head "
                              f"with H = {H}, d_head = {dh}")
        Hkv = (rows // dh - H) // 2
        g = H // Hkv
        Wg = W.reshape(d, Hkv, g + 2, dh)[:, :, -1]  # [d, Hkv, dh]
        bg = b.reshape(Hkv, g + 2, dh)[:, -1]
        kv = np.arange(H) // g
        return Wg.transpose(1, 0, 2)[kv], bg[kv]
    Wv, bv = _lin(get, p + lay.v, conv1d)
    assert Wv is not None
    Hkv = Wv.shape[1] // dh
    if not Hkv or H % Hkv:
        raise LayoutError(f"{lay.name}: value projection of width {Wv.shape[1]} is not a divisor of {H} heads "
                          f"of {dh}")
    kv = np.arange(H) // (H // Hkv)
    W_V = Wv.reshape(d, Hkv, dh).transpose(1, 0, 2)[kv]
    b_V = np.zeros((H, dh)) if bv is None else bv.reshape(Hkv, dh)[kv]
    return W_V, b_V


def _mlp(get: Getter, p: str, lay: _Layout, cfg: Mapping[str, Any], conv1d: bool) -> MLP | None:
    act = activation(cfg, lay.name)
    names = lay.mlp
    if lay.name == "llama" and get(p + "mlp.gate_proj.weight") is None:
        names = ("mlp.fc1", "mlp.fc2")  # Phi
    if len(names) == 3:
        (Wg, bg), (Wi, bi), (Wo, bo) = (_lin(get, p + n) for n in names)
    else:
        (Wi, bi), (Wo, bo) = (_lin(get, p + n, conv1d) for n in names)
        Wg = bg = None
    if Wi is None or Wo is None:
        return None  # attention-only
    M = Wi.shape[1]
    if Wg is not None and bg is None:
        bg = np.zeros(M)
    return MLP(Wi, np.zeros(M) if bi is None else bi, Wg, bg, act, Wo,
               np.zeros(Wo.shape[1]) if bo is None else bo)
