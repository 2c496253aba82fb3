"""The forward engine of the analyses: a hooked transformer at the cost of a bare forward pass.

:class:`Lens` runs a decoder-only transformer — GPT-2 and GPT-Neo (learned absolute
positions added to the residual stream), OPT (learned positions stored from row 2, ReLU,
pre- or post-LayerNorm blocks), GPT-NeoX / Pythia (partial rotary, parallel residual),
Llama, Mistral, Qwen2 (RMSNorm, rotary, grouped-query attention, SwiGLU), BLOOM (ALiBi, an
embedding LayerNorm), GPT-J (interleaved partial rotary, one LayerNorm read by attention and
MLP in parallel), GPT-BigCode (GPT-2's block, multi-query attention), Phi (partial rotary, one
LayerNorm read in parallel), Falcon (7B's layout: rotary, multi-query attention, one LayerNorm
read in parallel) and legacy TransformerLens checkpoints — with TransformerLens's
interface and hook names, so that an analysis written against a ``TransformerBridge``
runs unchanged on it:

* ``model.hooks(fwd_hooks=[(name, fn), ...])`` (a context manager), ``model(x,
  return_type=None | "logits")``, ``model.run_with_hooks(x, fwd_hooks=..., return_type=...)``;
  a hook function is called as ``fn(tensor, hook=hook_point)`` and its return value, when
  not None, replaces the tensor; a name may also be a predicate on hook names;
* ``model.cfg`` (``n_layers``, ``n_heads``, ``d_model``, ``d_head``, ``d_mlp``, ``n_ctx``,
  ``d_vocab``, ``device``, ``attn_scale``, ``positional_embedding_type``, …),
  ``model.tokenizer``, ``model.hook_dict``;
* the processed weights in TransformerLens's shapes: ``W_E [d_vocab, d_model]``, ``W_pos
  [n_ctx, d_model]`` (the live parameter: writing into it changes every later forward),
  ``W_Q/W_K/W_V [n_layers, n_heads, d_model, d_head]``, ``b_Q/b_K/b_V [n_layers, n_heads,
  d_head]``, ``W_O [n_layers, n_heads, d_head, d_model]``, ``b_O [n_layers, d_model]``,
  ``W_in [n_layers, d_model, d_mlp]``, ``b_in``, ``W_out``, ``b_out``, ``W_U [d_model,
  d_vocab]``, ``b_U [d_vocab]``.

Hook points, with their shapes for a batch ``[B, T]`` of token ids: ``hook_embed``,
``hook_pos_embed`` ``[B, T, d_model]``; per block ``i``: ``blocks.{i}.hook_resid_pre``,
``hook_resid_mid`` (models with MLPs), ``hook_resid_post`` ``[B, T, d_model]``;
``blocks.{i}.ln1.hook_in``, ``hook_scale`` ``[B, T, 1]``, ``hook_normalized``, ``hook_out``
(and ``ln2.*``); ``blocks.{i}.attn.hook_q/hook_k/hook_v/hook_z`` ``[B, T, n_heads,
d_head]`` (``hook_k``/``hook_v`` with ``n_key_value_heads`` heads under grouped-query
attention, not repeated, as the bridge records them; on rotary models ``hook_q``/``hook_k``
are **before** the rotation, as the bridge records them, and ``blocks.{i}.attn.hook_cos``/
``hook_sin`` ``[1, T, rotary_dim]`` are the rotation's terms, which
``posmech.models.scores.rotate`` applies), ``hook_attn_scores`` and ``hook_pattern`` ``[B, n_heads, T_q, T_k]`` (scores are the
model's pre-softmax scores: ``q·k / attn_scale`` with ``q``, ``k`` rotated on rotary models
and BLOOM's ALiBi bias ``m_h · key position`` added, recorded after the causal mask, as the bridge records them:
``-inf`` in the future triangle in the compatibility mode, the dtype's most negative number
in the raw mode), ``hook_result`` ``[B, T, n_heads, d_model]``; ``blocks.{i}.mlp.hook_pre``,
``hook_post`` ``[B, T, d_mlp]`` (SwiGLU: ``hook_pre`` the gate's product, ``hook_pre_linear``
``W_in``'s, ``hook_post`` = act(pre)·pre_linear); ``ln_final.hook_in/hook_scale/hook_normalized/hook_out``.
Only the hooks a layout has exist: ``hook_pos_embed`` with learned positions,
``hook_resid_mid`` unless attention and MLP are parallel (GPT-NeoX), ``embed_ln.*`` on
BLOOM (whose ``hook_embed`` is the normalised embedding, as the bridge's), ``ln_final.*``
unless the model has no final norm (post-LayerNorm OPT). RMSNorm's ``hook_scale`` is
``sqrt(mean x² + eps)`` of the uncentred input.

**Processing modes** (as ``load_bridge``'s): ``compatibility`` applies, once, to the
weights, what ``enable_compatibility_mode()`` does to a bridge (TransformerLens's
``process_weights``: fold every LayerNorm's scale and bias into the weights that read it,
centre the weights writing to the residual stream, centre the unembedding, fold the value
biases into the output bias; :func:`process`); ``raw`` keeps the checkpoint's weights.
Either way every hook sees what the bridge's hook of the same name sees, to float32
rounding (``tests/models/test_lens.py`` compares every hook point, the weights, the logits
and the interventions the analyses make, on random-weight GPT-2, GPT-Neo and legacy
models and on the trained demo models). A model directory is read tensor by tensor
(:func:`from_hf_dir`): no Hugging Face model is built, so loading costs about one copy of
the weights.

**Only what is read is computed.** Attention runs as PyTorch's fused
``scaled_dot_product_attention`` (grouped key/value heads passed as they are,
``enable_gqa``; BLOOM's ALiBi bias and causal mask as one float mask ``[H, T, T]``, and
rotary ``cos``/``sin``, made once per pass) unless a hook is registered on the scores or
the pattern of that layer (then scores, mask, softmax and ``pattern @ v`` are made explicitly, so a hook
can read or replace them); per-head outputs (``hook_result``) are made only when hooked; the
forward stops after the last block that has a hook when ``return_type`` is None (nothing
later can be observed), and the unembedding is computed only for ``return_type="logits"``.
There is no key/value cache and no gradient bookkeeping: run under
``torch.inference_mode()``. Several continuations of one prompt run in one pass as a
*token tree* (``positions``/``visible`` of :meth:`Lens.__call__`): the prompt is computed
once, not once per continuation (:func:`posmech.analyses.readout.target_probabilities`).

Supported checkpoints (:func:`unsupported_hf` / :func:`unsupported` say why not): Hugging
Face ``GPT2LMHeadModel`` (no ``scale_attn_by_inverse_layer_idx``, no
``reorder_and_upcast_attn``), ``GPTNeoForCausalLM`` (TinyStories: unscaled attention, local
layers of ``window_size`` keys), ``OPTForCausalLM`` (not ``word_embed_proj_dim`` ≠
``hidden_size``; post-LayerNorm blocks in the raw mode only: folding is defined for
pre-LayerNorm blocks), ``GPTNeoXForCausalLM``, ``LlamaForCausalLM`` /
``MistralForCausalLM`` (its ``sliding_window`` as a window of keys) /
``Qwen2ForCausalLM`` (default rotary frequencies only: no ``rope_scaling``; no Qwen2
``use_sliding_window``), ``BloomForCausalLM`` (no
``apply_residual_connection_post_layernorm``; context: ``seq_length`` else
:data:`BLOOM_CONTEXT`), ``GPTJForCausalLM`` (with ``rotary_dim``; ``hook_cos``/``hook_sin``
each frequency twice in a row, as its ``duplicate_interleave``, and ``cfg.rotary_adjacent_pairs``
set), ``GPTBigCodeForCausalLM`` (with ``scale_attn_weights``, no cross-attention),
``PhiForCausalLM`` (no ``qk_layernorm``; default rotary frequencies), ``FalconForCausalLM``
(``parallel_attn``, no ``new_decoder_architecture``, no ``alibi``), ``MptForCausalLM``
(ALiBi, BLOOM's slopes being MPT's as transformers builds them; no ``clip_qkv``,
``qk_ln`` or ``softmax_scale``: :func:`_mpt_refusal`), and legacy
TransformerLens state dicts with ``normalization_type`` LN, standard positions and
``act_fn`` ``gelu``/``gelu_new``/``relu`` (or attention-only). Anything else: the bridge
(``posmech.models.loading.load_model`` chooses).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posmech.core.errors import PosmechError
from posmech.models.architecture import OPT_POSITION_OFFSET as OPT_OFFSET
from posmech.models.architecture import score_divisor
from posmech.core.perf import count_forward

#: Hugging Face architectures the engine runs (class names; ``MODEL_TYPES``: their config's ``model_type``)
ARCHITECTURES = ("GPT2LMHeadModel", "GPTNeoForCausalLM", "OPTForCausalLM", "GPTNeoXForCausalLM", "LlamaForCausalLM",
                 "MistralForCausalLM", "Qwen2ForCausalLM", "BloomForCausalLM", "GPTJForCausalLM",
                 "GPTBigCodeForCausalLM", "PhiForCausalLM", "FalconForCausalLM", "MptForCausalLM", "GemmaForCausalLM",
                 "Gemma2ForCausalLM")
MODEL_TYPES = ("gpt2", "gpt_neo", "opt", "gpt_neox", "llama", "mistral", "qwen2", "bloom", "gptj", "gpt_bigcode",
               "phi", "falcon", "mpt", "gemma", "gemma2")
#: Gemma's layouts (Llama's parameter names; RMSNorm scale ``1 + w``, embedding times sqrt(d_model), GeGLU)
GEMMA_TYPES = ("gemma", "gemma2")
#: Llama-style layouts (RMSNorm, rotary on every dimension, grouped-query attention, SwiGLU MLP)
LLAMA_TYPES = ("llama", "mistral", "qwen2")
#: queries per block when a causal pattern is made for a hook (:meth:`Lens._causal_pattern_blocks`)
QUERY_BLOCK = 128
#: activation functions of the MLPs the engine runs (TransformerLens names)
ACTIVATIONS = ("gelu_new", "gelu", "relu", "gelu_fast", "gelu_pytorch_tanh", "silu", "swish")


@dataclass
class LensConfig:
    """The model's shape, as TransformerLens's ``cfg`` names it."""

    n_layers: int
    n_heads: int
    d_model: int
    d_head: int
    d_mlp: int
    n_ctx: int
    d_vocab: int
    act_fn: str
    eps: float
    attn_only: bool
    device: Any = "cpu"
    dtype: Any = None
    attn_scale: float = 0.0
    use_attn_scale: bool = True
    normalization_type: str = "LN"
    positional_embedding_type: str = "standard"
    original_architecture: str = "GPT2LMHeadModel"
    default_prepend_bos: bool = True
    tokenizer_name: str | None = None
    #: per layer, how many keys a query sees (0: all earlier ones; GPT-Neo's local layers, Mistral's sliding window)
    windows: list[int] = field(default_factory=list)
    #: key/value heads (grouped-query attention: query head ``h`` reads key head ``h // (n_heads / n_kv)``)
    n_key_value_heads: int | None = None
    #: rotary dimensions per head (the first ``rotary_dim`` of ``d_head``; 0 without rotary) and the base
    rotary_dim: int = 0
    rotary_base: float = 10000.0
    #: rotary pairs are adjacent dimensions ``2f, 2f + 1`` (GPT-J's ``rotate_every_two``), not halves
    rotary_adjacent_pairs: bool = False
    #: the MLP is ``W_out(act(x W_gate) * (x W_in))`` (Llama's SwiGLU)
    gated_mlp: bool = False
    #: attention and MLP read the same residual (GPT-NeoX's ``use_parallel_residual``)
    parallel_attn_mlp: bool = False
    #: the parallel block's attention and MLP read one LayerNorm (GPT-J, Phi, Falcon: ``ln2`` equals
    #: ``ln1``), computed once when no hook is on either
    shared_ln: bool = False
    #: LayerNorm after each residual addition (OPT's ``do_layer_norm_before: false``)
    post_ln: bool = False
    #: a LayerNorm on the token embedding (BLOOM's ``word_embeddings_layernorm``)
    embed_ln: bool = False
    #: a final norm before the unembedding (OPT without ``do_layer_norm_before`` has none)
    final_ln: bool = True
    #: rows of the learned position table before position 0 (OPT: 2; ``W_pos`` starts after them)
    pos_offset: int = 0
    #: the Hugging Face ``model_type`` (``transformer_lens`` for a legacy checkpoint)
    model_type: str = "gpt2"
    #: a norm of the attention output and of the MLP output before each is added to the residual
    #: (Gemma 2's ``post_attention_layernorm`` / ``post_feedforward_layernorm``: ``ln1_post``,
    #: ``ln2_post``, TransformerLens's names; never folded)
    post_norms: bool = False
    #: attention scores soft-capped ``c·tanh(s / c)`` before the mask (Gemma 2's
    #: ``attn_logit_softcapping``; TransformerLens's name; ≤ 0: none)
    attn_scores_soft_cap: float = -1.0
    #: logits soft-capped ``c·tanh(l / c)`` (Gemma 2's ``final_logit_softcapping``; ≤ 0: none)
    output_logits_soft_cap: float = -1.0
    #: the token embedding is multiplied by it (Gemma's ``sqrt(d_model)``; ``hook_embed`` is the product)
    embed_scale: float = 1.0

    def __post_init__(self) -> None:
        if not self.n_key_value_heads:
            self.n_key_value_heads = self.n_heads
        if not self.attn_scale:  # the divisor of q·k (hf_state and tl_legacy_config set it from the config)
            self.attn_scale = score_divisor({"d_model": self.d_model, "n_layers": self.n_layers, "n_heads": self.n_heads,
                                             "d_head": self.d_head, "use_attn_scale": self.use_attn_scale})

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)


class HookPoint:
    """A named place in the forward pass; ``fwd_hooks`` holds the functions registered on it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.fwd_hooks: list[Callable[..., Any]] = []

    def layer(self) -> int:
        return int(self.name.split(".")[1])

    def add_hook(self, fn: Callable[..., Any], dir: str = "fwd") -> None:
        """Register ``fn`` until :meth:`remove_hooks` (prefer ``Lens.hooks``, which removes it)."""
        if dir != "fwd":
            raise PosmechError("the posmech engine runs inference only: no backward hooks")
        self.fwd_hooks.append(fn)

    def remove_hooks(self, dir: str = "fwd") -> None:
        self.fwd_hooks.clear()

    def __repr__(self) -> str:
        return f"HookPoint({self.name!r}, {len(self.fwd_hooks)} hooks)"


