"""A model's position scheme and layout, read once from its configuration.

:func:`architecture` takes a model's ``config.json`` as a dict: a Hugging Face config (it
has ``model_type``) or a legacy TransformerLens config (``d_model``, ``n_layers``, no
``model_type``; also what ``make demo`` trains), and returns an :class:`Architecture`:

* ``positions``, the position scheme (:data:`SCHEMES`): ``learned`` (a learned absolute
  positional embedding ``W_pos`` added to the residual stream), ``rotary`` (queries and keys
  rotated by position), ``alibi`` (a linear bias in the key's distance added to the
  attention scores), ``none`` (no position signal but the causal mask: a TransformerLens
  config saying so) or ``unknown`` (it cannot be told: ``undecided`` says why, and no
  analysis rule runs on the model, :mod:`posmech.pipeline.applicability`). It is read from
  the model itself, never from a list of model types (:func:`architecture`, in this order):
  the **weights** (a position table: a 2-D tensor outside the layers named like one,
  ``wpe``/``embed_positions``/``position_embeddings``/…, ``[context + offset, d_model]``:
  learned; a stored rotary ``inv_freq``: rotary), the **config** (``alibi`` /
  ``attn_config.alibi`` / ``position_embedding_type``; a ``rope_*``/``rotary_*`` key:
  rotary), and the **code transformers runs for its model type** (its ``modeling_<type>.py``,
  read as text, not imported: a rotary embedding or ``apply_rotary_pos_emb``: rotary; an
  ALiBi builder: ALiBi, unless the config switches it off; without weights, a position
  table named in the code: learned; with weights and no position table, attention code
  with nothing positional nor relative in it: ``none``). ``sources`` says which of them
  decided each fact;
* ``rotary_interleaved``: rotary pairs are adjacent dimensions (GPT-J, CodeGen:
  ``rotate_every_two``) rather than the two halves of the rotated dimensions (NeoX, Llama:
  ``rotate_half``); a config key (``rope_interleaved``/``rotary_interleaved``) else the
  model type's code; ``None`` without rotary or when neither tells;
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
* ``n_heads`` and ``n_kv_heads``: key/value heads read from layer 0's key projection (its
  width over the head size; a fused query/key/value projection: what is left after the
  queries, halved), else the config (``num_key_value_heads``…; ``multi_query`` without
  Falcon's ``new_decoder_architecture``: 1); ``attention`` names the grouping
  (:data:`ATTENTION_KINDS`: ``multi-head`` when equal, ``multi-query`` with one key head,
  else ``grouped-query``); ``n_layers``, ``d_model``, ``d_head``;
* ``parallel_blocks``: attention and MLP read the same residual and add their outputs
  together (GPT-J, NeoX's ``use_parallel_residual``, Phi, Falcon's ``parallel_attn``), from
  the config's key else the weights (one LayerNorm per block, outside the attention);
* ``mlp_kind`` (:data:`MLP_KINDS`): ``none`` (attention-only), ``plain`` (up, activation,
  down) or ``gated`` (a gate projection times the up projection: SwiGLU, GeGLU), from layer
  0's weights (``gate_proj``/``w1``+``w3``/``gate_up_proj``…, else three MLP matrices), else
  the config (``attn_only``; a ``*glu`` activation); ``has_mlp``: not ``none``;
* ``score_softcap``: Gemma 2's ``attn_logit_softcapping`` (scores ``c·tanh(s/c)``), else None;
* ``model_type``: the config's ``model_type``; ``transformer_lens`` for a legacy
  TransformerLens config;
* ``position_offset``: rows of ``W_pos`` before position 0 (OPT stores its positions from
  row 2; 0 elsewhere);
* ``post_ln``: the LayerNorm comes after each residual addition, so layer 0's attention
  reads the raw residual (OPT with ``do_layer_norm_before: false``, e.g. OPT-350m); False
  for the usual pre-LayerNorm blocks.

No I/O except :func:`read_architecture` (``config.json`` and the safetensors headers of a
directory: no weight is read) and the text of transformers' modeling file of the model type
(:func:`modeling_source`, cached). A config whose sizes cannot be read is a
:class:`PosmechError`; a position scheme that cannot be told is ``unknown`` with its reason.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from posmech.core.errors import PosmechError
from posmech.models.model_dir import KV_KEYS, LAYER, config_kv_heads, is_tl_config, weight_shapes

SCHEMES = ("learned", "rotary", "alibi", "none", "unknown")
#: in words, for reasons and the report
SCHEME_WORDS = {"learned": "learned absolute positions", "rotary": "rotary positions",
                "alibi": "ALiBi positions", "none": "no positional embedding",
                "unknown": "a position scheme posmech cannot tell"}
ATTENTION_KINDS = ("multi-head", "grouped-query", "multi-query")
MLP_KINDS = ("none", "plain", "gated")
CONTEXT_KEYS = ("n_positions", "max_position_embeddings", "n_ctx", "seq_length", "max_seq_len",
                "max_sequence_length")
ROPE_KEYS = ("rope_theta", "rope_parameters", "rope_scaling", "rotary_pct", "rotary_dim",
             "partial_rotary_factor", "rotary_emb_base")
#: config keys saying attention and MLP run side by side on one residual (True) or in turn
PARALLEL_KEYS = ("use_parallel_residual", "parallel_attn", "parallel_attention", "parallel_residual",
                 "parallel_block")
INTERLEAVED_KEYS = ("rope_interleaved", "rotary_interleaved", "rotary_interleave")
#: a learned position table's name (outside the layers)
POSITION_TABLE = re.compile(r"(?:^|[._])(?:wpe|embed_positions|position_embeddings?|pos_embed(?:ding)?s?|pos_emb|"
                            r"W_pos|positional_embedding)(?:$|[._])")
#: a learned position table made in a modeling file (``self.wpe = nn.Embedding(``)
CODE_POSITION_TABLE = re.compile(r"(?:wpe|embed_positions|position_embeddings?|pos_emb\w*)\s*=\s*[\w.]*Embedding\(")
#: a gate projection of a gated MLP (layer 0's weights)
GATE = re.compile(r"(?:^|\.)(?:gate_proj|gate_up_proj|gate|w1|w3|wi_0|wi_1|W_gate|ffn_gate)(?:\.|$)")
#: an MLP's weights (layer 0), outside the attention
MLP_PART = re.compile(r"(?:^|\.)(?:mlp|feed_forward|ffn|fc1|fc2|c_fc|fc_in|fc_out|W_in|W_out|W_gate)(?:\.|$)")
ATTN_PART = re.compile(r"(?:^|\.)(?:attn|attention|self_attn|self_attention|mixer)(?:\.|$)")
NORM = re.compile(r"(?:norm|(?:^|\.)ln(?:_?\d+|_f|_attn|_mlp)?(?:\.|$))", re.IGNORECASE)
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
    rotary_interleaved: bool | None = None
    parallel_blocks: bool = False
    mlp_kind: str = ""
    score_softcap: float | None = None
    undecided: str | None = None
    #: which of weights / config / code decided each fact, in words
    sources: Mapping[str, str] = field(default_factory=dict)
    attention: str = ""
    #: why posmech's own forward engine cannot run the model, in words; None: it can (or not
    #: asked). Filled in by :func:`posmech.models.lens.with_engine_refusal` (the engine reads
    #: this module, not the reverse) where a config is read: the manifest, the pre-run schedule
    engine_refusal: str | None = None

    def __post_init__(self) -> None:
        if not self.mlp_kind:
            object.__setattr__(self, "mlp_kind", "plain" if self.has_mlp else "none")
        kind = ("multi-head" if self.n_kv_heads == self.n_heads else "multi-query" if self.n_kv_heads == 1
                else "grouped-query")
        object.__setattr__(self, "attention", kind)

    @property
    def scheme_words(self) -> str:
        """The position scheme in words ("rotary positions"; ``unknown``: with the reason)."""
        if self.positions == "unknown" and self.undecided:
            return f"{SCHEME_WORDS['unknown']} ({self.undecided})"
        return SCHEME_WORDS[self.positions]

    @property
    def layout_words(self) -> str:
        """The layout in words, for logs and the report ("rotary positions (half of each head,
        interleaved pairs), grouped-query attention (4 query / 2 key heads), parallel blocks,
        gated MLP")."""
        pos = self.scheme_words
        if self.positions == "rotary":
            frac = "" if self.rotary_fraction in (None, 1.0) else f"{self.rotary_fraction:g} of each head, "
            pairs = {True: "interleaved pairs", False: "halves", None: "pair order not told"}[self.rotary_interleaved]
            pos += f" ({frac}{pairs})"
        if self.position_offset:
            pos += f" (from row {self.position_offset})"
        att = f"{self.attention} attention ({self.n_heads} query / {self.n_kv_heads} key heads)"
        blocks = "parallel" if self.parallel_blocks else "sequential"
        return f"{pos}, {att}, {blocks} blocks, {self.mlp_kind} MLP"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (the manifest's ``architecture``)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Architecture:
        """The :class:`Architecture` a manifest records (:meth:`to_dict`; keys of other
        versions ignored)."""
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in names})


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
        rotary_interleaved=False if positions == "rotary" else None,
        sources={"positions": f"config: positional_embedding_type {kind!r} (TransformerLens)"},
    )


