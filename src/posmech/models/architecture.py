"""A model's position scheme and layout, read once from its configuration.

:func:`architecture` takes a model's ``config.json`` as a dict: a Hugging Face config (it
has ``model_type``) or a legacy TransformerLens config (``d_model``, ``n_layers``, no
``model_type``; also what ``make demo`` trains), and returns an :class:`Architecture`:

* ``positions``, the position scheme (:data:`SCHEMES`): ``learned`` (a learned absolute
  positional embedding ``W_pos`` added to the residual stream: GPT-2, GPT-Neo, OPT, GPT-BigCode,
  TransformerLens ``standard``), ``rotary`` (queries and keys rotated by position: GPT-NeoX /
  Pythia, GPT-J, Llama, Mistral, Qwen2, Gemma, Phi), ``alibi`` (a linear bias in the key's
  distance added to the attention scores: BLOOM, MPT and Falcon with ``alibi``) or ``none``
  (no position signal but the causal mask: a TransformerLens config saying so);
* ``rotary_fraction``: the fraction of each head's dimensions that rotary rotates (NeoX
  ``rotary_pct`` / ``partial_rotary_factor``, GPT-J ``rotary_dim``; 1 for Llama); ``None``
  without rotary;
* ``context``: the positions the model was built for (the first of ``n_positions``,
  ``max_position_embeddings``, ``n_ctx``, ``seq_length``, ``max_seq_len``,
  ``max_sequence_length``), with ``context_key`` naming the key; ``None`` when the config
  records none (BLOOM: ALiBi has no table of positions), and then the config key
  ``models.<name>.n_ctx`` must give it (:func:`context_length`);
* ``attn_scale``: the factor on ``q·k`` before the softmax, ``1 /`` :func:`score_divisor`
  (``1/sqrt(d_head)`` for most; 1 for GPT-Neo; a TransformerLens ``attn_scale`` /
  ``use_attn_scale``); :func:`score_divisor` is the one place the pipeline reads a model's
  attention scale from its config (the engine, the raw scores, the kernels and the layer-0
  decomposition call it);
* ``n_heads`` and ``n_kv_heads`` (grouped-query attention: Llama's ``num_key_value_heads``,
  Falcon's ``multi_query``; equal without grouping), ``n_layers``, ``d_model``, ``d_head``;
* ``has_mlp``: False for an attention-only model (``attn_only``);
* ``model_type``: the config's ``model_type``; ``transformer_lens`` for a legacy
  TransformerLens config;
* ``position_offset``: rows of ``W_pos`` before position 0 (OPT stores its positions from
  row 2; 0 elsewhere);
* ``post_ln``: the LayerNorm comes after each residual addition, so layer 0's attention
  reads the raw residual (OPT with ``do_layer_norm_before: false``, e.g. OPT-350m); False
  for the usual pre-LayerNorm blocks.

Pure: no I/O except :func:`read_architecture`, which reads ``config.json`` of a directory.
A config whose scheme cannot be told is a :class:`PosmechError` naming its ``model_type``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from posmech.core.errors import PosmechError

SCHEMES = ("learned", "rotary", "alibi", "none")
#: in words, for reasons and the report
SCHEME_WORDS = {"learned": "learned absolute positions", "rotary": "rotary positions",
                "alibi": "ALiBi positions", "none": "no positional embedding"}
CONTEXT_KEYS = ("n_positions", "max_position_embeddings", "n_ctx", "seq_length", "max_seq_len",
                "max_sequence_length")
LEARNED_TYPES = ("gpt2", "gpt_neo", "opt", "gpt_bigcode", "biogpt", "imagegpt")
ROTARY_TYPES = ("gpt_neox", "gptj", "llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2",
                "phi", "phi3", "codegen", "olmo", "olmo2", "stablelm", "persimmon", "cohere", "starcoder2")
ALIBI_TYPES = ("bloom",)
ROPE_KEYS = ("rope_theta", "rope_parameters", "rope_scaling", "rotary_pct", "rotary_dim",
             "partial_rotary_factor", "rotary_emb_base")
#: GPT-NeoX's rotary fraction when its config states none (transformers' default)
NEOX_DEFAULT_ROTARY = 0.25
#: rows of OPT's position table before position 0 (OPTLearnedPositionalEmbedding.offset)
OPT_POSITION_OFFSET = 2


@dataclass(frozen=True)
class Architecture:
    """What the pipeline needs to know of a model's layout (module docstring)."""

    model_type: str
    positions: str
    rotary_fraction: float | None
    context: int | None
    context_key: str | None
    attn_scale: float
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_model: int
    d_head: int
    has_mlp: bool
    position_offset: int
    post_ln: bool = False

    @property
    def scheme_words(self) -> str:
        """The position scheme in words ("rotary positions")."""
        return SCHEME_WORDS[self.positions]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (the manifest's ``architecture``)."""
        return asdict(self)


def _first(cfg: Mapping[str, Any], keys: tuple[str, ...]) -> tuple[str | None, int | None]:
    for k in keys:
        v = cfg.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return k, int(v)
    return None, None


def _need(cfg: Mapping[str, Any], keys: tuple[str, ...], what: str, where: str) -> int:
    _, v = _first(cfg, keys)
    if v is None:
        raise PosmechError(f"{where}: config.json gives no {what} (none of {', '.join(keys)})")
    return v


def is_tl_config(cfg: Mapping[str, Any]) -> bool:
    """A legacy TransformerLens config (``d_model``, ``n_layers``, no ``model_type``)."""
    return "model_type" not in cfg and "d_model" in cfg and "n_layers" in cfg


def _rotary_fraction(cfg: Mapping[str, Any], model_type: str, d_head: int) -> float:
    rope = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), Mapping) else {}
    for v in (rope.get("partial_rotary_factor"), cfg.get("partial_rotary_factor"), cfg.get("rotary_pct")):
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    if isinstance(cfg.get("rotary_dim"), int):
        return int(cfg["rotary_dim"]) / d_head
    return NEOX_DEFAULT_ROTARY if model_type == "gpt_neox" else 1.0