def _act(name: str) -> Callable[[Any], Any]:
    import torch.nn.functional as F

    if name in ("gelu_new", "gelu_fast", "gelu_pytorch_tanh"):
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "gelu":
        return F.gelu
    if name == "relu":
        return F.relu
    if name in ("silu", "swish"):
        return F.silu
    raise PosmechError(f"activation {name!r} is not supported by the posmech engine")


# --------------------------------------------------------------------------- weights
def _attention_layers(c: dict[str, Any]) -> list[str]:
    """GPT-Neo's per-layer attention kinds (``attention_layers``, else expanded from
    ``attention_types`` = ``[[kinds, repeat], ...]``)."""
    if c.get("attention_layers"):
        return list(c["attention_layers"])
    out: list[str] = []
    for kinds, repeat in c.get("attention_types") or [[["global"], int(c["num_layers"])]]:
        out += list(kinds) * int(repeat)
    return out


def _rope(c: dict[str, Any]) -> tuple[str, float]:
    """``(rope_type, rope_theta)`` of a rotary config (``rope_parameters`` of transformers 5,
    else ``rope_scaling`` / ``rope_theta`` / GPT-NeoX's ``rotary_emb_base``)."""
    rp = c.get("rope_parameters") if isinstance(c.get("rope_parameters"), dict) else {}
    rs = c.get("rope_scaling") if isinstance(c.get("rope_scaling"), dict) else {}
    kind = rp.get("rope_type") or rs.get("rope_type") or rs.get("type") or "default"
    theta = rp.get("rope_theta") or c.get("rope_theta") or c.get("rotary_emb_base") or 10000.0
    return str(kind), float(theta)


def with_engine_refusal(arch: Any, c: dict[str, Any]) -> Any:
    """``arch`` (a :class:`posmech.models.architecture.Architecture` read from config ``c``) with
    ``engine_refusal``: why the engine cannot run the model (:func:`unsupported_hf`; None for a
    legacy TransformerLens checkpoint, which it runs). What only the engine runs (the token-only
    input of a rotary or ALiBi model, their layer 0) is scheduled by it, not by a model type."""
    from dataclasses import replace

    from posmech.models.model_dir import is_tl_config

    return replace(arch, engine_refusal=None if is_tl_config(c) else unsupported_hf(dict(c)))


def unsupported_hf(c: dict[str, Any], processing: str | None = None) -> str | None:
    """Why the engine cannot run the Hugging Face model of config ``c`` (its ``config.json``
    as a dict) in processing mode ``processing`` (None: in the raw mode at least); None
    when it can."""
    mt = c.get("model_type")
    if mt not in MODEL_TYPES:
        return f"model_type {mt!r} (the engine runs {', '.join(MODEL_TYPES)})"
    if c.get("scale_attn_by_inverse_layer_idx") or c.get("reorder_and_upcast_attn"):
        return "scale_attn_by_inverse_layer_idx / reorder_and_upcast_attn"
    act = (c.get("hidden_act") if mt in ("gpt_neox", "phi", "gemma", *LLAMA_TYPES)
           else c.get("hidden_activation") or c.get("hidden_act") if mt == "gemma2"
           else c.get("activation", "gelu") if mt == "falcon" else c.get("activation_function", "gelu_new"))
    if mt not in ("bloom", "mpt") and act not in ACTIVATIONS:
        return f"activation {act!r}"
    if mt == "mpt":
        return _mpt_refusal(c)
    if mt == "gpt_bigcode" and (c.get("scale_attn_weights") is False or c.get("add_cross_attention")):
        return "GPT-BigCode without scale_attn_weights, or with cross-attention"
    if mt == "gptj" and not c.get("rotary_dim"):
        return "GPT-J without rotary_dim (Hugging Face then builds its rotary table over the model width)"
    if mt == "gpt_neo" and len(_attention_layers(c)) != int(c["num_layers"]):
        return "attention_types that do not cover every layer"
    if mt == "phi" and c.get("qk_layernorm"):
        return "Phi with qk_layernorm (a LayerNorm on each head's query and key, which the engine does not apply)"
    if mt == "falcon" and (c.get("new_decoder_architecture") or c.get("alibi") or not c.get("parallel_attn", True)):
        return ("Falcon with new_decoder_architecture, alibi or parallel_attn false (the engine runs the 7B layout: "
                "rotary, parallel attention and MLP reading one LayerNorm, multi-query or per-head fused qkv)")
    if mt in GEMMA_TYPES and c.get("use_bidirectional_attention"):
        return "Gemma with use_bidirectional_attention (the engine's attention is causal)"
    if mt == "gemma2" and any(str(k) not in ("sliding_attention", "full_attention") for k in c.get("layer_types") or []):
        return "Gemma 2 layer_types other than sliding_attention / full_attention"
    if mt in ("gpt_neox", "phi", "falcon", *LLAMA_TYPES, *GEMMA_TYPES) and _rope(c)[0] != "default":
        return f"rope_type {_rope(c)[0]!r} (the engine rotates with the default rotary frequencies only)"
    if mt in LLAMA_TYPES and (act not in ("silu", "swish") or c.get("pretraining_tp", 1) not in (None, 1)):
        return f"a Llama-style MLP with {act!r} / pretraining_tp {c.get('pretraining_tp')}"
    if mt == "qwen2" and c.get("use_sliding_window"):
        return "Qwen2's use_sliding_window (per-layer windows)"
    if mt == "bloom" and (c.get("apply_residual_connection_post_layernorm")
                          or (int(c.get("pretraining_tp") or 1) > 1 and c.get("slow_but_exact"))):
        return "BLOOM's apply_residual_connection_post_layernorm / slow_but_exact"
    if mt == "opt":
        if int(c.get("word_embed_proj_dim") or c["hidden_size"]) != int(c["hidden_size"]):
            return "OPT's word_embed_proj_dim != hidden_size (project_in / project_out)"
        if processing == "compatibility" and not c.get("do_layer_norm_before", True):
            return ("OPT with do_layer_norm_before false (LayerNorm after each residual addition) in the compatibility "
                    "mode: TransformerLens's LayerNorm folding is defined for pre-LayerNorm blocks only; use "
                    "processing: raw")
    return None


def hf_state(get: Callable[[str], Any], c: dict[str, Any]) -> tuple[dict[str, Any], LensConfig]:
    """A Hugging Face checkpoint's weights (of a ``model_type`` in :data:`MODEL_TYPES`) as a
    TransformerLens state dict (float32; views of what ``get`` returns where the layout
    allows) and its config. ``get(name)``: the tensor of a parameter named as in the
    checkpoint without the ``transformer.`` prefix (``h.0.attn.c_attn.weight``,
    ``lm_head.weight``, ``model.layers.0.self_attn.q_proj.weight``), None if absent."""
    f = lambda name: (lambda t: None if t is None else t.detach().float())(get(name))  # noqa: E731
    mt = c.get("model_type")
    if mt in ("gpt2", "gpt_neo"):
        sd, cfg = _gpt2_state(f, c)
    else:
        sd, cfg = {"opt": _opt_state, "gpt_neox": _neox_state, "bloom": _bloom_state,
                   "gptj": _gptj_state, "gpt_bigcode": _bigcode_state, "phi": _phi_state,
                   "falcon": _falcon_state, "mpt": _mpt_state, "gemma": _gemma_state,
                   "gemma2": _gemma_state}.get(mt, _llama_state)(f, c)
    cfg.model_type = str(mt)
    cfg.attn_scale = score_divisor(c)
    return {k: v for k, v in sd.items() if v is not None}, cfg


def _linear(W: Any, H: int, dh: int) -> Any:
    """An ``nn.Linear`` weight ``[H·dh, d]`` as TransformerLens's ``[H, d, dh]``."""
    return W.T.reshape(W.shape[1], H, dh).permute(1, 0, 2)


def _bias(b: Any, H: int, dh: int) -> Any:
    return None if b is None else b.view(H, dh)