Shapes = Mapping[str, Any]


def _shape(v: Any) -> tuple[int, ...]:
    """A shape from :func:`posmech.models.model_dir.weight_shapes` (``(shape, file)``) or a bare one."""
    if isinstance(v, tuple) and len(v) == 2 and isinstance(v[1], str):
        return tuple(v[0])
    return tuple(v)




@functools.lru_cache(maxsize=64)
def modeling_source(model_type: str) -> str:
    """The text of transformers' ``models/<type>/modeling_<type>.py`` (read, not imported);
    empty when transformers or the file is not there."""
    try:
        spec = importlib.util.find_spec("transformers")
    except (ImportError, ValueError):
        return ""
    for root in (spec.submodule_search_locations or []) if spec else []:
        f = Path(root) / "models" / model_type / f"modeling_{model_type}.py"
        if f.is_file():
            return f.read_text(encoding="utf-8", errors="replace")
    return ""


def _position_table(shapes: Shapes, d_model: int) -> tuple[str, tuple[int, ...]] | None:
    """The learned position table among the weights: a 2-D tensor outside the layers, named
    like one and ``d_model`` wide (``[rows, d_model]``)."""
    for k, v in sorted(shapes.items()):
        shp = _shape(v)
        if len(shp) == 2 and not LAYER.search(k) and POSITION_TABLE.search(k.removesuffix(".weight")) \
                and shp[1] == d_model:
            return k, shp
    return None


