"""The forward engine of the analyses: a hooked transformer at the cost of a bare forward pass.

:class:`Lens` runs a GPT-2-style model (learned absolute positions added to the residual
stream, pre-LayerNorm blocks of attention and an optional MLP, a final LayerNorm, an
unembedding) with TransformerLens's interface and hook names, so that an analysis written
against a ``TransformerBridge`` runs unchanged on it:

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
d_head]``, ``hook_attn_scores`` and ``hook_pattern`` ``[B, n_heads, T_q, T_k]`` (scores are
divided by ``attn_scale`` and recorded after the causal mask, as the bridge records them:
``-inf`` in the future triangle in the compatibility mode, the dtype's most negative number
in the raw mode), ``hook_result`` ``[B, T, n_heads, d_model]``; ``blocks.{i}.mlp.hook_pre``,
``hook_post`` ``[B, T, d_mlp]``; ``ln_final.hook_in/hook_scale/hook_normalized/hook_out``.

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
``scaled_dot_product_attention`` unless a hook is registered on the scores or the pattern
of that layer (then scores, mask, softmax and ``pattern @ v`` are made explicitly, so a hook
can read or replace them); per-head outputs (``hook_result``) are made only when hooked; the
forward stops after the last block that has a hook when ``return_type`` is None (nothing
later can be observed), and the unembedding is computed only for ``return_type="logits"``.
There is no key/value cache and no gradient bookkeeping: run under
``torch.inference_mode()``. Several continuations of one prompt run in one pass as a
*token tree* (``positions``/``visible`` of :meth:`Lens.__call__`): the prompt is computed
once, not once per continuation (:func:`posmech.data.prompts.target_probabilities`).

Supported checkpoints (:func:`unsupported` says why not): Hugging Face ``GPT2LMHeadModel``
(no ``scale_attn_by_inverse_layer_idx``, no ``reorder_and_upcast_attn``),
``GPTNeoForCausalLM`` (TinyStories: unscaled attention, local layers of ``window_size``
keys), and legacy
TransformerLens state dicts with ``normalization_type`` LN, standard positions and
``act_fn`` ``gelu``/``gelu_new``/``relu`` (or attention-only). Anything else: the bridge
(``posmech.models.loading.load_model`` chooses).
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posmech.errors import PosmechError
from posmech.perf import count_forward

#: Hugging Face architectures the engine runs
ARCHITECTURES = ("GPT2LMHeadModel", "GPTNeoForCausalLM")
#: queries per block when a causal pattern is made for a hook (:meth:`Lens._causal_pattern_blocks`)
QUERY_BLOCK = 128
#: activation functions of the MLPs the engine runs (TransformerLens names)
ACTIVATIONS = ("gelu_new", "gelu", "relu", "gelu_fast", "gelu_pytorch_tanh")


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
    #: per layer, how many keys a query sees (0: all earlier ones; GPT-Neo's local layers)
    windows: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.attn_scale:
            self.attn_scale = math.sqrt(self.d_head) if self.use_attn_scale else 1.0

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


def unsupported_hf(c: dict[str, Any]) -> str | None:
    """Why the engine cannot run the Hugging Face model of config ``c`` (its ``config.json``
    as a dict); None when it can."""
    mt = c.get("model_type")
    if mt not in ("gpt2", "gpt_neo"):
        return f"model_type {mt!r} (the engine runs gpt2 and gpt_neo: {', '.join(ARCHITECTURES)})"
    if c.get("scale_attn_by_inverse_layer_idx") or c.get("reorder_and_upcast_attn"):
        return "scale_attn_by_inverse_layer_idx / reorder_and_upcast_attn"
    act = c.get("activation_function", "gelu_new")
    if act not in ACTIVATIONS:
        return f"activation {act!r}"
    if mt == "gpt_neo" and len(_attention_layers(c)) != int(c["num_layers"]):
        return "attention_types that do not cover every layer"
    return None


def hf_state(get: Callable[[str], Any], c: dict[str, Any]) -> tuple[dict[str, Any], LensConfig]:
    """A Hugging Face GPT-2 or GPT-Neo checkpoint's weights as a TransformerLens state dict
    (float32; views of what ``get`` returns where the layout allows) and its config.
    ``get(name)``: the tensor of a parameter named as in the checkpoint without the
    ``transformer.`` prefix (``h.0.attn.c_attn.weight``, ``lm_head.weight``), None if absent."""
    import torch

    f = lambda name: (lambda t: None if t is None else t.detach().float())(get(name))  # noqa: E731
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
    return {k: v for k, v in sd.items() if v is not None}, cfg


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
    rounding: tests/models/test_lens.py), in float32, with new tensors only (the input's are
    never written):

    * fold each LayerNorm's scale ``w`` and bias ``b`` into the weights reading it
      (``b_Q += b · W_Q``, ``W_Q *= w``, then ``W_Q`` centred over ``d_model``; ``ln1`` into
      ``W_Q/W_K/W_V``, ``ln2`` into ``W_in``, ``ln_final`` into ``W_U``);
    * centre the weights writing to the residual stream over ``d_model`` (``W_E``,
      ``W_pos``, ``W_O``, ``b_O``, ``W_out``, ``b_out``);
    * centre the unembedding over the vocabulary (``W_U``, ``b_U``);
    * fold the value biases into the output bias (``b_O += Σ_h b_V[h] · W_O[h]``, ``b_V = 0``).
    Returns a new dict without the LayerNorm weights."""
    import torch

    out = dict(sd)
    d = cfg.d_model
    centre = lambda t, dim: t - t.mean(dim, keepdim=True)  # noqa: E731

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
            bias = out.get(f"{a}b_{n}", torch.zeros(W.shape[0], W.shape[2]))
            if wb is not None:
                bias = bias + torch.einsum("hdk,d->hk", W, wb[1])
                W = W * wb[0][None, :, None]
            out[f"{a}W_{n}"], out[f"{a}b_{n}"] = centre(W, 1), bias
        if not cfg.attn_only:
            m = f"blocks.{i}.mlp."
            wb2 = ln(f"blocks.{i}.ln2")
            W_in, b_in = out[f"{m}W_in"], out.get(f"{m}b_in", torch.zeros(cfg.d_mlp))
            if wb2 is not None:
                b_in = b_in + wb2[1] @ W_in
                W_in = W_in * wb2[0][:, None]
            out[f"{m}W_in"], out[f"{m}b_in"] = centre(W_in, 0), b_in
            out[f"{m}W_out"] = centre(out[f"{m}W_out"], -1)
            out[f"{m}b_out"] = centre(out.get(f"{m}b_out", torch.zeros(d)), -1)
        W_O = centre(out[f"{a}W_O"], -1)  # [H, dh, d]
        b_O = centre(out.get(f"{a}b_O", torch.zeros(d)), -1)
        out[f"{a}W_O"] = W_O
        out[f"{a}b_O"] = b_O + torch.einsum("hk,hkd->d", out[f"{a}b_V"], W_O)
        out[f"{a}b_V"] = torch.zeros_like(out[f"{a}b_V"])
    W_U, b_U = out["unembed.W_U"], out.get("unembed.b_U", torch.zeros(cfg.d_vocab))
    wbf = ln("ln_final")
    if wbf is not None:
        b_U = b_U + wbf[1] @ W_U
        W_U = W_U * wbf[0][:, None]
    W_U = centre(W_U, 0)
    out["unembed.W_U"], out["unembed.b_U"] = centre(W_U, -1), centre(b_U, -1)
    out["embed.W_E"] = centre(out["embed.W_E"], -1)
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
        self.params: dict[str, Any] = {"embed.W_E": P(sd["embed.W_E"]), "pos_embed.W_pos": P(sd["pos_embed.W_pos"])}
        for i in range(L):
            Wq, Wk, Wv = (sd[f"blocks.{i}.attn.W_{n}"] for n in "QKV")  # [H, d, dh]
            W = torch.stack([Wq, Wk, Wv], 0).permute(2, 0, 1, 3).reshape(d, 3 * H * dh)
            b = torch.stack([opt(f"blocks.{i}.attn.b_{n}", (H, dh)) for n in "QKV"], 0).reshape(3 * H * dh)
            self.params[f"blocks.{i}.attn.W_QKV"] = P(W)
            self.params[f"blocks.{i}.attn.b_QKV"] = P(b)
            self.params[f"blocks.{i}.attn.W_O"] = P(sd[f"blocks.{i}.attn.W_O"].reshape(H * dh, d))
            self.params[f"blocks.{i}.attn.b_O"] = P(opt(f"blocks.{i}.attn.b_O", (d,)))
            lns = ("ln1",) if cfg.attn_only else ("ln1", "ln2")
            if not cfg.attn_only:
                for k, shape in (("W_in", None), ("b_in", (cfg.d_mlp,)), ("W_out", None), ("b_out", (d,))):
                    key = f"blocks.{i}.mlp.{k}"
                    self.params[key] = P(sd[key] if shape is None else opt(key, shape))
            for ln in lns:
                if not self.compatibility_mode:
                    self.params[f"blocks.{i}.{ln}.w"] = P(opt(f"blocks.{i}.{ln}.w", (d,), 1.0))
                    self.params[f"blocks.{i}.{ln}.b"] = P(opt(f"blocks.{i}.{ln}.b", (d,)))
        if not self.compatibility_mode:
            self.params["ln_final.w"] = P(opt("ln_final.w", (d,), 1.0))
            self.params["ln_final.b"] = P(opt("ln_final.b", (d,)))
        self.params["unembed.W_U"] = P(sd["unembed.W_U"])
        self.params["unembed.b_U"] = P(opt("unembed.b_U", (cfg.d_vocab,)))
        self._act = _act(cfg.act_fn) if not cfg.attn_only else None
        names = ["hook_embed", "hook_pos_embed", "ln_final.hook_in", "ln_final.hook_scale",
                 "ln_final.hook_normalized", "ln_final.hook_out"]
        for i in range(L):
            names += [f"blocks.{i}.{n}" for n in ("hook_resid_pre", "hook_resid_post")]
            names += [f"blocks.{i}.attn.hook_{n}" for n in ("q", "k", "v", "attn_scores", "pattern", "z", "result")]
            lns = ("ln1",) if cfg.attn_only else ("ln1", "ln2")
            names += [f"blocks.{i}.{ln}.hook_{n}" for ln in lns for n in ("in", "scale", "normalized", "out")]
            if not cfg.attn_only:
                names += [f"blocks.{i}.hook_resid_mid", f"blocks.{i}.mlp.hook_pre", f"blocks.{i}.mlp.hook_post"]
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
        H, d, dh = self.cfg.n_heads, self.cfg.d_model, self.cfg.d_head
        if bias:
            return self._stack(lambda i: self.params[f"blocks.{i}.attn.b_QKV"].view(3, H, dh)[j])
        return self._stack(lambda i: self.params[f"blocks.{i}.attn.W_QKV"].view(d, 3, H, dh)[:, j].permute(1, 0, 2))

    W_Q = property(lambda self: self._qkv(0, False))
    W_K = property(lambda self: self._qkv(1, False))
    W_V = property(lambda self: self._qkv(2, False))
    b_Q = property(lambda self: self._qkv(0, True))
    b_K = property(lambda self: self._qkv(1, True))
    b_V = property(lambda self: self._qkv(2, True))
    W_O = property(lambda self: self._stack(
        lambda i: self.params[f"blocks.{i}.attn.W_O"].view(self.cfg.n_heads, self.cfg.d_head, self.cfg.d_model)))
    b_O = property(lambda self: self._stack(lambda i: self.params[f"blocks.{i}.attn.b_O"]))
    W_in = property(lambda self: self._stack(lambda i: self.params[f"blocks.{i}.mlp.W_in"]))
    b_in = property(lambda self: self._stack(lambda i: self.params[f"blocks.{i}.mlp.b_in"]))
    W_out = property(lambda self: self._stack(lambda i: self.params[f"blocks.{i}.mlp.W_out"]))
    b_out = property(lambda self: self._stack(lambda i: self.params[f"blocks.{i}.mlp.b_out"]))
    W_E = property(lambda self: self.params["embed.W_E"])
    W_pos = property(lambda self: self.params["pos_embed.W_pos"])
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
        centred input; in the compatibility mode its scale and bias are folded away."""
        x = self._fire(f"{prefix}.hook_in", x)
        x = x - x.mean(-1, keepdim=True)
        scale = self._fire(f"{prefix}.hook_scale", (x.pow(2).mean(-1, keepdim=True) + self.cfg.eps).sqrt())
        x = self._fire(f"{prefix}.hook_normalized", x / scale)
        if not self.compatibility_mode:
            x = x * self.params[f"{prefix}.w"] + self.params[f"{prefix}.b"]
        return self._fire(f"{prefix}.hook_out", x)

    def _attention(self, i: int, x: Any) -> Any:
        import torch

        c = self.cfg
        B, T, _ = x.shape
        H, dh = c.n_heads, c.d_head
        pre = f"blocks.{i}.attn."
        qkv = torch.addmm(self.params[pre + "b_QKV"], x.reshape(B * T, -1), self.params[pre + "W_QKV"])
        qkv = qkv.view(B, T, 3, H, dh)
        q = self._fire(pre + "hook_q", qkv[:, :, 0])
        k = self._fire(pre + "hook_k", qkv[:, :, 1])
        v = self._fire(pre + "hook_v", qkv[:, :, 2])
        qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, T, dh]
        window = c.windows[i] if c.windows else 0
        hidden = None  # [T, T] True where a query may not see a key (beyond causal: local layers, trees)
        if self._tree is not None:
            positions, visible = self._tree
            hidden = ~visible
            if window:
                hidden = hidden | ((positions[:, None] - positions[None, :]) >= window)
        elif window:
            hidden = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            hidden |= torch.ones(T, T, dtype=torch.bool, device=x.device).tril(-window)
        if hidden is None and not self._hooked(pre + "hook_attn_scores") and self._hooked(pre + "hook_pattern") \
                and T > 2 * QUERY_BLOCK:
            z = self._causal_pattern_blocks(pre, qh, kh, vh)
        elif self._hooked(pre + "hook_attn_scores") or self._hooked(pre + "hook_pattern"):
            # the scale applied to q ([.., T, d_head]), not to the [.., T, T] scores; masked in place
            scores = torch.matmul(qh * (1.0 / c.attn_scale), kh.transpose(-2, -1))
            if hidden is None:
                hidden = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            fill = -torch.inf if self.compatibility_mode else torch.finfo(scores.dtype).min
            scores = self._fire(pre + "hook_attn_scores", scores.masked_fill_(hidden, fill))
            pattern = self._fire(pre + "hook_pattern", torch.softmax(scores, dim=-1))
            z = torch.matmul(pattern.to(vh.dtype), vh)
        elif hidden is not None:
            z = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, attn_mask=~hidden,
                                                                 scale=1.0 / c.attn_scale)
        else:
            z = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, is_causal=True,
                                                                 scale=1.0 / c.attn_scale)
        z = self._fire(pre + "hook_z", z.transpose(1, 2))  # [B, T, H, dh]
        W_O, b_O = self.params[pre + "W_O"], self.params[pre + "b_O"]
        if self._hooked(pre + "hook_result"):
            result = torch.einsum("bthe,hed->bthd", z, W_O.view(H, dh, -1))
            result = self._fire(pre + "hook_result", result)
            return result.sum(2) + b_O
        return torch.addmm(b_O, z.reshape(B * T, H * dh), W_O).view(B, T, -1)

    def _causal_pattern_blocks(self, pre: str, qh: Any, kh: Any, vh: Any) -> Any:
        """Causal attention with ``hook_pattern`` hooked (and not the scores): the pattern
        ``[B, H, T, T]`` is made a block of :data:`QUERY_BLOCK` queries at a time, each
        against the keys it can see only (its scores, softmax and ``pattern @ v`` skip the
        future triangle: ~55 % of the work of the whole square at T = 1024); the future
        triangle stays exactly 0. The hooks see the whole pattern; if one replaces it (or
        writes above the diagonal), ``z`` is the whole ``pattern @ v``. Equal to the square
        computation to float32 rounding."""
        import torch

        B, H, T, _ = qh.shape
        q = qh * (1.0 / self.cfg.attn_scale)
        pattern = qh.new_zeros(B, H, T, T)
        fill = -torch.inf if self.compatibility_mode else torch.finfo(qh.dtype).min
        for a in range(0, T, QUERY_BLOCK):
            e = min(a + QUERY_BLOCK, T)
            s = torch.matmul(q[:, :, a:e], kh[:, :, :e].transpose(-2, -1))  # [B, H, e-a, e]
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

    def _forward(self, x: Any, return_type: str | None, stop_at_layer: int | None) -> Any:
        import torch

        B, T = x.shape
        tree = self._tree
        last = self.cfg.n_layers if return_type == "logits" else self.last_hooked_layer()
        if stop_at_layer is not None:  # the residual is returned: every block below it runs
            last = min(self.cfg.n_layers, int(stop_at_layer)) - 1
        embed = self._fire("hook_embed", self.params["embed.W_E"][x])
        W_pos = self.params["pos_embed.W_pos"]
        pos = self._fire("hook_pos_embed", (W_pos[:T] if tree is None else W_pos[tree[0]]).expand(B, T, -1))
        resid = embed + pos
        for i in range(min(last + 1, self.cfg.n_layers)):
            resid = self._fire(f"blocks.{i}.hook_resid_pre", resid)
            attn_out = self._attention(i, self._ln(f"blocks.{i}.ln1", resid))
            if self.cfg.attn_only:
                resid = resid + attn_out
            else:
                resid = self._fire(f"blocks.{i}.hook_resid_mid", resid + attn_out)
                resid = resid + self._mlp(i, self._ln(f"blocks.{i}.ln2", resid))
            resid = self._fire(f"blocks.{i}.hook_resid_post", resid)
        if stop_at_layer is not None:
            return resid
        if last < self.cfg.n_layers:
            return None
        normed = self._ln("ln_final", resid)
        if return_type is None:
            return None
        return torch.matmul(normed, self.params["unembed.W_U"]) + self.params["unembed.b_U"]


# --------------------------------------------------------------------------- constructors
def from_hf(model: Any, tokenizer: Any = None, processing: str = "compatibility", device: str = "cpu",
            dtype: str = "float32") -> Lens:
    """The engine for a Hugging Face ``GPT2LMHeadModel`` or ``GPTNeoForCausalLM`` in memory
    (its weights are read, never written)."""
    why = unsupported(model=model)
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
    """The engine for a Hugging Face GPT-2 / GPT-Neo directory (safetensors), read tensor by
    tensor: no Hugging Face model is built."""
    get, config = hf_dir_reader(hf_dir)
    why = unsupported_hf(config)
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