def score_divisor(cfg: Mapping[str, Any], d_head: int | None = None, where: str = "model") -> float:
    """The number the model divides ``q·k`` by before the softmax, read from its
    ``config.json`` (a dict; ``d_head``: the head width when the dict does not give it).

    * a legacy TransformerLens config (:func:`is_tl_config`; also the engine's own
      :class:`~posmech.models.lens.LensConfig`): its ``attn_scale`` when positive, else
      ``sqrt(d_head)``; 1 when ``use_attn_scale`` is false;
    * a Hugging Face config: 1 for GPT-Neo and for GPT-2 with ``scale_attn_weights: false``;
      ``sqrt(query_pre_attn_scalar)`` when the config has one (Gemma); else ``sqrt(d_head)``
      (``head_dim``, else the model width over the number of heads). GPT-2's
      ``scale_attn_by_inverse_layer_idx`` (a further factor ``layer + 1`` per layer) is
      per layer: :func:`posmech.analyses.kernels.attention_layout` applies it.
    """
    if d_head is None:
        d_head = _d_head(cfg, where)
    if is_tl_config(cfg):
        if not cfg.get("use_attn_scale", True):
            return 1.0
        given = cfg.get("attn_scale")  # TransformerLens writes -1 for "not set"
        return float(given) if isinstance(given, (int, float)) and given > 0 else math.sqrt(d_head)
    mt = str(cfg.get("model_type") or "")
    if mt == "gpt_neo" or (mt == "gpt2" and cfg.get("scale_attn_weights") is False):
        return 1.0
    if isinstance(cfg.get("query_pre_attn_scalar"), (int, float)):
        return math.sqrt(float(cfg["query_pre_attn_scalar"]))
    return math.sqrt(d_head)