def _layer0(shapes: Shapes) -> dict[str, tuple[int, ...]]:
    return {k: _shape(v) for k, v in shapes.items() if (m := LAYER.search(k)) and m[1] == "0"}


def _weights_kv(layer0: Mapping[str, tuple[int, ...]], n_heads: int, d_head: int, d_model: int) -> tuple[str, int] | None:
    """Key/value heads read from layer 0's key projection (``[kv·d_head, d_model]``,
    GPT-2's Conv1D transposed, TransformerLens ``W_K [kv, d_model, d_head]``) or fused
    query/key/value projection (``(n_heads + 2·kv)·d_head`` wide)."""
    for k, shp in sorted(layer0.items()):
        leaf = k.removesuffix(".weight").rsplit(".", 1)[-1]
        if leaf in ("W_K", "_W_K") and len(shp) == 3:
            return k, shp[0]
        width = shp[0] if len(shp) == 2 and shp[1] == d_model else shp[1] if len(shp) == 2 and shp[0] == d_model else None
        if width is None or width % d_head:
            continue
        if leaf in ("k_proj", "key", "k", "wk", "k_lin"):
            return k, width // d_head
        if leaf in ("c_attn", "query_key_value", "qkv_proj", "Wqkv", "W_pack", "qkv") and \
                (width // d_head - n_heads) % 2 == 0 and width // d_head > n_heads:
            return k, (width // d_head - n_heads) // 2
    return None


def _mlp_kind(cfg: Mapping[str, Any], layer0: Mapping[str, tuple[int, ...]], src: dict[str, str]) -> str:
    if cfg.get("attn_only"):
        src["mlp_kind"] = "config: attn_only"
        return "none"
    mats = sorted(k for k, s in layer0.items() if len(s) == 2 and not ATTN_PART.search(k) and MLP_PART.search(k)
                  and not NORM.search(k))
    act = str(cfg.get("hidden_act") or cfg.get("activation_function") or cfg.get("activation") or "")
    if layer0:
        gates = [k for k in mats if GATE.search(k.removesuffix(".weight"))]
        if gates:
            src["mlp_kind"] = f"weights: {gates[0]}"
            return "gated"
        weights = [k for k in mats if k.endswith(".weight") or k.endswith(("W_in", "W_out"))]
        if len(weights) >= 3:
            src["mlp_kind"] = f"weights: three MLP matrices in layer 0 ({', '.join(weights[:3])})"
            return "gated"
        if weights:
            if act.endswith("glu"):
                src["mlp_kind"] = f"weights: {weights[0]}; config: activation {act!r}"
                return "gated"
            src["mlp_kind"] = f"weights: {', '.join(weights)}"
            return "plain"
        src["mlp_kind"] = "weights: no MLP matrix in layer 0"
        return "none"
    src["mlp_kind"] = "config" + (f": activation {act!r}" if act else "")
    return "gated" if act.endswith("glu") else "plain"


def _parallel(cfg: Mapping[str, Any], layer0: Mapping[str, tuple[int, ...]], src: dict[str, str]) -> bool:
    for k in PARALLEL_KEYS:
        if isinstance(cfg.get(k), bool):
            src["parallel_blocks"] = f"config: {k}"
            return bool(cfg[k]) or bool(cfg.get("new_decoder_architecture"))
    if cfg.get("new_decoder_architecture"):
        src["parallel_blocks"] = "config: new_decoder_architecture"
        return True
    norms = {k.rsplit(".", 1)[0] for k in layer0 if NORM.search(k) and not ATTN_PART.search(k)}
    if layer0:
        src["parallel_blocks"] = f"weights: {len(norms)} LayerNorm(s) in a block outside the attention"
        return len(norms) == 1
    src["parallel_blocks"] = "default: sequential"
    return False


def _interleaved(cfg: Mapping[str, Any], mt: str, src: dict[str, str]) -> bool | None:
    rope = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), Mapping) else {}
    for k in INTERLEAVED_KEYS:
        for where in (cfg, rope):
            if isinstance(where.get(k), bool):
                src["rotary_interleaved"] = f"config: {k}"
                return bool(where[k])
    code = modeling_source(mt)
    every_two, half = "def rotate_every_two" in code, "def rotate_half" in code
    if every_two != half:
        src["rotary_interleaved"] = f"code: modeling_{mt}.py defines " + ("rotate_every_two" if every_two else "rotate_half")
        return every_two
    src["rotary_interleaved"] = f"not told (no config key; modeling_{mt}.py " + (
        "defines both rotate_half and rotate_every_two)" if every_two else "not found)")
    return None


