"""A model directory that agrees with itself: its tokenizer files are there, and the
shapes of its weights are what its ``config.json`` says, read from the files' headers only.

A local model directory (``models.<m>.source``) is checked before any job
(:func:`posmech.pipeline.preflight.local_model_problems`): a ``config.json`` edited to
``n_embd: 64`` on 32-wide weights, or ``n_layer: 3`` on two layers, would otherwise pass
every check and ``fetch_model`` and fail inside a job's loader, and a directory without its
tokenizer would be reported as a token string of no tokens.

* :func:`tokenizer_problem`: the files a tokenizer is read from are present: ``tokenizer.json``
  (a fast tokenizer), ``vocab.json`` with ``merges.txt`` (BPE), a sentencepiece ``*.model``
  (``tokenizer.model``, ``spiece.model``, …) or ``vocab.txt`` (WordPiece); a legacy
  TransformerLens checkpoint converted by ``fetch_model`` (``config.json`` and ``*.pth``, no
  safetensors; :func:`posmech.models.loading.convert_tl_legacy`) may name its tokenizer with
  ``tokenizer_name`` instead.
* :func:`weight_shapes`: ``{tensor name: shape}`` of the directory's safetensors weights
  (``model.safetensors``, or the shards ``model.safetensors.index.json`` names), read from
  each file's JSON header (8 bytes of little-endian length, then the JSON): no weight is read.
* :func:`shape_problems`: those shapes against the config, for any architecture, told from
  the names alone: the **token embedding** (a 2-D tensor outside the layers named like one,
  ``wte``/``embed_tokens``/``word_embeddings``/``embed_in``/``W_E``/…, else the largest whose
  first dimension is near ``vocab_size``) is ``[vocab_size, width]``; the **layers** are the
  largest index after ``layers.``/``h.``/``layer.``/``blocks.`` plus one; the **attention
  projections** of layer 0 (``q_proj``/``k_proj``/``v_proj``/``query``/…, fused
  ``c_attn``/``query_key_value``/``qkv_proj``/…, TransformerLens ``W_Q [heads, width, head
  size]``) are heads x head size wide, where that can be decided. Each mismatch names the
  config key and both values.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from posmech.core.errors import PosmechError

#: ``(files, what they are)``: any one complete set is a tokenizer AutoTokenizer can read
TOKENIZER_SETS = ((("tokenizer.json",), "tokenizer.json"),
                  (("vocab.json", "merges.txt"), "vocab.json with merges.txt"),
                  (("vocab.txt",), "vocab.txt"))
#: tokenizer classes that need no file (byte-level)
FILELESS_TOKENIZERS = ("ByT5Tokenizer", "CanineTokenizer")

WIDTH_KEYS = ("n_embd", "hidden_size", "d_model")
LAYER_KEYS = ("n_layer", "num_hidden_layers", "n_layers", "num_layers")
HEAD_KEYS = ("n_head", "num_attention_heads", "n_heads", "num_heads")
KV_KEYS = ("num_key_value_heads", "n_key_value_heads", "num_kv_heads", "n_head_kv")
HEAD_SIZE_KEYS = ("head_dim", "d_head")
VOCAB_KEYS = ("vocab_size", "d_vocab", "n_vocab", "padded_vocab_size")
#: a token embedding narrower than the model, projected up (OPT-350m's ``word_embed_proj_dim``)
EMBED_WIDTH_KEYS = ("word_embed_proj_dim", "embedding_size")
#: attention that is not heads x head size (multi-head latent attention): no head check
LATENT_ATTENTION_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")

#: a layer index in a weight's name
LAYER = re.compile(r"(?:^|\.)(?:layers|h|layer|blocks)\.(\d+)\.")
TOKEN_EMBEDDING = re.compile(r"(?:^|[._])(?:wte|embed_tokens|word_embeddings|embed_in|tok_embeddings|token_embeddings?"
                             r"|tok_emb|word_emb|W_E|embeddings?|embed)(?:$|[._])")
NOT_TOKEN_EMBEDDING = re.compile(r"pos|wpe|W_pos|token_type|unembed|W_U|rotary|rel_", re.IGNORECASE)
Q_NAMES, K_NAMES, V_NAMES = ("q_proj", "query", "q", "wq", "q_lin"), ("k_proj", "key", "k", "wk", "k_lin"), \
    ("v_proj", "value", "v", "wv", "v_lin")
QKV_NAMES = ("c_attn", "query_key_value", "qkv_proj", "Wqkv", "W_pack", "qkv")


def is_tl_config(cfg: Mapping[str, Any]) -> bool:
    """(Also :mod:`posmech.models.architecture`'s.) A legacy TransformerLens config (``d_model``, ``n_layers``, no ``model_type``)."""
    return "model_type" not in cfg and "d_model" in cfg and "n_layers" in cfg


def config_kv_heads(cfg: Mapping[str, Any], n_heads: int) -> tuple[str, int]:
    """``(key, n)``: the key/value heads the config gives (``num_key_value_heads``…), 1 for
    ``multi_query`` (unless Falcon's ``new_decoder_architecture``, whose ``num_kv_heads``
    counts), else ``n_heads`` (``num_attention_heads``: no grouping)."""
    if cfg.get("multi_query") and not cfg.get("new_decoder_architecture"):
        return "multi_query", 1
    return _int(cfg, KV_KEYS) or ("num_attention_heads", n_heads)


def _int(cfg: Mapping[str, Any], keys: tuple[str, ...]) -> tuple[str, int] | None:
    for k in keys:
        v = cfg.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return k, int(v)
    return None


# --------------------------------------------------------------------------- tokenizer
def tokenizer_problem(d: str | os.PathLike[str], cfg: Mapping[str, Any] | None = None) -> str | None:
    """Why the model directory ``d`` has no tokenizer (``None``: it has one): no complete set
    of tokenizer files (:data:`TOKENIZER_SETS`, or a sentencepiece ``*.model``), unless its
    ``tokenizer_config.json`` names a byte-level tokenizer that needs none, or ``d`` is a legacy
    TransformerLens checkpoint still in ``.pth`` form whose ``config.json`` (``cfg``) names a
    ``tokenizer_name`` (``fetch_model`` saves that tokenizer beside the converted weights)."""
    p = Path(d)
    if any(all((p / f).is_file() for f in files) for files, _ in TOKENIZER_SETS):
        return None
    if any(f.is_file() for f in p.glob("*.model")):
        return None
    try:
        tok_cfg = json.loads((p / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        tok_cfg = None
    if isinstance(tok_cfg, dict) and tok_cfg.get("tokenizer_class") in FILELESS_TOKENIZERS:
        return None
    cfg = cfg or {}
    legacy_pth = is_tl_config(cfg) and not list(p.glob("*.safetensors"))
    if legacy_pth and isinstance(cfg.get("tokenizer_name"), str) and cfg["tokenizer_name"]:
        return None
    partial = [f for f in ("vocab.json", "merges.txt") if (p / f).is_file()]
    found = (f"; it has {partial[0]} without {'merges.txt' if partial[0] == 'vocab.json' else 'vocab.json'}"
             if len(partial) == 1 else "")
    also = "; nor a `tokenizer_name` in its config.json, which a TransformerLens .pth checkpoint may give" \
        if legacy_pth else ""
    return (f"{str(p)!r} has no tokenizer files (none of {'; '.join(w for _, w in TOKENIZER_SETS)}; "
            f"a sentencepiece *.model{also}){found}, so no text can be tokenized for this model. Fix: copy the "
            "tokenizer files from where the model came from into that directory, or save its tokenizer there "
            "(`AutoTokenizer.from_pretrained(<the model's Hub id or directory>).save_pretrained(dir)`)")


# --------------------------------------------------------------------------- safetensors headers
def safetensors_header(path: str | os.PathLike[str]) -> tuple[dict[str, tuple[int, ...]], int]:
    """``({tensor name: shape}, bytes the file should have)`` of a ``.safetensors`` file, from
    its header alone: the first 8 bytes (the JSON header's length, little-endian), then that
    many bytes of JSON; no tensor is read. :class:`ValueError` when they are no safetensors
    header."""
    p = Path(path)
    size = p.stat().st_size
    try:
        with open(p, "rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if n < 2 or n > size - 8 or n > 100 << 20:
                raise ValueError(f"header length {n} for a file of {size} bytes")
            header = json.loads(f.read(n))
        if not isinstance(header, dict):
            raise ValueError(f"the header is a JSON {type(header).__name__}, not an object")
        tensors = {k: v for k, v in header.items() if k != "__metadata__"}
        shapes = {k: tuple(int(x) for x in v["shape"]) for k, v in tensors.items()}
        end = max((int(v["data_offsets"][1]) for v in tensors.values()), default=0)
    except (KeyError, TypeError, IndexError) as err:
        raise ValueError(f"{type(err).__name__}: {err}") from None
    return shapes, 8 + n + end


def weight_files(d: str | os.PathLike[str]) -> list[Path]:
    """The safetensors files holding a directory's weights: the shards its
    ``model.safetensors.index.json`` names, else ``model.safetensors``, else every
    ``*.safetensors``. A shard the index names that is missing raises :class:`PosmechError`;
    an index that does not parse, :class:`ValueError`."""
    p = Path(d)
    index = p / "model.safetensors.index.json"
    if index.is_file():
        doc = json.loads(index.read_text(encoding="utf-8"))
        weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
        if not isinstance(weight_map, dict):
            raise ValueError(f"{str(index)!r} has no `weight_map`")
        files = sorted({p / str(v) for v in weight_map.values()})
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise PosmechError(f"{str(p)!r}: shard(s) {', '.join(missing)} named by model.safetensors.index.json "
                               "are missing; copy the whole model directory again")
        return files
    if (p / "model.safetensors").is_file():
        return [p / "model.safetensors"]
    return sorted(p.glob("*.safetensors"))


def weight_shapes(d: str | os.PathLike[str]) -> dict[str, tuple[tuple[int, ...], str]]:
    """``{tensor name: (shape, file name)}`` of a directory's safetensors weights
    (:func:`weight_files`), from their headers only; empty when it has none. A file whose
    header is not one raises :class:`PosmechError` naming it (the pipeline's own check of
    whole files, with the fixes, is :func:`posmech.models.loading.check_safetensors`)."""
    out: dict[str, tuple[tuple[int, ...], str]] = {}
    for f in weight_files(d):
        try:
            shapes, _ = safetensors_header(f)
        except ValueError as err:
            raise PosmechError(f"weights file {str(f)!r} has no valid safetensors header ({err})") from None
        out.update({k: (s, f.name) for k, s in shapes.items()})
    return out


# --------------------------------------------------------------------------- shapes against the config
def token_embedding(shapes: Mapping[str, tuple[tuple[int, ...], str]], vocab: int | None) -> str | None:
    """The name of the token embedding among ``shapes`` (:func:`weight_shapes`): a 2-D tensor
    outside the layers, not a position table nor an unembedding, named like a token
    embedding (the largest such), else the largest whose first dimension is within 10% (at
    least 128) of ``vocab``; ``None`` when neither is there."""
    cands = [k for k, (s, _) in shapes.items()
             if len(s) == 2 and not LAYER.search(k) and not NOT_TOKEN_EMBEDDING.search(k)]

    def size(k: str) -> int:
        a, b = shapes[k][0]
        return a * b

    named = [k for k in cands if TOKEN_EMBEDDING.search(k.removesuffix(".weight"))]
    if named:
        return max(named, key=size)
    if vocab:
        near = [k for k in cands if abs(shapes[k][0][0] - vocab) <= max(128, vocab // 10)]
        if near:
            return max(near, key=size)
    return None


def _out_width(shape: tuple[int, ...], d_model: int) -> int | None:
    """The output width of a 2-D projection from the residual stream: ``[out, d_model]``
    (torch ``Linear``) or ``[d_model, out]`` (GPT-2's ``Conv1D``); ``None`` if neither side is
    ``d_model``."""
    if len(shape) != 2:
        return None
    if shape[1] == d_model:
        return shape[0]
    if shape[0] == d_model:
        return shape[1]
    return None


def _fmt(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


def shape_problems(d: str | os.PathLike[str], cfg: Mapping[str, Any],
                   shapes: Mapping[str, tuple[tuple[int, ...], str]] | None = None) -> list[str]:
    """Where the weights of model directory ``d`` (safetensors headers, :func:`weight_shapes`,
    or ``shapes``) disagree with its ``config.json`` (``cfg``): the token embedding's rows
    against the vocabulary key and its columns against the width key, the number of layers
    against the layers key, layer 0's attention projections against heads x head size. Each
    message names the key, its value, what the weights have and where; empty when they agree,
    or when the directory has no safetensors weights (nothing to read without loading them)."""
    shapes = weight_shapes(d) if shapes is None else shapes
    if not shapes:
        return []
    tl = is_tl_config(cfg)
    fix = ("the directory disagrees with itself: correct that key in config.json, or save the model and its "
           "config together again (`model.save_pretrained(dir)`)")
    pre = f"{str(Path(d) / 'config.json')!r}:"
    out: list[str] = []
    width = _int(cfg, WIDTH_KEYS)
    vocab = _int(cfg, VOCAB_KEYS)
    emb = token_embedding(shapes, vocab[1] if vocab else None)
    width_told = False
    if emb is not None:
        (rows, cols), file = shapes[emb]
        if vocab and rows != vocab[1]:
            out.append(f"{pre} `{vocab[0]}` is {vocab[1]} but the token embedding `{emb}` in {file} is "
                       f"{_fmt((rows, cols))}: {rows} tokens; {fix}")
        widths = {w for _, w in filter(None, [width] + [_int(cfg, (k,)) for k in EMBED_WIDTH_KEYS])}
        if width and cols not in widths:
            width_told = True
            out.append(f"{pre} `{width[0]}` is {width[1]} but the weights are {cols} wide (the token embedding "
                       f"`{emb}` in {file} is {_fmt((rows, cols))}); {fix}")
    layers = _int(cfg, LAYER_KEYS)
    index: dict[int, str] = {}
    for k in sorted(shapes):
        m = LAYER.search(k)
        if m:
            index.setdefault(int(m[1]), k[:m.end()] + "…")
    if layers and index:
        n = max(index) + 1
        missing = sorted(set(range(n)) - set(index))
        if n != layers[1]:
            out.append(f"{pre} `{layers[0]}` is {layers[1]} but the weights have {n} layers (0-{n - 1}: the last "
                       f"is `{index[n - 1]}`); {fix}")
        elif missing:
            out.append(f"{pre} the weights have no tensor of layer(s) {', '.join(map(str, missing))} of the "
                       f"{n} that `{layers[0]}` says; copy the whole model directory again")
    if width and not any(k in cfg for k in LATENT_ATTENTION_KEYS) and 0 in index:
        out += _attention_problems(pre, fix, shapes, cfg, width, tl, width_told)
    return out


def _attention_problems(pre: str, fix: str, shapes: Mapping[str, tuple[tuple[int, ...], str]],
                        cfg: Mapping[str, Any], width: tuple[str, int], tl: bool, width_told: bool) -> list[str]:
    """Layer 0's attention projections against the config (see :func:`shape_problems`): one
    message for the width (a projection with no side ``width`` wide; not when ``width_told``,
    the token embedding having told it already), one for heads x head size naming every
    projection that disagrees."""
    heads = _int(cfg, HEAD_KEYS)
    if heads is None:
        return []
    given = _int(cfg, HEAD_SIZE_KEYS)
    d_head = given[1] if given else width[1] // heads[1]
    head_words = f"`{given[0]}` {d_head}" if given else f"{d_head} (`{width[0]}` / `{heads[0]}`)"
    kv_key, kv_n = config_kv_heads(cfg, heads[1])
    kv = heads if kv_key == "num_attention_heads" else (kv_key, kv_n)
    layer0 = {k: v for k, v in shapes.items() if (m := LAYER.search(k)) and m[1] == "0"}
    wrong: list[str] = []  # "what the config gives = n, but `tensor` is [..]"
    narrow: list[str] = []  # projections with no side of the model's width

    def leaf_of(k: str) -> str:
        return k.removesuffix(".weight").rsplit(".", 1)[-1]

    order = ("W_Q", *Q_NAMES, "W_K", "_W_K", *K_NAMES, "W_V", "_W_V", *V_NAMES)
    for k, (shape, file) in sorted(layer0.items(), key=lambda kv: (
            order.index(leaf_of(kv[0])) if leaf_of(kv[0]) in order else len(order), kv[0])):
        leaf = leaf_of(k)
        if tl and leaf in ("W_Q", "W_K", "W_V", "_W_K", "_W_V") and len(shape) == 3:
            n = heads if leaf == "W_Q" or kv is heads else kv
            if shape[1] != width[1]:
                narrow.append(f"`{k}` in {file} is {_fmt(shape)}")
            elif shape[0] != n[1]:
                wrong.append(f"`{n[0]}` is {n[1]} but `{k}` in {file} is {_fmt(shape)} ({shape[0]} heads)")
            elif shape[2] != d_head:
                wrong.append(f"the head size is {head_words} but `{k}` in {file} is {_fmt(shape)} (heads of "
                             f"{shape[2]})")
            continue
        if not k.endswith(".weight") or len(shape) != 2:
            continue
        if leaf in Q_NAMES:
            want, what = heads[1] * d_head, f"`{heads[0]}` {heads[1]} x head size {head_words}"
        elif leaf in K_NAMES + V_NAMES:
            want, what = kv[1] * d_head, f"`{kv[0]}` {kv[1]} x head size {head_words}"
        elif leaf in QKV_NAMES:
            want = (heads[1] + 2 * kv[1]) * d_head
            what = (f"(`{heads[0]}` {heads[1]} query + 2 x `{kv[0]}` {kv[1]} key/value heads) x head size "
                    f"{head_words}" if kv is not heads else f"3 x `{heads[0]}` {heads[1]} x head size {head_words}")
        else:
            continue
        got = _out_width(shape, width[1])
        if got is None:
            narrow.append(f"`{k}` in {file} is {_fmt(shape)}")
        elif got != want:
            wrong.append(f"{what} = {want}, but `{k}` in {file} is {_fmt(shape)} ({got} wide)")

    def some(items: list[str]) -> str:
        return "; ".join(items[:2]) + (f"; and {len(items) - 2} more" if len(items) > 2 else "")

    out = []
    if narrow and not width_told:
        out.append(f"{pre} `{width[0]}` is {width[1]} but no side of layer 0's attention projections is "
                   f"{width[1]} wide ({some(narrow)}); {fix}")
    if wrong and not narrow:
        out.append(f"{pre} the attention heads disagree with the weights: {some(wrong)}; {fix}")
    return out