def _d_head(cfg: Mapping[str, Any], where: str) -> int:
    """The head width of a TransformerLens or Hugging Face config."""
    if is_tl_config(cfg):
        return int(cfg.get("d_head") or int(cfg["d_model"]) // _need(cfg, ("n_heads",), "number of heads", where))
    _, dh = _first(cfg, ("head_dim", "d_head"))
    if dh:
        return dh
    n_heads = _need(cfg, ("n_head", "num_attention_heads", "n_heads", "num_heads"), "number of heads", where)
    return _need(cfg, ("n_embd", "hidden_size", "d_model"), "model width", where) // n_heads


def _tl_architecture(cfg: Mapping[str, Any], where: str) -> Architecture:
    d_model, n_layers = int(cfg["d_model"]), int(cfg["n_layers"])
    n_heads = _need(cfg, ("n_heads",), "number of heads", where)
    d_head = _d_head(cfg, where)
    kind = str(cfg.get("positional_embedding_type") or "standard")
    positions = {"standard": "learned", "shortformer": "learned", "rotary": "rotary", "alibi": "alibi",
                 "none": "none"}.get(kind)
    if positions is None:
        raise PosmechError(f"{where}: TransformerLens positional_embedding_type {kind!r} is not one of "
                           "standard, rotary, alibi, none")
    rot = None
    if positions == "rotary":
        rot = int(cfg["rotary_dim"]) / d_head if isinstance(cfg.get("rotary_dim"), int) else 1.0
    key, ctx = _first(cfg, ("n_ctx",))
    return Architecture(
        model_type="transformer_lens", positions=positions,
        rotary_fraction=rot, context=ctx, context_key=key, attn_scale=1.0 / score_divisor(cfg, d_head, where),
        n_layers=n_layers,
        n_heads=n_heads, n_kv_heads=int(cfg.get("n_key_value_heads") or n_heads), d_model=d_model, d_head=d_head,
        has_mlp=not bool(cfg.get("attn_only", False)), position_offset=0,
    )


def architecture(cfg: Mapping[str, Any], where: str = "model") -> Architecture:
    """The :class:`Architecture` of a model from its ``config.json`` (a dict); ``where``
    names the model in errors. Raises :class:`PosmechError` when the position scheme or a
    size cannot be told."""
    if is_tl_config(cfg):
        return _tl_architecture(cfg, where)
    mt = str(cfg.get("model_type") or "")
    if not mt:
        raise PosmechError(f"{where}: config.json has no `model_type` (nor TransformerLens's d_model / n_layers); "
                           "save the model with `save_pretrained(dir)`")
    n_layers = _need(cfg, ("n_layer", "num_hidden_layers", "n_layers", "num_layers"), "number of layers", where)
    n_heads = _need(cfg, ("n_head", "num_attention_heads", "n_heads", "num_heads"), "number of heads", where)
    d_model = _need(cfg, ("n_embd", "hidden_size", "d_model"), "model width", where)
    d_head = _d_head(cfg, where)
    _, kv = _first(cfg, ("num_key_value_heads", "n_key_value_heads", "num_kv_heads", "n_head_kv"))
    if kv is None:
        kv = 1 if cfg.get("multi_query") else n_heads
    attn_cfg = cfg.get("attn_config") if isinstance(cfg.get("attn_config"), Mapping) else {}
    if cfg.get("alibi") or attn_cfg.get("alibi") or mt in ALIBI_TYPES:
        positions = "alibi"
    elif mt in LEARNED_TYPES:
        positions = "learned"
    elif mt in ROTARY_TYPES or any(k in cfg for k in ROPE_KEYS):
        positions = "rotary"
    else:
        raise PosmechError(
            f"{where}: cannot tell the position scheme of model_type {mt!r} from its config.json (no rope_* / "
            f"alibi key); posmech knows learned ({', '.join(LEARNED_TYPES)}), rotary ({', '.join(ROTARY_TYPES)}) "
            f"and ALiBi ({', '.join(ALIBI_TYPES)}) models")
    key, ctx = _first(cfg, CONTEXT_KEYS)
    scale = 1.0 / score_divisor(cfg, d_head, where)
    return Architecture(
        model_type=mt, positions=positions,
        rotary_fraction=_rotary_fraction(cfg, mt, d_head) if positions == "rotary" else None,
        context=ctx, context_key=key, attn_scale=scale, n_layers=n_layers, n_heads=n_heads, n_kv_heads=kv,
        d_model=d_model, d_head=d_head, has_mlp=not bool(cfg.get("attn_only", False)),
        position_offset=OPT_POSITION_OFFSET if mt == "opt" else 0,
        post_ln=mt == "opt" and not cfg.get("do_layer_norm_before", True),
    )


def attention_windows(cfg: Mapping[str, Any], n_layers: int) -> list[int]:
    """Per layer, how many keys (the query's own included) a query sees, from a model's
    ``config.json`` dict: 0 for every earlier key (causal attention), else the sliding window:
    ``layer_types`` (transformers 5: ``sliding_attention`` layers see ``sliding_window`` keys),
    GPT-Neo's ``local`` layers (``attention_layers`` or ``attention_types``: ``window_size``),
    Mistral's ``sliding_window`` on every layer, Qwen2's ``use_sliding_window`` from layer
    ``max_window_layers`` on.  A TransformerLens or other config without these: all 0."""
    mt = str(cfg.get("model_type") or "")
    sliding = int(cfg.get("sliding_window") or 0)
    types = cfg.get("layer_types")
    if isinstance(types, list) and len(types) == n_layers and sliding:
        return [sliding if t == "sliding_attention" else 0 for t in types]
    if mt == "gpt_neo":
        kinds: list[str] = list(cfg.get("attention_layers") or [])
        if not kinds:
            for names, repeat in cfg.get("attention_types") or [[["global"], n_layers]]:
                kinds += list(names) * int(repeat)
        w = int(cfg.get("window_size", 256))
        return [w if k == "local" else 0 for k in kinds[:n_layers]] + [0] * max(0, n_layers - len(kinds))
    if mt == "mistral" and sliding:
        return [sliding] * n_layers
    if mt == "qwen2" and cfg.get("use_sliding_window") and sliding:
        first = int(cfg.get("max_window_layers", n_layers))
        return [sliding if i >= first else 0 for i in range(n_layers)]
    return [0] * n_layers


def read_architecture(hf_dir: str | os.PathLike[str], where: str | None = None) -> Architecture:
    """:func:`architecture` of the ``config.json`` in ``hf_dir``."""
    p = Path(hf_dir) / "config.json"
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise PosmechError(f"{str(p)!r} cannot be read as JSON ({err})") from None
    return architecture(cfg, where or repr(str(hf_dir)))


def train_architecture(train: Mapping[str, Any], where: str = "model") -> Architecture:
    """The :class:`Architecture` of a model the pipeline trains (a ``models.<m>.train``
    section, schema defaults filled), known before it is trained: a Hugging Face GPT-2
    (``architecture: gpt2``) or an attention-only legacy TransformerLens checkpoint
    (``attn_only``), with learned positions over ``n_ctx`` positions, or a Hugging Face
    Llama (``llama``: rotary positions on every head dimension, no grouping)."""
    d_model, n_head = int(train.get("d_model", 64)), int(train.get("n_head", 4))
    n_layer, n_ctx = int(train.get("n_layer", 2)), int(train.get("n_ctx", 64))
    if train.get("architecture", "gpt2") == "attn_only":
        return architecture({"d_model": d_model, "n_layers": n_layer, "n_heads": n_head, "d_head": d_model // n_head,
                             "n_ctx": n_ctx, "attn_only": True, "positional_embedding_type": "standard"}, where)
    if train.get("architecture", "gpt2") == "llama":
        return architecture({"model_type": "llama", "hidden_size": d_model, "num_hidden_layers": n_layer,
                             "num_attention_heads": n_head, "num_key_value_heads": n_head,
                             "max_position_embeddings": n_ctx}, where)
    return architecture({"model_type": "gpt2", "n_embd": d_model, "n_layer": n_layer, "n_head": n_head,
                         "n_positions": n_ctx}, where)


def context_length(arch: Architecture, name: str, n_ctx: int | None) -> int:
    """The model's context: its config's, else ``models.<name>.n_ctx`` (``n_ctx``); neither
    is a :class:`PosmechError` naming the key to set."""
    if arch.context is not None:
        return arch.context
    if n_ctx:
        return int(n_ctx)
    raise PosmechError(
        f"config key `models.{name}.n_ctx`: model {name!r} ({arch.model_type}, {arch.scheme_words}) records no "
        f"context length in its config.json (none of {', '.join(CONTEXT_KEYS)}); set `models.{name}.n_ctx` to "
        "the tokens per document to analyse (e.g. the length it was trained on)")