def _positions(cfg: Mapping[str, Any], mt: str, shapes: Shapes | None, d_model: int, ctx: int | None,
               src: dict[str, str]) -> tuple[str, int, str | None]:
    """``(scheme, position_offset, reason if unknown)`` (module docstring's order)."""
    if shapes:
        table = _position_table(shapes, d_model)
        if table is not None:
            name, (rows, _) = table
            src["positions"] = f"weights: position table {name} [{rows}, {d_model}]"
            return "learned", max(0, rows - ctx) if ctx else 0, None
        stored = sorted(k for k in shapes if "inv_freq" in k or "rotary_emb" in k)
        if stored:
            src["positions"] = f"weights: {stored[0]}"
            return "rotary", 0, None
    attn_cfg = cfg.get("attn_config") if isinstance(cfg.get("attn_config"), Mapping) else {}
    for where, key in ((cfg, "alibi"), (attn_cfg, "alibi"), (cfg, "use_alibi")):
        if where.get(key) is True:
            src["positions"] = f"config: {key}"
            return "alibi", 0, None
    alibi_off = any(w.get(k) is False for w, k in ((cfg, "alibi"), (attn_cfg, "alibi"), (cfg, "use_alibi")))
    kind = str(cfg.get("position_embedding_type") or "").lower()
    if kind in ("rotary", "rope", "alibi"):
        src["positions"] = f"config: position_embedding_type {kind!r}"
        return ("alibi" if kind == "alibi" else "rotary"), 0, None
    rope = [k for k in ROPE_KEYS if k in cfg]
    if rope:
        src["positions"] = f"config: {rope[0]}"
        return "rotary", 0, None
    code = modeling_source(mt)
    if re.search(r"RotaryEmbedding\b|def apply_rotary_pos_emb|def rotate_half|def rotate_every_two", code):
        src["positions"] = f"code: modeling_{mt}.py rotates queries and keys"
        return "rotary", 0, None
    if not alibi_off and re.search(r"def \w*alibi\w*\(", code):
        src["positions"] = f"code: modeling_{mt}.py builds an ALiBi bias (its config has no `alibi` key)"
        return "alibi", 0, None
    if not shapes and CODE_POSITION_TABLE.search(code):
        src["positions"] = f"code: modeling_{mt}.py has a position table (weights not read)"
        return "learned", 0, None
    relative = sorted(k for k in (shapes or {}) if "relative" in k or "position_bias" in k)
    if shapes and code and not relative and not re.search(r"relative_attention|position_bias|positional", code) \
            and re.search(r"softmax|scaled_dot_product_attention|eager_attention_forward", code):
        src["positions"] = (f"weights: no position table; config: no rope/alibi key; code: modeling_{mt}.py attends "
                            "without rotating, biasing or adding positions")
        return "none", 0, None
    why = (f"model_type {mt!r}: no position table among its weights, no rope/alibi key in its config.json, "
           + (f"and transformers' modeling_{mt}.py neither rotates nor adds an ALiBi bias" if code else
              f"and transformers has no modeling_{mt}.py to read"))
    src["positions"] = "undecided: " + why
    return "unknown", 0, why