def _llama_blocks(f: Callable[[str], Any], c: dict[str, Any]
                  ) -> tuple[dict[str, Any], tuple[int, int, int, int, int], list[tuple[str, str]]]:
    """A checkpoint in Llama's names (``model.embed_tokens``, ``model.layers.{i}.self_attn.q_proj``
    …; Phi's too): its state dict with the embedding and every layer's q/k/v, its dimensions
    ``(d_model, heads, layers, d_head, key/value heads)`` and each layer's ``(checkpoint prefix,
    TransformerLens prefix)``, for the rest of the block."""
    d, H, L = int(c["hidden_size"]), int(c["num_attention_heads"]), int(c["num_hidden_layers"])
    dh, Hkv = int(c.get("head_dim") or d // H), int(c.get("num_key_value_heads") or H)
    sd: dict[str, Any] = {"embed.W_E": f("model.embed_tokens.weight")}
    blocks = [(f"model.layers.{i}.", f"blocks.{i}.") for i in range(L)]
    for p, b in blocks:
        _qkv_proj(sd, f, p + "self_attn.", b, H, Hkv, dh)
    return sd, (d, H, L, dh, Hkv), blocks


def _qkv_proj(sd: dict[str, Any], f: Callable[[str], Any], p: str, b: str, H: int, Hkv: int, dh: int) -> None:
    """Separate ``q_proj``/``k_proj``/``v_proj`` ``nn.Linear`` layers named ``p + proj`` (biases
    where the checkpoint has them; ``Hkv`` key and value heads) into ``b + attn.W_Q`` …"""
    for n, proj, h in (("Q", "q_proj", H), ("K", "k_proj", Hkv), ("V", "v_proj", Hkv)):
        sd[f"{b}attn.W_{n}"] = _linear(f(f"{p}{proj}.weight"), h, dh)
        sd[f"{b}attn.b_{n}"] = _bias(f(f"{p}{proj}.bias"), h, dh)


def _gpt2_state(f: Callable[[str], Any], c: dict[str, Any]) -> tuple[dict[str, Any], LensConfig]:
    """GPT-2 and GPT-Neo (:func:`hf_state`)."""
    import torch

    neo = c.get("model_type") == "gpt_neo"
    d = int(c["hidden_size"] if neo else c["n_embd"])
    H = int(c["num_heads"] if neo else c["n_head"])
    L = int(c["num_layers"] if neo else c["n_layer"])
    dh = d // H
    M = int((c.get("intermediate_size") if neo else c.get("n_inner")) or 4 * d)
    V = int(c["vocab_size"])
    sd: dict[str, Any] = {"embed.W_E": f("wte.weight"), "pos_embed.W_pos": f("wpe.weight")}
    zeros = lambda *shape: torch.zeros(shape)  # noqa: E731
    for i in range(L):
        p = f"h.{i}."
        if neo:
            for n, proj in zip("QKV", ("q_proj", "k_proj", "v_proj")):  # Linear: [out, in]
                sd[f"blocks.{i}.attn.W_{n}"] = f(f"{p}attn.attention.{proj}.weight").T.reshape(d, H, dh).permute(1, 0, 2)
                bias = f(f"{p}attn.attention.{proj}.bias")
                sd[f"blocks.{i}.attn.b_{n}"] = bias.view(H, dh) if bias is not None else zeros(H, dh)
            sd[f"blocks.{i}.attn.W_O"] = f(f"{p}attn.attention.out_proj.weight").T.reshape(H, dh, d)
            sd[f"blocks.{i}.attn.b_O"] = f(f"{p}attn.attention.out_proj.bias")
            sd[f"blocks.{i}.mlp.W_in"] = f(f"{p}mlp.c_fc.weight").T
            sd[f"blocks.{i}.mlp.W_out"] = f(f"{p}mlp.c_proj.weight").T
        else:  # Conv1D: [in, out]
            W = f(f"{p}attn.c_attn.weight").view(d, 3, H, dh)
            bias = f(f"{p}attn.c_attn.bias").view(3, H, dh)
            for j, n in enumerate("QKV"):
                sd[f"blocks.{i}.attn.W_{n}"] = W[:, j].permute(1, 0, 2)
                sd[f"blocks.{i}.attn.b_{n}"] = bias[j]
            sd[f"blocks.{i}.attn.W_O"] = f(f"{p}attn.c_proj.weight").view(H, dh, d)
            sd[f"blocks.{i}.attn.b_O"] = f(f"{p}attn.c_proj.bias")
            sd[f"blocks.{i}.mlp.W_in"] = f(f"{p}mlp.c_fc.weight")
            sd[f"blocks.{i}.mlp.W_out"] = f(f"{p}mlp.c_proj.weight")
        sd[f"blocks.{i}.mlp.b_in"] = f(f"{p}mlp.c_fc.bias")
        sd[f"blocks.{i}.mlp.b_out"] = f(f"{p}mlp.c_proj.bias")
        for ln, hf_ln in (("ln1", "ln_1"), ("ln2", "ln_2")):
            sd[f"blocks.{i}.{ln}.w"], sd[f"blocks.{i}.{ln}.b"] = f(f"{p}{hf_ln}.weight"), f(f"{p}{hf_ln}.bias")
    sd["ln_final.w"], sd["ln_final.b"] = f("ln_f.weight"), f("ln_f.bias")
    lm = f("lm_head.weight")
    sd["unembed.W_U"] = (lm if lm is not None else sd["embed.W_E"]).T  # tied embeddings: no lm_head in the file
    sd["unembed.b_U"] = f("lm_head.bias")
    window = int(c.get("window_size") or 0)
    cfg = LensConfig(
        n_layers=L, n_heads=H, d_model=d, d_head=dh, d_mlp=M,
        n_ctx=int(c["max_position_embeddings"] if neo else c["n_positions"]), d_vocab=V,
        act_fn=str(c.get("activation_function", "gelu_new")), eps=float(c.get("layer_norm_epsilon", 1e-5)),
        attn_only=False, use_attn_scale=False if neo else bool(c.get("scale_attn_weights", True)),
        original_architecture="GPTNeoForCausalLM" if neo else "GPT2LMHeadModel",
        windows=[window if kind == "local" else 0 for kind in _attention_layers(c)] if neo else [],
    )
    return sd, cfg


def _lm_head(f: Callable[[str], Any], sd: dict[str, Any], name: str) -> None:
    lm = f(name)
    sd["unembed.W_U"] = (lm if lm is not None else sd["embed.W_E"]).T  # tied embeddings: no head in the file


def _block_rest(sd: dict[str, Any], f: Callable[[str], Any], p: str, b: str, H: int, dh: int,
                names: tuple[str, str, str, str, str]) -> None:
    """One block's output projection, MLP and two LayerNorms from ``nn.Linear`` / LayerNorm
    parameters named ``p + name`` (``names``: output projection, MLP in, MLP out, first and
    second norm) into TransformerLens's ``b + ...`` keys."""
    out, mlp_in, mlp_out, ln1, ln2 = names
    sd[f"{b}attn.W_O"] = f(f"{p}{out}.weight").T.reshape(H, dh, -1)
    sd[f"{b}attn.b_O"] = f(f"{p}{out}.bias")
    sd[f"{b}mlp.W_in"], sd[f"{b}mlp.b_in"] = f(f"{p}{mlp_in}.weight").T, f(f"{p}{mlp_in}.bias")
    sd[f"{b}mlp.W_out"], sd[f"{b}mlp.b_out"] = f(f"{p}{mlp_out}.weight").T, f(f"{p}{mlp_out}.bias")
    for ln, hf_ln in (("ln1", ln1), ("ln2", ln2)):
        sd[f"{b}{ln}.w"], sd[f"{b}{ln}.b"] = f(f"{p}{hf_ln}.weight"), f(f"{p}{hf_ln}.bias")


def _opt_state(f: Callable[[str], Any], c: dict[str, Any]) -> tuple[dict[str, Any], LensConfig]:
    """OPT: learned positions stored from row 2 (``W_pos`` is the table from that row on),
    separate q/k/v projections, ReLU, pre- or post-LayerNorm blocks."""
    d, H, L = int(c["hidden_size"]), int(c["num_attention_heads"]), int(c["num_hidden_layers"])
    dh = d // H
    m = "model.decoder."
    table = f(m + "embed_positions.weight")
    sd: dict[str, Any] = {"embed.W_E": f(m + "embed_tokens.weight"), "pos_embed.W_pos": table[OPT_OFFSET:]}
    for i in range(L):
        p, b = f"{m}layers.{i}.", f"blocks.{i}."
        _qkv_proj(sd, f, p + "self_attn.", b, H, H, dh)
        _block_rest(sd, f, p, b, H, dh, ("self_attn.out_proj", "fc1", "fc2", "self_attn_layer_norm",
                                         "final_layer_norm"))
    pre_ln = bool(c.get("do_layer_norm_before", True))
    final = pre_ln and not c.get("_remove_final_layer_norm", False)
    if final:
        sd["ln_final.w"], sd["ln_final.b"] = f(m + "final_layer_norm.weight"), f(m + "final_layer_norm.bias")
    _lm_head(f, sd, "lm_head.weight")
    cfg = LensConfig(
        n_layers=L, n_heads=H, d_model=d, d_head=dh, d_mlp=int(c["ffn_dim"]), n_ctx=int(c["max_position_embeddings"]),
        d_vocab=int(c["vocab_size"]), act_fn=str(c.get("activation_function", "relu")), eps=1e-5, attn_only=False,
        original_architecture="OPTForCausalLM", post_ln=not pre_ln, final_ln=final, pos_offset=OPT_OFFSET)
    return sd, cfg


def _fused_qkv(sd: dict[str, Any], b: str, W: Any, bias: Any, H: int, dh: int) -> None:
    """GPT-NeoX's and BLOOM's fused ``query_key_value`` (``[3·d, d]``, per head ``q, k, v``
    of ``d_head`` rows each: the head-interleaved layout)."""
    Wv = W.view(H, 3, dh, W.shape[1])
    bv = bias.view(H, 3, dh) if bias is not None else None
    for j, n in enumerate("QKV"):
        sd[f"{b}attn.W_{n}"] = Wv[:, j].transpose(1, 2)  # [H, d, dh]
        sd[f"{b}attn.b_{n}"] = bv[:, j] if bv is not None else None


def _neox_state(f: Callable[[str], Any], c: dict[str, Any]) -> tuple[dict[str, Any], LensConfig]:
    """GPT-NeoX / Pythia: partial rotary, fused head-interleaved qkv, parallel residual."""
    from posmech.models.architecture import _rotary_fraction

    d, H, L = int(c["hidden_size"]), int(c["num_attention_heads"]), int(c["num_hidden_layers"])
    dh = d // H
    m = "gpt_neox."
    sd: dict[str, Any] = {"embed.W_E": f(m + "embed_in.weight")}
    for i in range(L):
        p, b = f"{m}layers.{i}.", f"blocks.{i}."
        _fused_qkv(sd, b, f(f"{p}attention.query_key_value.weight"), f(f"{p}attention.query_key_value.bias"), H, dh)
        _block_rest(sd, f, p, b, H, dh, ("attention.dense", "mlp.dense_h_to_4h", "mlp.dense_4h_to_h",
                                         "input_layernorm", "post_attention_layernorm"))
    sd["ln_final.w"], sd["ln_final.b"] = f(m + "final_layer_norm.weight"), f(m + "final_layer_norm.bias")
    _lm_head(f, sd, "embed_out.weight")
    cfg = LensConfig(
        n_layers=L, n_heads=H, d_model=d, d_head=dh, d_mlp=int(c["intermediate_size"]),
        n_ctx=int(c["max_position_embeddings"]), d_vocab=int(c["vocab_size"]), act_fn=str(c.get("hidden_act", "gelu")),
        eps=float(c.get("layer_norm_eps", 1e-5)), attn_only=False, original_architecture="GPTNeoXForCausalLM",
        positional_embedding_type="rotary", rotary_dim=int(dh * _rotary_fraction(c, "gpt_neox", dh)),
        rotary_base=_rope(c)[1], parallel_attn_mlp=bool(c.get("use_parallel_residual", True)))
    return sd, cfg


def _split_qkv(sd: dict[str, Any], b: str, W: Any, bias: Any, H: int, dh: int, multi_query: bool) -> None:
    """A fused qkv ``nn.Linear`` (GPT-BigCode's ``c_attn``, Falcon's ``query_key_value``):
    multi-query (``[H·dh + 2·dh, d]``: the queries of every head, then one key and one value
    head), else per head ``q, k, v`` of ``d_head`` rows each (:func:`_fused_qkv`)."""
    if not multi_query:
        _fused_qkv(sd, b, W, bias, H, dh)
        return
    q = H * dh
    for n, rows, h in (("Q", slice(0, q), H), ("K", slice(q, q + dh), 1), ("V", slice(q + dh, q + 2 * dh), 1)):
        sd[f"{b}attn.W_{n}"] = _linear(W[rows], h, dh)
        sd[f"{b}attn.b_{n}"] = _bias(None if bias is None else bias[rows], h, dh)


def _one_ln(sd: dict[str, Any], b: str) -> None:
    """A block whose attention and MLP read one LayerNorm: ``ln2`` its own copy of ``ln1``."""
    sd[f"{b}ln2.w"], sd[f"{b}ln2.b"] = sd[f"{b}ln1.w"].clone(), sd[f"{b}ln1.b"].clone()


def _phi_state(f: Callable[[str], Any], c: dict[str, Any]) -> tuple[dict[str, Any], LensConfig]:
    """Phi (1, 1.5, 2): partial rotary in the halves layout (``partial_rotary_factor`` of each
    head), q/k/v projections with biases (``num_key_value_heads`` key heads), the ``dense``
    output projection, one LayerNorm (``input_layernorm``) read by attention and MLP in
    parallel (kept as ``ln1`` and an equal ``ln2``), a GELU MLP ``fc1``/``fc2``, a final
    LayerNorm and a biased ``lm_head``. ``qk_layernorm`` is refused (:func:`unsupported_hf`)."""
    from posmech.models.architecture import _rotary_fraction

    sd, (d, H, L, dh, Hkv), blocks = _llama_blocks(f, c)
    m = "model."
    for p, b in blocks:
        _block_rest(sd, f, p, b, H, dh, ("self_attn.dense", "mlp.fc1", "mlp.fc2", "input_layernorm", "input_layernorm"))
        _one_ln(sd, b)
    sd["ln_final.w"], sd["ln_final.b"] = f(m + "final_layernorm.weight"), f(m + "final_layernorm.bias")
    _lm_head(f, sd, "lm_head.weight")
    sd["unembed.b_U"] = f("lm_head.bias")
    cfg = LensConfig(
        n_layers=L, n_heads=H, d_model=d, d_head=dh, d_mlp=int(c["intermediate_size"]),
        n_ctx=int(c["max_position_embeddings"]), d_vocab=int(c["vocab_size"]), act_fn=str(c.get("hidden_act", "gelu_new")),
        eps=float(c.get("layer_norm_eps", 1e-5)), attn_only=False, original_architecture="PhiForCausalLM",
        positional_embedding_type="rotary", rotary_dim=int(dh * _rotary_fraction(c, "phi", dh)),
        rotary_base=_rope(c)[1], n_key_value_heads=Hkv, parallel_attn_mlp=True, shared_ln=True)
    return sd, cfg


#: Falcon's context when its config records none (``FalconConfig``'s default)
FALCON_CONTEXT = 2048


def _falcon_state(f: Callable[[str], Any], c: dict[str, Any]) -> tuple[dict[str, Any], LensConfig]:
    """Falcon's 7B layout (``new_decoder_architecture`` false, ``parallel_attn``, no ALiBi):
    rotary on every dimension (halves layout), a fused ``query_key_value`` (multi-query: one
    key and one value head; else per head ``q, k, v``), one LayerNorm (``input_layernorm``)
    read by attention and MLP in parallel, a GELU MLP ``dense_h_to_4h``/``dense_4h_to_h``
    (biases where ``bias``), ``ln_f`` and a bias-free ``lm_head`` (tied: the embedding)."""
    d, H, L = int(c["hidden_size"]), int(c["num_attention_heads"]), int(c["num_hidden_layers"])
    dh = d // H
    mq = bool(c.get("multi_query", True))
    sd: dict[str, Any] = {"embed.W_E": f("word_embeddings.weight")}
    for i in range(L):
        p, b = f"h.{i}.", f"blocks.{i}."
        _split_qkv(sd, b, f(f"{p}self_attention.query_key_value.weight"), f(f"{p}self_attention.query_key_value.bias"),
                   H, dh, mq)
        _block_rest(sd, f, p, b, H, dh, ("self_attention.dense", "mlp.dense_h_to_4h", "mlp.dense_4h_to_h",
                                         "input_layernorm", "input_layernorm"))
        _one_ln(sd, b)
    sd["ln_final.w"], sd["ln_final.b"] = f("ln_f.weight"), f("ln_f.bias")
    _lm_head(f, sd, "lm_head.weight")
    cfg = LensConfig(
        n_layers=L, n_heads=H, d_model=d, d_head=dh, d_mlp=int(c.get("ffn_hidden_size") or 4 * d),
        n_ctx=int(c.get("max_position_embeddings") or FALCON_CONTEXT), d_vocab=int(c["vocab_size"]),
        act_fn=str(c.get("activation", "gelu")), eps=float(c.get("layer_norm_epsilon", 1e-5)), attn_only=False,
        original_architecture="FalconForCausalLM", positional_embedding_type="rotary", rotary_dim=dh,
        rotary_base=_rope(c)[1], n_key_value_heads=1 if mq else H, parallel_attn_mlp=True, shared_ln=True)
    return sd, cfg


def _mpt_refusal(c: dict[str, Any]) -> str | None:
    """Why the engine cannot run the MPT of config ``c`` (None: it can). It runs the layout of
    transformers' ``MptForCausalLM``: ALiBi with BLOOM's slopes, which are MPT's for every head
    count (``build_mpt_alibi_tensor`` takes the next power of two ``2c`` and its odd-indexed slopes
    first: those are BLOOM's ``c`` base slopes, its even-indexed ones BLOOM's extra ones), and
    transformers builds them at ``alibi_bias_max`` 8 whatever the config says (it does not pass
    the key: a model trained at another value runs under transformers, engine and bridge alike,
    with 8); scores ``q·k/sqrt(d_head)``, no clipping of q/k/v, no q/k LayerNorm."""
    a = c.get("attn_config") or {}
    if not a.get("alibi", False):
        return "MPT without ALiBi (attn_config.alibi false)"
    if a.get("clip_qkv") or a.get("qk_ln") or a.get("softmax_scale") is not None:
        return "MPT with attn_config clip_qkv, qk_ln or softmax_scale"
    if a.get("prefix_lm") or a.get("attn_uses_sequence_id"):
        return "MPT with attn_config prefix_lm or attn_uses_sequence_id"
    return None


def _mpt_state(f: Callable[[str], Any], c: dict[str, Any]) -> tuple[dict[str, Any], LensConfig]:
    """MPT: ALiBi, a fused ``Wqkv`` (``q | k | v``, ``d`` rows each), bias-free LayerNorms and
    projections, a GELU (exact) MLP of the width its weights have (transformers builds ``4·d``
    whatever ``expansion_ratio`` says), sequential blocks, tied embeddings."""
    d, H, L = int(c["d_model"]), int(c["n_heads"]), int(c["n_layers"])
    dh = d // H
    sd: dict[str, Any] = {"embed.W_E": f("wte.weight")}
    for i in range(L):
        p, b = f"blocks.{i}.", f"blocks.{i}."
        W = f(f"{p}attn.Wqkv.weight")
        for j, n in enumerate("QKV"):
            sd[f"{b}attn.W_{n}"] = _linear(W[j * d : (j + 1) * d], H, dh)
        _block_rest(sd, f, p, b, H, dh, ("attn.out_proj", "ffn.up_proj", "ffn.down_proj", "norm_1", "norm_2"))
    sd["ln_final.w"], sd["ln_final.b"] = f("norm_f.weight"), f("norm_f.bias")
    _lm_head(f, sd, "lm_head.weight")
    cfg = LensConfig(
        n_layers=L, n_heads=H, d_model=d, d_head=dh, d_mlp=int(sd["blocks.0.mlp.W_in"].shape[1]),
        n_ctx=int(c["max_seq_len"]), d_vocab=int(c["vocab_size"]), act_fn="gelu",
        eps=float(c.get("layer_norm_epsilon", 1e-5)), attn_only=False, original_architecture="MptForCausalLM",
        positional_embedding_type="alibi")
    return sd, cfg


def _bigcode_state(f: Callable[[str], Any], c: dict[str, Any]) -> tuple[dict[str, Any], LensConfig]:
    """GPT-BigCode (StarCoder): GPT-2's block with ``nn.Linear`` weights and a fused ``c_attn``:
    multi-query (``[d + 2·d_head, d]``: the queries of every head, then one key and one value
    head), else per head ``q, k, v`` of ``d_head`` rows each (the head-interleaved layout)."""
    d, H, L = int(c["n_embd"]), int(c["n_head"]), int(c["n_layer"])
    dh = d // H
    mq = bool(c.get("multi_query", True))
    sd: dict[str, Any] = {"embed.W_E": f("wte.weight"), "pos_embed.W_pos": f("wpe.weight")}
    for i in range(L):
        p, b = f"h.{i}.", f"blocks.{i}."
        _split_qkv(sd, b, f(f"{p}attn.c_attn.weight"), f(f"{p}attn.c_attn.bias"), H, dh, mq)
        _block_rest(sd, f, p, b, H, dh, ("attn.c_proj", "mlp.c_fc", "mlp.c_proj", "ln_1", "ln_2"))
    sd["ln_final.w"], sd["ln_final.b"] = f("ln_f.weight"), f("ln_f.bias")
    _lm_head(f, sd, "lm_head.weight")
    cfg = LensConfig(
        n_layers=L, n_heads=H, d_model=d, d_head=dh, d_mlp=int(c.get("n_inner") or 4 * d), n_ctx=int(c["n_positions"]),
        d_vocab=int(c["vocab_size"]), act_fn=str(c.get("activation_function", "gelu_pytorch_tanh")),
        eps=float(c.get("layer_norm_epsilon", 1e-5)), attn_only=False, original_architecture="GPTBigCodeForCausalLM",
        n_key_value_heads=1 if mq else H)
    return sd, cfg


def _gptj_state(f: Callable[[str], Any], c: dict[str, Any]) -> tuple[dict[str, Any], LensConfig]:
    """GPT-J: interleaved partial rotary (``rotary_dim`` dimensions, base 10000, pairs ``2f,
    2f + 1``), bias-free q/k/v/out projections, one LayerNorm (``ln_1``) read by attention and
    MLP in parallel (kept as ``ln1`` and an equal ``ln2``), a biased ``lm_head``."""
    d, H, L = int(c["n_embd"]), int(c["n_head"]), int(c["n_layer"])
    dh = d // H
    sd: dict[str, Any] = {"embed.W_E": f("wte.weight")}
    for i in range(L):
        p, b = f"h.{i}.", f"blocks.{i}."
        _qkv_proj(sd, f, p + "attn.", b, H, H, dh)  # bias-free: no b_Q/b_K/b_V
        _block_rest(sd, f, p, b, H, dh, ("attn.out_proj", "mlp.fc_in", "mlp.fc_out", "ln_1", "ln_1"))
        _one_ln(sd, b)
    sd["ln_final.w"], sd["ln_final.b"] = f("ln_f.weight"), f("ln_f.bias")
    _lm_head(f, sd, "lm_head.weight")
    sd["unembed.b_U"] = f("lm_head.bias")
    cfg = LensConfig(
        n_layers=L, n_heads=H, d_model=d, d_head=dh, d_mlp=int(c.get("n_inner") or 4 * d),
        n_ctx=int(c["n_positions"]), d_vocab=int(c["vocab_size"]), act_fn=str(c.get("activation_function", "gelu_new")),
        eps=float(c.get("layer_norm_epsilon", 1e-5)), attn_only=False, original_architecture="GPTJForCausalLM",
        positional_embedding_type="rotary", rotary_dim=int(c["rotary_dim"]), rotary_adjacent_pairs=True,
        parallel_attn_mlp=True, shared_ln=True)
    return sd, cfg


def _llama_state(f: Callable[[str], Any], c: dict[str, Any]) -> tuple[dict[str, Any], LensConfig]:
    """Llama, Mistral, Qwen2: RMSNorm, full rotary, grouped-query attention, SwiGLU MLP."""
    sd, (d, H, L, dh, Hkv), blocks = _llama_blocks(f, c)
    m = "model."
    for p, b in blocks:
        sd[f"{b}attn.W_O"] = f(f"{p}self_attn.o_proj.weight").T.reshape(H, dh, d)
        sd[f"{b}attn.b_O"] = f(f"{p}self_attn.o_proj.bias")
        for k, proj in (("in", "up_proj"), ("gate", "gate_proj"), ("out", "down_proj")):
            sd[f"{b}mlp.W_{k}"], sd[f"{b}mlp.b_{k}"] = f(f"{p}mlp.{proj}.weight").T, f(f"{p}mlp.{proj}.bias")
        sd[f"{b}ln1.w"], sd[f"{b}ln2.w"] = f(f"{p}input_layernorm.weight"), f(f"{p}post_attention_layernorm.weight")
    sd["ln_final.w"] = f(m + "norm.weight")
    _lm_head(f, sd, "lm_head.weight")
    window = int(c.get("sliding_window") or 0) if c.get("model_type") == "mistral" else 0
    cfg = LensConfig(
        n_layers=L, n_heads=H, d_model=d, d_head=dh, d_mlp=int(c["intermediate_size"]),
        n_ctx=int(c["max_position_embeddings"]), d_vocab=int(c["vocab_size"]), act_fn=str(c.get("hidden_act", "silu")),
        eps=float(c.get("rms_norm_eps", 1e-6)), attn_only=False, normalization_type="RMS",
        original_architecture=str((c.get("architectures") or ["LlamaForCausalLM"])[0]),
        positional_embedding_type="rotary", rotary_dim=dh, rotary_base=_rope(c)[1], n_key_value_heads=Hkv,
        gated_mlp=True, windows=[window] * L if window else [])
    return sd, cfg


def _gemma_state(f: Callable[[str], Any], c: dict[str, Any]) -> tuple[dict[str, Any], LensConfig]:
    """Gemma and Gemma 2: Llama's parameter names and block (:func:`_llama_state`: rotary on
    every dimension in the halves layout, grouped-query attention, a gated MLP) with the token
    embedding times ``sqrt(d_model)`` (Hugging Face's ``embed_scale``, ``cfg.embed_scale``:
    ``hook_embed`` is the scaled embedding, ``W_E`` the checkpoint's table, as the bridge's),
    every RMSNorm's scale ``1 + w``, GeGLU
    (``gelu_pytorch_tanh``: Gemma's ``hidden_act``, Gemma 2's ``hidden_activation``). Gemma 2
    also: ``ln2`` is ``pre_feedforward_layernorm``, the attention and MLP outputs normalised
    (``post_attention_layernorm`` → ``ln1_post``, ``post_feedforward_layernorm`` →
    ``ln2_post``) before each is added to the residual, the scores divided by
    ``sqrt(query_pre_attn_scalar)`` (:func:`posmech.models.architecture.score_divisor`) and
    soft-capped (``attn_logit_softcapping``), the ``sliding_attention`` layers of
    ``layer_types`` seeing ``sliding_window`` keys, the logits soft-capped
    (``final_logit_softcapping``)."""
    import math

    from posmech.models.architecture import layer_windows

    sd, cfg = _llama_state(f, c)
    gemma2 = c.get("model_type") == "gemma2"
    L = cfg.n_layers
    if gemma2:
        for i in range(L):
            p, b = f"model.layers.{i}.", f"blocks.{i}."
            sd[f"{b}ln1_post.w"] = sd[f"{b}ln2.w"]  # post_attention_layernorm (read as ln2 by _llama_state)
            sd[f"{b}ln2.w"] = f(p + "pre_feedforward_layernorm.weight")
            sd[f"{b}ln2_post.w"] = f(p + "post_feedforward_layernorm.weight")
        windows = layer_windows(c, L)
        cfg.windows = windows if any(windows) else []
        cfg.post_norms = True
        for key, name in (("attn_logit_softcapping", "attn_scores_soft_cap"),
                          ("final_logit_softcapping", "output_logits_soft_cap")):
            cap = c.get(key)
            setattr(cfg, name, float(cap) if isinstance(cap, (int, float)) and cap > 0 else -1.0)
    for k in [k for k in sd if k.endswith((".ln1.w", ".ln2.w", "_post.w")) or k == "ln_final.w"]:
        sd[k] = 1.0 + sd[k]  # GemmaRMSNorm: x / rms · (1 + w)
    cfg.embed_scale = math.sqrt(cfg.d_model)
    cfg.act_fn = str((c.get("hidden_activation") if gemma2 else None) or c.get("hidden_act") or "gelu_pytorch_tanh")
    cfg.original_architecture = "Gemma2ForCausalLM" if gemma2 else "GemmaForCausalLM"
    return sd, cfg


#: BLOOM records no context length (ALiBi has no table of positions): the engine's limit
BLOOM_CONTEXT = 2048


def _bloom_state(f: Callable[[str], Any], c: dict[str, Any]) -> tuple[dict[str, Any], LensConfig]:
    """BLOOM: ALiBi, a LayerNorm on the token embedding, fused head-interleaved qkv."""
    d, H, L = int(c.get("hidden_size") or c["n_embed"]), int(c["n_head"]), int(c["n_layer"])
    dh = d // H
    sd: dict[str, Any] = {"embed.W_E": f("word_embeddings.weight"), "embed_ln.w": f("word_embeddings_layernorm.weight"),
                          "embed_ln.b": f("word_embeddings_layernorm.bias")}
    for i in range(L):
        p, b = f"h.{i}.", f"blocks.{i}."
        _fused_qkv(sd, b, f(f"{p}self_attention.query_key_value.weight"),
                   f(f"{p}self_attention.query_key_value.bias"), H, dh)
        _block_rest(sd, f, p, b, H, dh, ("self_attention.dense", "mlp.dense_h_to_4h", "mlp.dense_4h_to_h",
                                         "input_layernorm", "post_attention_layernorm"))
    sd["ln_final.w"], sd["ln_final.b"] = f("ln_f.weight"), f("ln_f.bias")
    _lm_head(f, sd, "lm_head.weight")
    cfg = LensConfig(
        n_layers=L, n_heads=H, d_model=d, d_head=dh, d_mlp=4 * d, n_ctx=int(c.get("seq_length") or BLOOM_CONTEXT),
        d_vocab=int(c["vocab_size"]), act_fn="gelu_new", eps=float(c.get("layer_norm_epsilon", 1e-5)), attn_only=False,
        original_architecture="BloomForCausalLM", positional_embedding_type="alibi", embed_ln=True)
    return sd, cfg


def hf_dir_reader(hf_dir: str | os.PathLike[str], framework: str = "pt") -> tuple[Callable[[str], Any], dict[str, Any]]:
    """``(get, config)`` of a Hugging Face model directory: ``get(name)`` reads one tensor from
    its safetensors file(s) on demand (names as in :func:`hf_state`, ``None`` if absent), so
    loading never holds the Hugging Face model and the engine's copy at once; ``framework``
    ``pt`` gives torch tensors, ``numpy`` numpy arrays (no torch needed); ``get.names`` is
    the set of names it has."""
    import json

    from safetensors import safe_open

    d = Path(hf_dir)
    config = json.loads((d / "config.json").read_text())
    index = d / "model.safetensors.index.json"
    files = (sorted({d / v for v in json.loads(index.read_text())["weight_map"].values()})
             if index.exists() else [d / "model.safetensors"])
    where: dict[str, tuple[Any, str]] = {}
    handles = [safe_open(str(p), framework=framework) for p in files]
    for h in handles:
        for k in h.keys():
            where[k.removeprefix("transformer.")] = (h, k)

    def get(name: str) -> Any:
        hit = where.get(name)
        return None if hit is None else hit[0].get_tensor(hit[1])

    get.names = frozenset(where)  # type: ignore[attr-defined]
    return get, config


def tl_legacy_config(cj: dict[str, Any]) -> LensConfig:
    """The config of a legacy TransformerLens checkpoint (its ``config.json``)."""
    return LensConfig(
        n_layers=int(cj["n_layers"]), n_heads=int(cj["n_heads"]), d_model=int(cj["d_model"]),
        d_head=int(cj["d_head"]), d_mlp=int(cj.get("d_mlp") or -1), n_ctx=int(cj["n_ctx"]),
        d_vocab=int(cj["d_vocab"]), act_fn=str(cj.get("act_fn") or ""), eps=float(cj.get("eps", 1e-5)),
        attn_only=bool(cj.get("attn_only", False)),
        normalization_type=str(cj.get("normalization_type", cj.get("normalization")) or "LN"),
        positional_embedding_type=str(cj.get("positional_embedding_type", "standard")),
        original_architecture=str(cj.get("original_architecture") or "neel"),
        tokenizer_name=cj.get("tokenizer_name"), use_attn_scale=bool(cj.get("use_attn_scale", True)),
        attn_scale=score_divisor(cj),
    )


def unsupported(model: Any = None, tl_config: dict[str, Any] | None = None) -> str | None:
    """Why the engine cannot run this model (None when it can): a Hugging Face model or a
    legacy TransformerLens ``config.json``."""
    if tl_config is not None:
        c = tl_config
        if str(c.get("normalization_type", c.get("normalization")) or "LN") != "LN":
            return f"normalization {c.get('normalization_type')!r} (only LN)"
        if str(c.get("positional_embedding_type", "standard")) != "standard" or c.get("shortformer_pos"):
            return "positions other than learned absolute ones added to the residual stream"
        if not c.get("attn_only") and c.get("act_fn") not in ACTIVATIONS:
            return f"activation {c.get('act_fn')!r}"
        if c.get("final_rms") or c.get("gated_mlp") or c.get("parallel_attn_mlp"):
            return "an unusual block (final RMS norm, gated MLP or parallel attention/MLP)"
        return None
    if model is None or getattr(model, "config", None) is None:
        return "no model"
    if type(model).__name__ not in ARCHITECTURES:
        return f"architecture {type(model).__name__} (the engine runs {', '.join(ARCHITECTURES)})"
    return unsupported_hf(model.config.to_dict())


def process(sd: dict[str, Any], cfg: LensConfig) -> dict[str, Any]:
    """The compatibility mode's weight processing, as TransformerLens's
    ``ProcessWeights.process_weights(fold_ln, center_writing_weights, center_unembed,
    fold_value_biases)`` does it (the engine's weights equal the bridge's to float32
    rounding: tests/models/test_lens.py, test_lens_archs.py), in float32, with new tensors
    only (the input's are never written):

    * fold each norm's scale ``w`` and bias ``b`` into the weights reading it
      (``b_Q += b · W_Q``, ``W_Q *= w``; with LayerNorm, ``W_Q`` then centred over
      ``d_model``; ``ln1`` into ``W_Q/W_K/W_V``, ``ln2`` into ``W_in`` (and ``W_gate``),
      ``ln_final`` into ``W_U``); an RMSNorm has a scale only, and its input is not centred,
      so only the scale is folded;
    * with LayerNorm, centre the weights writing to the residual stream over ``d_model``
      (``W_E``, ``W_pos``, ``W_O``, ``b_O``, ``W_out``, ``b_out``); BLOOM's embedding
      LayerNorm is kept (it is not folded: nothing but the residual stream reads it);
    * centre the unembedding over the vocabulary (``W_U``, ``b_U``), unless the logits are
      soft-capped (Gemma 2: a constant added before the cap changes the output; the bridge
      does not centre them either); Gemma 2's norms of the attention and MLP outputs
      (``ln1_post``, ``ln2_post``) are kept: nothing linear reads them;
    * fold the value biases into the output bias (``b_O += Σ_h b_V[h] · W_O[h]``, ``b_V =
      0``; with grouped-query attention query head ``h`` reads value head ``h // group``).
    Returns a new dict without the folded norms' weights. Not defined for post-LayerNorm
    blocks (OPT's ``do_layer_norm_before: false``: :func:`unsupported_hf`)."""
    import torch

    if cfg.post_ln:
        raise PosmechError("the compatibility mode's LayerNorm folding is defined for pre-LayerNorm blocks only; "
                           "use processing: raw")
    out = dict(sd)
    d = cfg.d_model
    rms = cfg.normalization_type == "RMS"
    centre = (lambda t, dim: t) if rms else (lambda t, dim: t - t.mean(dim, keepdim=True))  # noqa: E731
    group = cfg.n_heads // int(cfg.n_key_value_heads or cfg.n_heads)

    def ln(prefix: str) -> tuple[Any, Any] | None:
        w, b = out.pop(f"{prefix}.w", None), out.pop(f"{prefix}.b", None)
        if w is None and b is None:
            return None
        return (w if w is not None else torch.ones(d)), (b if b is not None else torch.zeros(d))

    for i in range(cfg.n_layers):
        a = f"blocks.{i}.attn."
        wb = ln(f"blocks.{i}.ln1")
        for n in "QKV":
            W = out[f"{a}W_{n}"]  # [H, d, dh]
            bias = out.get(f"{a}b_{n}")
            bias = bias if bias is not None else torch.zeros(W.shape[0], W.shape[2])
            if wb is not None:
                bias = bias + torch.einsum("hdk,d->hk", W, wb[1])
                W = W * wb[0][None, :, None]
            out[f"{a}W_{n}"], out[f"{a}b_{n}"] = centre(W, 1), bias
        if not cfg.attn_only:
            m = f"blocks.{i}.mlp."
            wb2 = ln(f"blocks.{i}.ln2")
            for k in ("in", "gate") if cfg.gated_mlp else ("in",):
                W_in, b_in = out[f"{m}W_{k}"], out.get(f"{m}b_{k}")
                b_in = b_in if b_in is not None else torch.zeros(cfg.d_mlp)
                if wb2 is not None:
                    b_in = b_in + wb2[1] @ W_in
                    W_in = W_in * wb2[0][:, None]
                out[f"{m}W_{k}"], out[f"{m}b_{k}"] = centre(W_in, 0), b_in
            out[f"{m}W_out"] = centre(out[f"{m}W_out"], -1)
            b_out = out.get(f"{m}b_out")
            out[f"{m}b_out"] = centre(b_out if b_out is not None else torch.zeros(d), -1)
        W_O = centre(out[f"{a}W_O"], -1)  # [H, dh, d]
        b_O = out.get(f"{a}b_O")
        b_O = centre(b_O if b_O is not None else torch.zeros(d), -1)
        out[f"{a}W_O"] = W_O
        b_V = out[f"{a}b_V"].repeat_interleave(group, 0) if group > 1 else out[f"{a}b_V"]
        out[f"{a}b_O"] = b_O + torch.einsum("hk,hkd->d", b_V, W_O)
        out[f"{a}b_V"] = torch.zeros_like(out[f"{a}b_V"])
    W_U, b_U = out["unembed.W_U"], out.get("unembed.b_U")
    b_U = b_U if b_U is not None else torch.zeros(cfg.d_vocab)
    wbf = ln("ln_final")
    if wbf is not None:
        b_U = b_U + wbf[1] @ W_U
        W_U = W_U * wbf[0][:, None]
    W_U = centre(W_U, 0)
    if cfg.output_logits_soft_cap > 0:  # soft-capped logits change with a constant: not centred (the bridge's)
        out["unembed.W_U"], out["unembed.b_U"] = W_U, b_U
    else:
        out["unembed.W_U"], out["unembed.b_U"] = W_U - W_U.mean(-1, keepdim=True), b_U - b_U.mean(-1, keepdim=True)
    out["embed.W_E"] = centre(out["embed.W_E"], -1)
    if "pos_embed.W_pos" in out:
        out["pos_embed.W_pos"] = centre(out["pos_embed.W_pos"], -1)
    return out


# --------------------------------------------------------------------------- the engine
class DeferredTokenizer:
    """A tokenizer loaded on first use: ``load()`` is called when :attr:`Lens.tokenizer` is
    first read. Loading a Hugging Face tokenizer imports ``transformers`` (~1.3 CPU s), which
    most analyses, reading pre-tokenised documents, never need."""

    def __init__(self, load: Callable[[], Any]) -> None:
        self.load = load


class Lens:
    """A hooked GPT-2-style transformer (see the module docstring).

    ``sd``: a TransformerLens-format state dict (raw); ``processing``: ``compatibility`` or
    ``raw``; ``device``/``dtype``: where and in which precision the forward runs."""

    def __init__(self, sd: dict[str, Any], cfg: LensConfig, tokenizer: Any = None, processing: str = "compatibility",
                 device: str = "cpu", dtype: str = "float32", copy: bool = True) -> None:
        import torch

        if processing not in ("compatibility", "raw"):
            raise PosmechError(f"unknown processing mode {processing!r}; expected `compatibility` or `raw`")
        self.processing, self._tokenizer = processing, tokenizer
        #: the Hugging Face config (``config.to_dict()``) of the model the weights came from ({} if none)
        self.hf_config: dict[str, Any] = {}
        self.compatibility_mode = processing == "compatibility"
        self._tree: tuple[Any, Any] | None = None  # (positions, visible) of the running pass, if a tree
        tdtype = getattr(torch, dtype)
        cfg.device, cfg.dtype = torch.device(device), tdtype
        self.cfg = cfg
        if self.compatibility_mode:
            sd = process(sd, cfg)
        L, H, d, dh = cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.d_head
        # processed tensors are new; raw ones may be views of the caller's (``copy``: never share them)
        own = copy and not self.compatibility_mode
        P = lambda t: torch.nn.Parameter(t.detach().to(device=device, dtype=tdtype, copy=own).contiguous(),  # noqa: E731
                                         requires_grad=False)

        def opt(key: str, shape: tuple[int, ...], fill: float = 0.0) -> Any:
            t = sd.get(key)
            return t if t is not None else torch.full(shape, fill)

        # fused layouts for the forward; TransformerLens-shaped views for the analyses
        Hkv = int(cfg.n_key_value_heads or H)
        #: columns of the fused qkv output: ``[q | k | v]``, ``H·dh``, ``Hkv·dh``, ``Hkv·dh``
        self._qkv_cols = (H * dh, Hkv * dh, Hkv * dh)
        self.params: dict[str, Any] = {"embed.W_E": P(sd["embed.W_E"])}
        if cfg.positional_embedding_type == "standard":
            self.params["pos_embed.W_pos"] = P(sd["pos_embed.W_pos"])
        if cfg.embed_ln:  # never folded (process keeps it)
            self.params["embed_ln.w"] = P(opt("embed_ln.w", (d,), 1.0))
            self.params["embed_ln.b"] = P(opt("embed_ln.b", (d,)))
        rms = cfg.normalization_type == "RMS"
        for i in range(L):
            heads = {"Q": H, "K": Hkv, "V": Hkv}
            W = torch.cat([sd[f"blocks.{i}.attn.W_{n}"].permute(1, 0, 2).reshape(d, h * dh) for n, h in heads.items()], 1)
            b = torch.cat([opt(f"blocks.{i}.attn.b_{n}", (h, dh)).reshape(h * dh) for n, h in heads.items()], 0)
            self.params[f"blocks.{i}.attn.W_QKV"] = P(W)
            self.params[f"blocks.{i}.attn.b_QKV"] = P(b)
            self.params[f"blocks.{i}.attn.W_O"] = P(sd[f"blocks.{i}.attn.W_O"].reshape(H * dh, d))
            self.params[f"blocks.{i}.attn.b_O"] = P(opt(f"blocks.{i}.attn.b_O", (d,)))
            lns = ("ln1",) if cfg.attn_only else ("ln1", "ln2")
            if not cfg.attn_only:
                M = cfg.d_mlp
                if cfg.gated_mlp:  # [gate | in] in one product
                    self.params[f"blocks.{i}.mlp.W_gate_in"] = P(torch.cat(
                        [sd[f"blocks.{i}.mlp.W_gate"], sd[f"blocks.{i}.mlp.W_in"]], 1))
                    self.params[f"blocks.{i}.mlp.b_gate_in"] = P(torch.cat(
                        [opt(f"blocks.{i}.mlp.b_gate", (M,)), opt(f"blocks.{i}.mlp.b_in", (M,))], 0))
                    keys: tuple[tuple[str, Any], ...] = (("W_out", None), ("b_out", (d,)))
                else:
                    keys = (("W_in", None), ("b_in", (M,)), ("W_out", None), ("b_out", (d,)))
                for k, shape in keys:
                    key = f"blocks.{i}.mlp.{k}"
                    self.params[key] = P(sd[key] if shape is None else opt(key, shape))
            for ln in ("ln1_post", "ln2_post") if cfg.post_norms else ():  # never folded
                self.params[f"blocks.{i}.{ln}.w"] = P(opt(f"blocks.{i}.{ln}.w", (d,), 1.0))
            for ln in lns:
                if not self.compatibility_mode:
                    self.params[f"blocks.{i}.{ln}.w"] = P(opt(f"blocks.{i}.{ln}.w", (d,), 1.0))
                    if not rms:
                        self.params[f"blocks.{i}.{ln}.b"] = P(opt(f"blocks.{i}.{ln}.b", (d,)))
        if not self.compatibility_mode and cfg.final_ln:
            self.params["ln_final.w"] = P(opt("ln_final.w", (d,), 1.0))
            if not rms:
                self.params["ln_final.b"] = P(opt("ln_final.b", (d,)))
        self.params["unembed.W_U"] = P(sd["unembed.W_U"])
        self.params["unembed.b_U"] = P(opt("unembed.b_U", (cfg.d_vocab,)))
        self._act = _act(cfg.act_fn) if not cfg.attn_only else None
        #: per pass: ``(cos, sin)`` ``[1, T, rotary_dim]`` (rotary) and ALiBi's bias ``[H, 1, T]``
        self._rope: tuple[Any, Any] | None = None
        self._rope_layer: tuple[Any, Any] | None = None
        self._alibi: Any = None
        self._alibi_mask: Any = None
        if cfg.positional_embedding_type == "alibi":
            from posmech.models.scores import alibi_slopes

            self._slopes = torch.as_tensor(alibi_slopes(H), dtype=torch.float32, device=device)
        names = ["hook_embed"]
        if cfg.positional_embedding_type == "standard":
            names.append("hook_pos_embed")
        if cfg.embed_ln:
            names += [f"embed_ln.hook_{n}" for n in ("in", "scale", "normalized", "out")]
        if cfg.final_ln:
            names += [f"ln_final.hook_{n}" for n in ("in", "scale", "normalized", "out")]
        attn_hooks = ["q", "k", "v", "attn_scores", "pattern", "z", "result"]
        if cfg.rotary_dim:
            attn_hooks += ["cos", "sin"]
        for i in range(L):
            names += [f"blocks.{i}.{n}" for n in ("hook_resid_pre", "hook_resid_post")]
            names += [f"blocks.{i}.attn.hook_{n}" for n in attn_hooks]
            lns = ("ln1",) if cfg.attn_only else ("ln1", "ln2")
            lns += ("ln1_post", "ln2_post") if cfg.post_norms else ()
            names += [f"blocks.{i}.{ln}.hook_{n}" for ln in lns for n in ("in", "scale", "normalized", "out")]
            if not cfg.attn_only:
                names += [f"blocks.{i}.mlp.hook_pre", f"blocks.{i}.mlp.hook_post"]
                if cfg.gated_mlp:
                    names.append(f"blocks.{i}.mlp.hook_pre_linear")
                if not cfg.parallel_attn_mlp:
                    names.append(f"blocks.{i}.hook_resid_mid")
        self.hook_dict: dict[str, HookPoint] = {n: HookPoint(n) for n in names}

    # ------------------------------------------------------------------ torch-like surface
    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer (``None`` if it has none), loaded on first use when deferred."""
        if isinstance(self._tokenizer, DeferredTokenizer):
            self._tokenizer = self._tokenizer.load()
        return self._tokenizer

    @tokenizer.setter
    def tokenizer(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer

    def parameters(self) -> Iterator[Any]:
        return iter(self.params.values())

    def named_parameters(self) -> Iterator[tuple[str, Any]]:
        return iter(self.params.items())

    def state_dict(self) -> dict[str, Any]:
        return dict(self.params)

    def eval(self) -> Lens:
        return self

    def __repr__(self) -> str:
        c = self.cfg
        return (f"Lens({c.n_layers} layers × {c.n_heads} heads, d_model {c.d_model}, n_ctx {c.n_ctx}, "
                f"{self.processing}, {c.device})")

    # ------------------------------------------------------------------ weights, TL shapes
    def _stack(self, fn: Callable[[int], Any]) -> Any:
        import torch

        return torch.stack([fn(i) for i in range(self.cfg.n_layers)], 0)

    def _qkv(self, j: int, bias: bool) -> Any:
        """``W_Q``/``W_K``/``W_V`` (``j`` 0, 1, 2) ``[n_layers, heads, d_model, d_head]`` or
        their biases; key and value heads are ``n_key_value_heads`` (grouped-query
        attention: not repeated, as the bridge's)."""
        dh = self.cfg.d_head
        start = sum(self._qkv_cols[:j])
        cols = slice(start, start + self._qkv_cols[j])
        h = self._qkv_cols[j] // dh
        if bias:
            return self._stack(lambda i: self.params[f"blocks.{i}.attn.b_QKV"][cols].view(h, dh))
        return self._stack(lambda i: self.params[f"blocks.{i}.attn.W_QKV"][:, cols].reshape(-1, h, dh).permute(1, 0, 2))

    def _gated(self, j: int, bias: bool) -> Any:
        M = self.cfg.d_mlp
        if bias:
            return self._stack(lambda i: self.params[f"blocks.{i}.mlp.b_gate_in"][j * M:(j + 1) * M])
        return self._stack(lambda i: self.params[f"blocks.{i}.mlp.W_gate_in"][:, j * M:(j + 1) * M])

    def _mlp_in(self, bias: bool) -> Any:
        if self.cfg.gated_mlp:
            return self._gated(1, bias)
        return self._stack(lambda i: self.params[f"blocks.{i}.mlp.{'b_in' if bias else 'W_in'}"])

    @property
    def W_pos(self) -> Any:
        """The learned positions ``[n_ctx, d_model]`` (the live parameter); AttributeError
        for a model without them (rotary, ALiBi), as the bridge."""
        if "pos_embed.W_pos" not in self.params:
            raise AttributeError(f"W_pos: the model has no learned positional embedding "
                                 f"({self.cfg.positional_embedding_type} positions)")
        return self.params["pos_embed.W_pos"]

    @property
    def W_gate(self) -> Any:
        if not self.cfg.gated_mlp:
            raise AttributeError("W_gate: the model's MLP is not gated")
        return self._gated(0, False)

    W_Q = property(lambda self: self._qkv(0, False))
    W_K = property(lambda self: self._qkv(1, False))
    W_V = property(lambda self: self._qkv(2, False))
    b_Q = property(lambda self: self._qkv(0, True))
    b_K = property(lambda self: self._qkv(1, True))
    b_V = property(lambda self: self._qkv(2, True))
    W_O = property(lambda self: self._stack(
        lambda i: self.params[f"blocks.{i}.attn.W_O"].view(self.cfg.n_heads, self.cfg.d_head, self.cfg.d_model)))
    b_O = property(lambda self: self._stack(lambda i: self.params[f"blocks.{i}.attn.b_O"]))
    W_in = property(lambda self: self._mlp_in(False))
    b_in = property(lambda self: self._mlp_in(True))
    W_out = property(lambda self: self._stack(lambda i: self.params[f"blocks.{i}.mlp.W_out"]))
    b_out = property(lambda self: self._stack(lambda i: self.params[f"blocks.{i}.mlp.b_out"]))
    W_E = property(lambda self: self.params["embed.W_E"])
    W_U = property(lambda self: self.params["unembed.W_U"])
    b_U = property(lambda self: self.params["unembed.b_U"])

    # ------------------------------------------------------------------ hooks
    def _points(self, name: str | Callable[[str], bool]) -> list[HookPoint]:
        if callable(name):
            return [hp for n, hp in self.hook_dict.items() if name(n)]
        if name not in self.hook_dict:
            raise PosmechError(f"hook {name!r} does not exist in the posmech engine's model "
                               f"({self!r}); its hook points are listed in posmech.models.lens")
        return [self.hook_dict[name]]

    @contextlib.contextmanager
    def hooks(self, fwd_hooks: Sequence[tuple[Any, Callable[..., Any]]] = (), bwd_hooks: Sequence[Any] = (),
              reset_hooks_end: bool = True) -> Iterator[Lens]:
        """Register ``fwd_hooks`` for the block; removed on exit, also on error."""
        if bwd_hooks:
            raise PosmechError("the posmech engine runs inference only: no backward hooks")
        added: list[tuple[HookPoint, Callable[..., Any]]] = []
        try:
            for name, fn in fwd_hooks:
                for hp in self._points(name):
                    hp.fwd_hooks.append(fn)
                    added.append((hp, fn))
            yield self
        finally:
            if reset_hooks_end:
                for hp, fn in reversed(added):
                    hp.fwd_hooks.remove(fn)

    def reset_hooks(self) -> None:
        for hp in self.hook_dict.values():
            hp.fwd_hooks.clear()

    def run_with_hooks(self, tokens: Any, fwd_hooks: Sequence[tuple[Any, Callable[..., Any]]] = (),
                       return_type: str | None = "logits", **kwargs: Any) -> Any:
        with self.hooks(fwd_hooks=fwd_hooks):
            return self(tokens, return_type=return_type, **kwargs)

    def run_with_cache(self, tokens: Any, names_filter: Any = None, return_type: str | None = "logits",
                       **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        """``(output, {hook name: tensor})`` for the hooks ``names_filter`` selects (a name, a
        list of names, a predicate; None: every hook point, which makes every tensor)."""
        if names_filter is None:
            names: list[str] = list(self.hook_dict)
        elif callable(names_filter):
            names = [n for n in self.hook_dict if names_filter(n)]
        else:
            names = [names_filter] if isinstance(names_filter, str) else list(names_filter)
        cache: dict[str, Any] = {}

        def keep(t: Any, hook: HookPoint) -> None:
            cache[hook.name] = t.detach()

        out = self.run_with_hooks(tokens, fwd_hooks=[(n, keep) for n in names], return_type=return_type, **kwargs)
        return out, cache

    def _fire(self, name: str, t: Any) -> Any:
        hp = self.hook_dict[name]
        for fn in hp.fwd_hooks:
            out = fn(t, hook=hp)
            if out is not None:
                t = out
        return t

    def _hooked(self, name: str) -> bool:
        return bool(self.hook_dict[name].fwd_hooks)

    # ------------------------------------------------------------------ forward
    def _ln(self, prefix: str, x: Any) -> Any:
        """LayerNorm with TransformerLens's hooks: ``hook_scale`` = sqrt(var + eps) of the
        centred input; in the compatibility mode its scale and bias are folded away. RMSNorm
        (``normalization_type`` RMS): the input is not centred, ``hook_scale`` = sqrt(mean
        x² + eps), only a scale (folded in the compatibility mode)."""
        x = self._fire(f"{prefix}.hook_in", x)
        rms = self.cfg.normalization_type == "RMS"
        if not rms:
            x = x - x.mean(-1, keepdim=True)
        scale = self._fire(f"{prefix}.hook_scale", (x.pow(2).mean(-1, keepdim=True) + self.cfg.eps).sqrt())
        x = self._fire(f"{prefix}.hook_normalized", x / scale)
        if not self.compatibility_mode or prefix == "embed_ln" or prefix.endswith("_post"):
            x = x * self.params[f"{prefix}.w"] if rms else x * self.params[f"{prefix}.w"] + self.params[f"{prefix}.b"]
        return self._fire(f"{prefix}.hook_out", x)

    def _ln_hooked(self, i: int) -> bool:
        """A hook on block ``i``'s ``ln1`` or ``ln2`` (then a shared LayerNorm is run as two)."""
        return any(self._hooked(f"blocks.{i}.{ln}.hook_{n}") for ln in ("ln1", "ln2")
                   for n in ("in", "scale", "normalized", "out"))

    def _rotate(self, x: Any) -> Any:
        """Rotary embedding of ``x [B, T, heads, d_head]`` on its first ``rotary_dim``
        dimensions (GPT-NeoX's and Llama's ``rotate_half`` convention, GPT-J's adjacent pairs
        with ``rotary_adjacent_pairs``: :func:`posmech.models.scores.rotate`), the rest unchanged."""
        from posmech.models.scores import rotate

        cos, sin = self._rope_layer
        return rotate(x, cos, sin, self.cfg.rotary_adjacent_pairs)

    def _attention(self, i: int, x: Any) -> Any:
        import torch

        c = self.cfg
        B, T, _ = x.shape
        H, dh = c.n_heads, c.d_head
        nq, nk, _nv = self._qkv_cols
        Hkv = nk // dh
        pre = f"blocks.{i}.attn."
        qkv = torch.addmm(self.params[pre + "b_QKV"], x.reshape(B * T, -1), self.params[pre + "W_QKV"])
        q = self._fire(pre + "hook_q", qkv[:, :nq].view(B, T, H, dh))
        k = self._fire(pre + "hook_k", qkv[:, nq:nq + nk].view(B, T, Hkv, dh))
        v = self._fire(pre + "hook_v", qkv[:, nq + nk:].view(B, T, Hkv, dh))
        if c.rotary_dim:  # hook_q/hook_k are before the rotation, as the bridge records them
            self._rope_layer = (self._fire(pre + "hook_cos", self._rope[0]), self._fire(pre + "hook_sin", self._rope[1]))
            q, k = self._rotate(q), self._rotate(k)
        qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))  # [B, heads, T, dh]
        alibi = self._alibi  # [H, 1, T]: m_h · key position (BLOOM's), or None
        window = c.windows[i] if c.windows else 0
        hidden = None  # [T, T] True where a query may not see a key (beyond causal: local layers, trees)
        if self._tree is not None:
            positions, visible = self._tree
            hidden = ~visible
            if window:
                hidden = hidden | ((positions[:, None] - positions[None, :]) >= window)
        elif window and window < T:
            hidden = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            hidden |= torch.ones(T, T, dtype=torch.bool, device=x.device).tril(-window)
        cap = c.attn_scores_soft_cap if c.attn_scores_soft_cap > 0 else None  # Gemma 2: no fused kernel caps
        explicit = self._hooked(pre + "hook_attn_scores") or self._hooked(pre + "hook_pattern") or cap is not None
        if explicit and Hkv != H:  # grouped key/value heads, repeated for each query head
            kh, vh = kh.repeat_interleave(H // Hkv, dim=1), vh.repeat_interleave(H // Hkv, dim=1)
        if hidden is None and not self._hooked(pre + "hook_attn_scores") and explicit and T > 2 * QUERY_BLOCK:
            z = self._causal_pattern_blocks(pre, qh, kh, vh, alibi, cap)
        elif explicit:
            # the scale applied to q ([.., T, d_head]), not to the [.., T, T] scores; masked in place
            scores = torch.matmul(qh * (1.0 / c.attn_scale), kh.transpose(-2, -1))
            if alibi is not None:
                scores = scores + alibi
            if cap is not None:  # c·tanh(s / c), before the mask (Gemma 2's eager attention)
                scores = torch.tanh(scores * (1.0 / cap)).mul_(cap)
            if hidden is None:
                hidden = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            fill = -torch.inf if self.compatibility_mode else torch.finfo(scores.dtype).min
            scores = self._fire(pre + "hook_attn_scores", scores.masked_fill_(hidden, fill))
            pattern = self._fire(pre + "hook_pattern", torch.softmax(scores, dim=-1))
            z = torch.matmul(pattern.to(vh.dtype), vh)
        else:
            gqa = {"enable_gqa": True} if Hkv != H else {}
            if alibi is not None:
                mask = self._alibi_mask  # the same for every layer of the pass (BLOOM has no windows)
                if mask is None or window:
                    seen = ~hidden if hidden is not None else torch.ones(T, T, dtype=torch.bool,
                                                                         device=x.device).tril()
                    mask = alibi.masked_fill(~seen, -torch.inf)  # [H, T, T]
                    self._alibi_mask = None if window else mask
                z = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask,
                                                                     scale=1.0 / c.attn_scale, **gqa)
            elif hidden is not None:
                z = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, attn_mask=~hidden,
                                                                     scale=1.0 / c.attn_scale, **gqa)
            else:
                z = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, is_causal=True,
                                                                     scale=1.0 / c.attn_scale, **gqa)
        z = self._fire(pre + "hook_z", z.transpose(1, 2))  # [B, T, H, dh]
        W_O, b_O = self.params[pre + "W_O"], self.params[pre + "b_O"]
        if self._hooked(pre + "hook_result"):
            result = torch.einsum("bthe,hed->bthd", z, W_O.view(H, dh, -1))
            result = self._fire(pre + "hook_result", result)
            return result.sum(2) + b_O
        return torch.addmm(b_O, z.reshape(B * T, H * dh), W_O).view(B, T, -1)

    def _causal_pattern_blocks(self, pre: str, qh: Any, kh: Any, vh: Any, alibi: Any = None,
                               cap: float | None = None) -> Any:
        """Causal attention with ``hook_pattern`` hooked (and not the scores): the pattern
        ``[B, H, T, T]`` is made a block of :data:`QUERY_BLOCK` queries at a time, each
        against the keys it can see only (its scores, softmax and ``pattern @ v`` skip the
        future triangle: ~55 % of the work of the whole square at T = 1024); the future
        triangle stays exactly 0. The hooks see the whole pattern; if one replaces it (or
        writes above the diagonal), ``z`` is the whole ``pattern @ v``. Equal to the square
        computation to float32 rounding. ``alibi [H, 1, T]``: a bias added to the scores;
        ``cap``: scores soft-capped ``cap·tanh(s / cap)`` (Gemma 2)."""
        import torch

        B, H, T, _ = qh.shape
        q = qh * (1.0 / self.cfg.attn_scale)
        pattern = qh.new_zeros(B, H, T, T)
        fill = -torch.inf if self.compatibility_mode else torch.finfo(qh.dtype).min
        for a in range(0, T, QUERY_BLOCK):
            e = min(a + QUERY_BLOCK, T)
            s = torch.matmul(q[:, :, a:e], kh[:, :, :e].transpose(-2, -1))  # [B, H, e-a, e]
            if alibi is not None:
                s += alibi[..., :e]
            if cap is not None:
                s = torch.tanh(s * (1.0 / cap)).mul_(cap)
            s[..., a:].masked_fill_(torch.ones(e - a, e - a, dtype=torch.bool, device=qh.device).triu(1), fill)
            pattern[:, :, a:e, :e] = torch.softmax(s, dim=-1)
        hooked = self._fire(pre + "hook_pattern", pattern)
        if hooked is not pattern or any(bool(pattern[:, :, a : a + QUERY_BLOCK, a + QUERY_BLOCK :].any())
                                        for a in range(0, T - QUERY_BLOCK, QUERY_BLOCK)):
            return torch.matmul(hooked.to(vh.dtype), vh)  # replaced, or edited above the diagonal
        return torch.cat([torch.matmul(pattern[:, :, a : a + QUERY_BLOCK, : a + QUERY_BLOCK], vh[:, :, : a + QUERY_BLOCK])
                          for a in range(0, T, QUERY_BLOCK)], dim=2)

    def _mlp(self, i: int, x: Any) -> Any:
        import torch

        B, T, _ = x.shape
        pre = f"blocks.{i}.mlp."
        if self.cfg.gated_mlp:  # SwiGLU: hook_pre is the gate's input to the activation, hook_pre_linear W_in's
            M = self.cfg.d_mlp
            gi = torch.addmm(self.params[pre + "b_gate_in"], x.reshape(B * T, -1), self.params[pre + "W_gate_in"])
            gate = self._fire(pre + "hook_pre", gi[:, :M].view(B, T, M))
            lin = self._fire(pre + "hook_pre_linear", gi[:, M:].view(B, T, M))
            h = self._fire(pre + "hook_post", self._act(gate) * lin)
        else:
            h = torch.addmm(self.params[pre + "b_in"], x.reshape(B * T, -1), self.params[pre + "W_in"]).view(B, T, -1)
            h = self._fire(pre + "hook_pre", h)
            h = self._fire(pre + "hook_post", self._act(h))
        return torch.addmm(self.params[pre + "b_out"], h.reshape(B * T, -1), self.params[pre + "W_out"]).view(B, T, -1)

    def last_hooked_layer(self) -> int:
        """The last block whose hooks can be observed (−1: only the embeddings; ``n_layers``:
        the final LayerNorm is hooked)."""
        last = -1
        for name, hp in self.hook_dict.items():
            if hp.fwd_hooks:
                if name.startswith("ln_final."):
                    return self.cfg.n_layers
                if name.startswith("blocks."):
                    last = max(last, int(name.split(".")[1]))
        return last

    #: ``__call__`` takes ``positions``/``visible``: several continuations of one prefix in one pass
    runs_token_trees = True

    def __call__(self, tokens: Any, return_type: str | None = "logits", stop_at_layer: int | None = None,
                 positions: Any = None, visible: Any = None, **kwargs: Any) -> Any:
        """Run the model on ``tokens [B, T]`` (or ``[T]``) of ids; ``return_type``: ``logits``
        ``[B, T, d_vocab]`` or None (then the pass stops after the last hooked block).
        ``stop_at_layer``: run blocks ``< stop_at_layer`` and return the residual stream.

        A *token tree* (both or neither given): ``positions [T]`` int, the position of each
        token (its ``W_pos`` row), and ``visible [T, T]`` bool, True where query ``t`` may
        attend to key ``s`` (a subset of ``s <= t`` holding the diagonal).  Several
        continuations of one prefix then run in one pass, the prefix once: a token whose
        visible keys are exactly the earlier tokens of its own sequence, at their positions,
        gets the values it gets in a pass of that sequence alone (to float32 rounding)."""
        import torch

        if (positions is None) != (visible is None):
            raise PosmechError("a token tree needs both `positions` and `visible`")
        if return_type not in ("logits", None):
            raise PosmechError(f"return_type {return_type!r} is not supported by the posmech engine "
                               "(use 'logits' or None)")
        if kwargs.get("attention_mask") is not None or kwargs.get("past_kv_cache") is not None:
            raise PosmechError("the posmech engine takes unpadded sequences only (no attention mask, no KV cache)")
        x = torch.as_tensor(tokens, device=self.cfg.device)
        if x.ndim == 1:
            x = x[None]
        B, T = x.shape
        tree = None
        if positions is not None:
            tree = (torch.as_tensor(positions, device=x.device).long(),
                    torch.as_tensor(visible, device=x.device).bool())
            causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            if tree[0].shape != (T,) or tree[1].shape != (T, T) or bool((tree[1] & ~causal).any()) \
                    or not bool(tree[1].diagonal().all()):
                raise PosmechError(f"token tree: `positions` must be [{T}] and `visible` a [{T}, {T}] subset of the "
                                   "causal mask that holds its diagonal")
            n_pos = int(tree[0].max()) + 1 if T else 0
        else:
            n_pos = T
        if n_pos > self.cfg.n_ctx:
            raise PosmechError(f"{n_pos} positions is more than the model's context ({self.cfg.n_ctx})")
        count_forward(B, T)
        self._tree = tree
        try:
            return self._forward(x, return_type, stop_at_layer)
        finally:
            self._tree = None

    def _position_terms(self, T: int, device: Any) -> None:
        """This pass's rotary ``cos, sin`` ``[1, T, rotary_dim]`` (float32, as Hugging Face
        computes them: ``inv_freq = base^(-2j/r)``, angles ``position · inv_freq``, each
        frequency twice) or ALiBi's bias ``m_h · key position`` ``[H, 1, T]`` (BLOOM's
        ``build_alibi_tensor``); token trees use their positions."""
        import torch

        c = self.cfg
        pos = self._tree[0] if self._tree is not None else torch.arange(T, device=device)
        self._rope, self._alibi, self._alibi_mask = None, None, None
        if c.rotary_dim:
            cos, sin = self._rotary_terms(pos)
            self._rope = (cos[None], sin[None])
        if c.positional_embedding_type == "alibi":
            self._alibi = (self._slopes[:, None] * pos.float()[None, :])[:, None, :].to(c.dtype)

    def _rotary_terms(self, pos: Any) -> tuple[Any, Any]:
        """Rotary ``(cos, sin)`` ``[len(pos), rotary_dim]`` of integer positions ``pos``."""
        import torch

        c = self.cfg
        r = c.rotary_dim
        inv = 1.0 / (c.rotary_base ** (torch.arange(0, r, 2, dtype=torch.int64, device=pos.device).float() / r))
        ang = pos.float()[:, None] * inv[None, :]
        # each frequency twice: in a row for adjacent pairs (GPT-J), else the halves one after the other
        emb = ang.repeat_interleave(2, -1) if c.rotary_adjacent_pairs else torch.cat((ang, ang), -1)
        return emb.cos().to(c.dtype), emb.sin().to(c.dtype)

    @property
    def rotary_emb(self) -> Callable[[Any, Any], tuple[Any, Any]] | None:
        """For a rotary model, ``rotary_emb(x, position_ids [B, n])`` → ``(cos, sin)`` ``[B,
        n, rotary_dim]`` (the call of Hugging Face's rotary embedding module, which the
        bridge exposes under this name: ``posmech.analyses.kernels.rotary_tables``); None
        without rotary."""
        if not self.cfg.rotary_dim:
            return None

        def emb(x: Any, position_ids: Any) -> tuple[Any, Any]:
            import torch

            terms = [self._rotary_terms(row) for row in torch.as_tensor(position_ids)]
            return torch.stack([t[0] for t in terms]), torch.stack([t[1] for t in terms])

        return emb

    def _forward(self, x: Any, return_type: str | None, stop_at_layer: int | None) -> Any:
        import torch

        c = self.cfg
        B, T = x.shape
        tree = self._tree
        last = c.n_layers if return_type == "logits" else self.last_hooked_layer()
        if stop_at_layer is not None:  # the residual is returned: every block below it runs
            last = min(c.n_layers, int(stop_at_layer)) - 1
        self._position_terms(T, x.device)
        if c.embed_ln:  # BLOOM: hook_embed is the normalised embedding (the bridge's)
            resid = self._fire("hook_embed", self._ln("embed_ln", self.params["embed.W_E"][x]))
        elif c.embed_scale != 1.0:  # Gemma: times sqrt(d_model), in the weights' dtype
            resid = self._fire("hook_embed", self.params["embed.W_E"][x] * torch.tensor(c.embed_scale, dtype=c.dtype))
        else:
            resid = self._fire("hook_embed", self.params["embed.W_E"][x])
        if c.positional_embedding_type == "standard":
            W_pos = self.params["pos_embed.W_pos"]
            pos = self._fire("hook_pos_embed", (W_pos[:T] if tree is None else W_pos[tree[0]]).expand(B, T, -1))
            resid = resid + pos
        for i in range(min(last + 1, c.n_layers)):
            b = f"blocks.{i}."
            resid = self._fire(b + "hook_resid_pre", resid)
            if c.attn_only:
                resid = resid + self._attention(i, self._ln(b + "ln1", resid))
            elif c.post_ln:  # OPT without do_layer_norm_before: each norm after its residual addition
                resid = self._fire(b + "hook_resid_mid", self._ln(b + "ln1", resid + self._attention(i, resid)))
                resid = self._ln(b + "ln2", resid + self._mlp(i, resid))
            elif c.parallel_attn_mlp:  # GPT-NeoX: attention and MLP read the same residual
                x1 = self._ln(b + "ln1", resid)
                attn_out = self._attention(i, x1)
                x2 = x1 if c.shared_ln and not self._ln_hooked(i) else self._ln(b + "ln2", resid)
                resid = resid + attn_out + self._mlp(i, x2)
            elif c.post_norms:  # Gemma 2: each output normalised before it is added
                attn_out = self._ln(b + "ln1_post", self._attention(i, self._ln(b + "ln1", resid)))
                resid = self._fire(b + "hook_resid_mid", resid + attn_out)
                resid = resid + self._ln(b + "ln2_post", self._mlp(i, self._ln(b + "ln2", resid)))
            else:
                resid = self._fire(b + "hook_resid_mid", resid + self._attention(i, self._ln(b + "ln1", resid)))
                resid = resid + self._mlp(i, self._ln(b + "ln2", resid))
            resid = self._fire(b + "hook_resid_post", resid)
        self._alibi_mask = None
        if stop_at_layer is not None:
            return resid
        if last < c.n_layers:
            return None
        normed = self._ln("ln_final", resid) if c.final_ln else resid
        if return_type is None:
            return None
        logits = torch.matmul(normed, self.params["unembed.W_U"]) + self.params["unembed.b_U"]
        cap = c.output_logits_soft_cap
        return torch.tanh(logits * (1.0 / cap)).mul_(cap) if cap > 0 else logits