def config_positions(cfg: Mapping[str, Any]) -> str:
    """The position scheme of a ``config.json`` dict read without its weights nor its sizes
    (the config's keys, then transformers' code for its model type; :data:`SCHEMES`); a
    TransformerLens config's ``positional_embedding_type``."""
    if "model_type" not in cfg:
        kind = str(cfg.get("positional_embedding_type") or "standard")
        return {"standard": "learned", "shortformer": "learned"}.get(kind, kind if kind in SCHEMES else "unknown")
    return _positions(cfg, str(cfg.get("model_type") or ""), None, 0, None, {})[0]


def architecture(cfg: Mapping[str, Any], where: str = "model", weights: Shapes | None = None) -> Architecture:
    """The :class:`Architecture` of a model from its ``config.json`` (a dict) and, when given,
    its weights' names and shapes (``weights``: :func:`posmech.models.model_dir.weight_shapes`,
    no tensor read); ``where`` names the model in errors. Raises :class:`PosmechError` when a
    size cannot be read; a position scheme that cannot be told is ``unknown`` with its reason."""
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
    src: dict[str, str] = {}
    layer0 = _layer0(weights or {})
    kv_key, kv = config_kv_heads(cfg, n_heads)
    found = _weights_kv(layer0, n_heads, d_head, d_model)
    if found is not None and n_heads % found[1] == 0:
        src["n_kv_heads"] = f"weights: {found[0]}" + (f" (config `{kv_key}` says {kv})" if found[1] != kv else "")
        kv = found[1]
    else:
        src["n_kv_heads"] = f"config: {kv_key}"
    key, ctx = _first(cfg, CONTEXT_KEYS)
    positions, offset, undecided = _positions(cfg, mt, weights, d_model, ctx, src)
    if positions == "learned" and ctx is None and "position table" in src["positions"]:
        m = re.search(r"\[(\d+), ", src["positions"])
        key, ctx = "weights", int(m[1]) if m else None
    mlp_kind = _mlp_kind(cfg, layer0, src)
    cap = cfg.get("attn_logit_softcapping")
    return Architecture(
        model_type=mt, positions=positions,
        rotary_fraction=_rotary_fraction(cfg, mt, d_head) if positions == "rotary" else None,
        context=ctx, context_key=key, attn_scale=1.0 / score_divisor(cfg, d_head, where), n_layers=n_layers,
        n_heads=n_heads, n_kv_heads=kv, d_model=d_model, d_head=d_head, has_mlp=mlp_kind != "none",
        position_offset=offset, post_ln=mt == "opt" and not cfg.get("do_layer_norm_before", True),
        rotary_interleaved=_interleaved(cfg, mt, src) if positions == "rotary" else None,
        parallel_blocks=_parallel(cfg, layer0, src), mlp_kind=mlp_kind,
        score_softcap=float(cap) if isinstance(cap, (int, float)) and cap > 0 else None,
        undecided=undecided, sources=src,
    )


def layer_windows(cfg: Mapping[str, Any], n_layers: int) -> list[int]:
    """The sliding window of each layer (keys a query sees, itself included; 0: every earlier
    key), from a Hugging Face ``config.json`` dict: GPT-Neo's ``attention_layers`` /
    ``attention_types`` (``local`` layers see ``window_size``), else ``layer_types``
    (``sliding_attention`` layers see ``sliding_window``: Gemma 2, Qwen2 with
    ``use_sliding_window``), else ``sliding_window`` on every layer unless
    ``use_sliding_window`` is false (Mistral; Qwen2 without ``layer_types``: from layer
    ``max_window_layers`` on). A list that does not cover every layer is a
    :class:`PosmechError`."""
    kinds: list[str] = []
    if cfg.get("attention_layers") or cfg.get("attention_types"):
        if cfg.get("attention_layers"):
            kinds = [str(k) for k in cfg["attention_layers"]]
        else:
            for names, repeat in cfg["attention_types"]:
                kinds += [str(k) for k in names] * int(repeat)
        size = int(cfg.get("window_size") or 256)
        windows = [size if k == "local" else 0 for k in kinds]
    elif isinstance(cfg.get("layer_types"), list):
        size = int(cfg.get("sliding_window") or 0)
        windows = [size if str(k) == "sliding_attention" else 0 for k in cfg["layer_types"]]
    else:
        size = cfg.get("sliding_window")
        on = isinstance(size, int) and size > 0 and cfg.get("use_sliding_window", True) is not False
        # Qwen2 without layer_types: the layers from max_window_layers on slide
        first = int(cfg.get("max_window_layers") or 0) if cfg.get("use_sliding_window") else 0
        windows = [int(size) if on and i >= first else 0 for i in range(n_layers)]  # type: ignore[arg-type]
    if len(windows) != n_layers:
        raise PosmechError(f"config.json's attention_types / layer_types give {len(windows)} layers, the model has "
                           f"{n_layers}")
    return windows


#: the taxonomy's name for :func:`layer_windows` (the uniform baseline of a sliding-window layer)
attention_windows = layer_windows


def read_architecture(hf_dir: str | os.PathLike[str], where: str | None = None) -> Architecture:
    """:func:`architecture` of the ``config.json`` in ``hf_dir`` and its safetensors
    weights' names and shapes (headers only)."""
    p = Path(hf_dir) / "config.json"
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise PosmechError(f"{str(p)!r} cannot be read as JSON ({err})") from None
    return architecture(cfg, where or repr(str(hf_dir)), weight_shapes(hf_dir))


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
        from dataclasses import replace

        arch = architecture({"model_type": "llama", "hidden_size": d_model, "num_hidden_layers": n_layer,
                             "num_attention_heads": n_head, "num_key_value_heads": n_head,
                             "max_position_embeddings": n_ctx}, where)
        # its config alone does not say the MLP is gated; the model the training writes does
        return replace(arch, mlp_kind="gated", sources={**arch.sources, "mlp_kind": "training: Llama's SwiGLU MLP"})
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