# --------------------------------------------------------------------------- constructors
def from_hf(model: Any, tokenizer: Any = None, processing: str = "compatibility", device: str = "cpu",
            dtype: str = "float32") -> Lens:
    """The engine for a Hugging Face model of :data:`ARCHITECTURES` in memory (its weights
    are read, never written)."""
    why = unsupported(model=model) or unsupported_hf(model.config.to_dict(), processing)
    if why:
        raise PosmechError(f"the posmech engine does not run this model: {why}; use `engine: bridge`")
    state = {k.removeprefix("transformer."): v for k, v in model.state_dict().items()}
    config = model.config.to_dict()
    sd, cfg = hf_state(state.get, config)
    lens = Lens(sd, cfg, tokenizer, processing, device, dtype, copy=True)
    lens.hf_config = config
    return lens


def from_hf_dir(hf_dir: str | os.PathLike[str], tokenizer: Any = None, processing: str = "compatibility",
                device: str = "cpu", dtype: str = "float32") -> Lens:
    """The engine for a Hugging Face directory (safetensors) of a model type in
    :data:`MODEL_TYPES`, read tensor by tensor: no Hugging Face model is built."""
    get, config = hf_dir_reader(hf_dir)
    why = unsupported_hf(config, processing)
    if why:
        raise PosmechError(f"the posmech engine does not run {str(hf_dir)!r}: {why}; use `engine: bridge`")
    sd, cfg = hf_state(get, config)
    lens = Lens(sd, cfg, tokenizer, processing, device, dtype, copy=False)
    lens.hf_config = config
    return lens


def from_tl_state(sd: dict[str, Any], tl_config: dict[str, Any], tokenizer: Any = None,
                  processing: str = "compatibility", device: str = "cpu", dtype: str = "float32",
                  copy: bool = True) -> Lens:
    """The engine for a legacy TransformerLens state dict and its ``config.json``."""
    why = unsupported(tl_config=tl_config)
    if why:
        raise PosmechError(f"the posmech engine does not run this model: {why}; use `engine: bridge`")
    sd = {k: v for k, v in sd.items() if not k.endswith((".mask", ".IGNORE"))}
    return Lens(sd, tl_legacy_config(tl_config), tokenizer, processing, device, dtype, copy=copy)
