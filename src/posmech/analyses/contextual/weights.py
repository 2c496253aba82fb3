"""Layer-0 weights of a model with learned absolute positions, read in float64 from its
files (Hugging Face GPT-2 and GPT-Neo directly; any other learned-position model the posmech
engine runs, OPT and GPT-BigCode among them, through the engine's converter
:func:`posmech.models.lens.hf_state`; legacy TransformerLens checkpoints): the inputs of the
layer-0 decomposition (:mod:`posmech.analyses.contextual.decomposition`). Grouped-query and
multi-query key heads are repeated per query head. Rotary/ALiBi and shortformer models are
refused with an error naming the config key."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from posmech.analyses.contextual.relative import RELATIVE_SCHEMES, Layer0Relative, relative_from_model
from posmech.core.errors import PosmechError
from posmech.models.architecture import config_positions, score_divisor

# --------------------------------------------------------------------------- weights
@dataclass
class Layer0Weights:
    """Layer-0 weights of a GPT-2-style model with learned absolute positions (float64).

    ``W_E [V, d]``, ``W_pos [P, d]``, ``ln_w, ln_b [d]`` (LayerNorm γ, β), ``eps``,
    ``W_Q, W_K [H, d, d_head]``, ``b_Q, b_K [H, d_head]``, ``attn_scale`` (scores are
    divided by it)."""

    W_E: np.ndarray
    W_pos: np.ndarray
    ln_w: np.ndarray
    ln_b: np.ndarray
    eps: float
    W_Q: np.ndarray
    b_Q: np.ndarray
    W_K: np.ndarray
    b_K: np.ndarray
    attn_scale: float

    @property
    def n_heads(self) -> int:
        return int(self.W_Q.shape[0])

    @property
    def n_ctx(self) -> int:
        return int(self.W_pos.shape[0])

    @property
    def d_vocab(self) -> int:
        return int(self.W_E.shape[0])

    @property
    def d_head(self) -> int:
        return int(self.W_Q.shape[-1])

    def resid(self, ids: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """``r = W_E[ids] + W_pos[pos]`` ``[T, d]``."""
        return self.W_E[np.asarray(ids)] + self.W_pos[np.asarray(pos)]

    def ln_scale(self, ids: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """``blocks.0.ln1.hook_scale``: ``sqrt(var(r) + eps)`` per token ``[T]``."""
        return np.sqrt(self.resid(ids, pos).var(axis=-1) + self.eps)

    def ln(self, ids: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """The exact post-ln1 embedding ``[T, d]``."""
        r = self.resid(ids, pos)
        r = r - r.mean(axis=-1, keepdims=True)
        return r / np.sqrt(np.square(r).mean(axis=-1, keepdims=True) + self.eps) * self.ln_w + self.ln_b

    def _project(self, x: np.ndarray, W: np.ndarray) -> np.ndarray:
        """``x [T, d] @ W [H, d, d_head]`` → ``[H, T, d_head]`` as one BLAS matrix product."""
        H, d, dh = W.shape
        return (x @ W.transpose(1, 0, 2).reshape(d, H * dh)).reshape(len(x), H, dh).transpose(1, 0, 2)

    def queries(self, ids: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """Exact-LN queries ``[H, T, d_head]`` of tokens ``ids`` at positions ``pos``."""
        return self._project(self.ln(ids, pos), self.W_Q) + self.b_Q[:, None]

    def exact_keys(self, ids: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """Exact-LN keys ``[H, T, d_head]``."""
        return self._project(self.ln(ids, pos), self.W_K) + self.b_K[:, None]

    def positional_scores(self, q: np.ndarray, dest: np.ndarray, pos: np.ndarray, K: int, s: float) -> np.ndarray:
        """``π [H, N, K]``: queries ``q [H, N, d_head]`` at the positional keys of keys
        ``0..K−1`` (the same for every destination token ``dest``)."""
        return q @ self.positional_keys(s)[:, :K].transpose(0, 2, 1) / self.attn_scale

    def positional_keys(self, s: float, token: int | None = None) -> np.ndarray:
        """``kp_h(i) = (γ⊙p̃_i/s + β) W_K + b_K`` for every position ``[H, P, d_head]``
        (computed once per ``s``; the same for every ``token``)."""
        cache = self.__dict__.setdefault("_positional_keys", {})
        if s not in cache:
            p = self.W_pos - self.W_pos.mean(axis=-1, keepdims=True)
            cache.clear()
            cache[s] = self._project(p / s * self.ln_w + self.ln_b, self.W_K) + self.b_K[:, None]
        return cache[s]

    def content_keys(self, s: float, ids: np.ndarray | None = None) -> np.ndarray:
        """``kc_h(x) = (γ⊙ẽ(x)/s) W_K`` ``[H, U, d_head]`` for tokens ``ids`` (all when None)."""
        e = self.W_E if ids is None else self.W_E[np.asarray(ids)]
        e = e - e.mean(axis=-1, keepdims=True)
        return self._project(e / s * self.ln_w, self.W_K)


def refuse_unsupported(hf_config: dict[str, Any], model: str, key: str = "contextual.models") -> None:
    """Rotary/ALiBi and shortformer models have no positional embedding in the residual
    stream, so there is no layer-0 positional score: a clear error naming the model and ``key``."""
    mtype = hf_config.get("model_type")
    scheme = config_positions(hf_config)
    if scheme != "learned" or hf_config.get("rotary") or \
            hf_config.get("positional_embedding_type") in ("rotary", "alibi"):
        raise PosmechError(
            f"model {model!r} (model_type {mtype!r}) uses {scheme} positions: layer 0 has no positional "
            f"embedding in the residual stream to decompose; remove {model!r} from `{key}`"
        )
    if hf_config.get("shortformer_pos") or hf_config.get("positional_embedding_type") == "shortformer":
        raise PosmechError(
            f"model {model!r} uses shortformer positions (added to queries and keys only): remove it from `{key}`"
        )


def as_float64(t: Any) -> np.ndarray:
    """A torch tensor or numpy array as a float64 numpy array."""
    if hasattr(t, "detach"):
        t = t.detach().double().cpu().numpy()
    return np.asarray(t, dtype=np.float64)


#: model types whose layer-0 weights are read from their own checkpoint names here; every
#: other learned-position model type the engine runs (:func:`posmech.models.lens.unsupported_hf`)
#: is read through the engine's converter (:func:`posmech.models.lens.hf_state`,
#: TransformerLens's layout) and then :func:`weights_from_tl`: OPT (its position table from
#: row 2, ``q·k/sqrt(d_head)``), GPT-BigCode (its one key head of multi-query attention)
DIRECT_TYPES = ("gpt2", "gpt_neo")


def hf_param(model: Any, name: str) -> Any:
    """The parameter ``name`` (``model.decoder.layers.0.fc1.weight``) of a Hugging Face
    model or of a :class:`posmech.models.loading.WeightView`, as a torch tensor; ``None``
    when the model has none (a bias-free projection)."""
    obj = model
    for part in name.split("."):
        obj = getattr(obj, part, None)
        if obj is None:  # a GPT-2-style checkpoint name (``h.0...``) of a model in memory (``transformer.h.0...``)
            body = getattr(model, "transformer", None)
            return None if body is None or body is model else hf_param(body, name)
    if hasattr(obj, "detach"):
        return obj
    import torch

    return torch.from_numpy(np.ascontiguousarray(obj))


def layer0_state(model: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Layer 0's weights of a Hugging Face model the engine runs (or its
    directory's ``WeightView``) as a TransformerLens state dict and config (a dict: ``d_model``,
    ``d_head``, ``d_mlp``, ``eps``, ``attn_scale`` the divisor of ``q·k``, ``post_ln``, …), by
    the forward engine's own converter :func:`posmech.models.lens.hf_state` read for one
    layer (the other layers are not read)."""
    from dataclasses import asdict

    from posmech.models.lens import hf_state

    cfg = model.config.to_dict()
    one = {**cfg, "num_hidden_layers": 1, "n_layer": 1, "num_layers": 1}
    sd, lens_cfg = hf_state(lambda n: hf_param(model, n), one)
    # TransformerLens's names (attn_scale already the config's own divisor): a TransformerLens config
    return sd, {k: v for k, v in asdict(lens_cfg).items() if k != "model_type"}


def weights_from_hf(model: Any, name: str = "model") -> Layer0Weights:
    """:class:`Layer0Weights` of a Hugging Face model with learned positions, or of its
    directory's :class:`posmech.models.loading.WeightView` (its raw weights: the function,
    hence the decomposition, does not depend on TransformerLens processing): GPT-2 and GPT-Neo
    read here, any other model the posmech engine runs through :func:`layer0_state` (OPT:
    ``W_pos`` is its position table from row 2, the row of position 0; GPT-BigCode: its one
    key head repeated for every query head). A model the engine does not run: an error with
    the engine's reason."""
    from posmech.models.lens import unsupported_hf

    cfg = model.config.to_dict()
    refuse_unsupported(cfg, name)
    mtype = cfg.get("model_type")
    body = getattr(model, "transformer", None)
    if mtype not in DIRECT_TYPES or body is None:
        why = unsupported_hf(cfg)
        if why is not None:
            raise PosmechError(f"model {name!r}: the layer-0 decomposition reads layer 0 of GPT-2, GPT-Neo or a "
                               f"learned-position model the posmech engine runs, and it does not run this one "
                               f"({why}); remove it from `contextual.models`")
        return weights_from_tl(*layer0_state(model), name)
    get = as_float64
    blk = body.h[0]
    d = int(cfg.get("n_embd") or cfg["hidden_size"])
    H = int(cfg.get("n_head") or cfg["num_heads"])
    dh = d // H
    if mtype == "gpt2":
        W, b = get(blk.attn.c_attn.weight), get(blk.attn.c_attn.bias)  # Conv1D [d, 3d]
        split = lambda m: m.reshape(d, H, dh).transpose(1, 0, 2)  # noqa: E731
        W_Q, W_K = split(W[:, :d]), split(W[:, d : 2 * d])
        b_Q, b_K = b[:d].reshape(H, dh), b[d : 2 * d].reshape(H, dh)
    else:
        if cfg.get("attention_layers", ["global"])[0] != "global":
            raise PosmechError(f"model {name!r}: layer 0 is a sliding-window layer; remove it from `contextual.models`")
        att = blk.attn.attention
        lin = lambda m: get(m.weight).T.reshape(d, H, dh).transpose(1, 0, 2)  # noqa: E731
        bias = lambda m: get(m.bias).reshape(H, dh) if m.bias is not None else np.zeros((H, dh))  # noqa: E731
        W_Q, W_K, b_Q, b_K = lin(att.q_proj), lin(att.k_proj), bias(att.q_proj), bias(att.k_proj)
    return Layer0Weights(get(body.wte.weight), get(body.wpe.weight), get(blk.ln_1.weight), get(blk.ln_1.bias),
                         float(cfg.get("layer_norm_epsilon", 1e-5)), W_Q, b_Q, W_K, b_K, score_divisor(cfg, dh))


def weights_from_tl(state: dict[str, Any], cfg: dict[str, Any], name: str = "model") -> Layer0Weights:
    """:class:`Layer0Weights` of a legacy TransformerLens checkpoint (``attn-only-2l`` and the
    demo's attention-only model): ``embed.W_E``, ``pos_embed.W_pos``, ``blocks.0.ln1.w/b``,
    ``blocks.0.attn.W_Q/W_K [H, d, d_head]``, ``b_Q/b_K [H, d_head]``; TransformerLens's
    LayerNorm eps (``eps``, default 1e-5) and score scale (:func:`posmech.models.architecture.score_divisor`:
    its ``attn_scale``, else √d_head unless ``use_attn_scale`` is false). ``cfg`` may be the
    engine's config of a Hugging Face model (:func:`layer0_state`); a post-LayerNorm one is
    refused."""
    refuse_unsupported(cfg, name)
    if cfg.get("post_ln"):
        raise PosmechError(f"model {name!r}: its LayerNorm comes after each residual addition (OPT's "
                           "do_layer_norm_before false), so layer 0's attention reads the raw residual, not a "
                           "LayerNorm of it: the layer-0 decomposition is not defined; remove it from `contextual.models`")
    norm = cfg.get("normalization_type", cfg.get("normalization", "LN"))
    if norm not in ("LN", "LNPre"):
        raise PosmechError(f"model {name!r}: layer-0 normalisation {norm!r} is not a LayerNorm; remove it from "
                           "`contextual.models`")
    get = lambda k: np.asarray(state[k], dtype=np.float64)  # noqa: E731
    d = int(cfg["d_model"])
    ln_w = get("blocks.0.ln1.w") if "blocks.0.ln1.w" in state else np.ones(d)
    ln_b = get("blocks.0.ln1.b") if "blocks.0.ln1.b" in state else np.zeros(d)
    scale = score_divisor(cfg, int(cfg["d_head"]), f"model {name!r}")
    W_Q, W_K = get("blocks.0.attn.W_Q"), get("blocks.0.attn.W_K")
    bias = lambda k, W: get(k) if k in state else np.zeros((W.shape[0], W.shape[-1]))  # noqa: E731
    b_K = bias("blocks.0.attn.b_K", W_K)
    H, Hkv = W_Q.shape[0], W_K.shape[0]
    if Hkv != H:  # grouped-query / multi-query: query head h reads key head h // (H / Hkv)
        if H % Hkv:
            raise PosmechError(f"model {name!r}: {H} query heads do not divide into {Hkv} key heads")
        kv = np.arange(H) // (H // Hkv)
        W_K, b_K = W_K[kv], b_K[kv]
    return Layer0Weights(get("embed.W_E"), get("pos_embed.W_pos"), ln_w, ln_b, float(cfg.get("eps", 1e-5)),
                         W_Q, bias("blocks.0.attn.b_Q", W_Q), W_K, b_K, scale)


def load_weights(manifest: dict[str, Any], name: str, tokenizer: bool = True,
                 entry: dict[str, Any] | None = None) -> tuple[Layer0Weights | Layer0Relative, Any]:
    """Layer-0 weights of a configured model (``manifest`` of
    :func:`posmech.models.loading.read_manifest`) and its tokenizer (``None`` when
    ``tokenizer`` is false: loading it imports ``transformers``): Hugging Face GPT-2 /
    GPT-Neo / pre-LayerNorm OPT directories and legacy TransformerLens checkpoints (safetensors),
    read from the files (no model is built). A model whose positions are not in the
    residual stream (rotary, ALiBi, none: the manifest's architecture) is loaded
    (``entry``: the model's config entry, its ``device``, ``dtype``, ``processing``,
    ``engine``) and read by :func:`~posmech.analyses.contextual.relative.relative_from_model`."""
    from posmech.models.architecture import architecture
    from posmech.models.loading import is_tl_legacy_dir, load_tokenizer, verify_weights, weight_view

    hf_dir = Path(manifest["hf_dir"])
    verify_weights(manifest)
    cfg = json.loads((hf_dir / "config.json").read_text())
    scheme = (manifest.get("architecture") or {}).get("positions") or architecture(cfg, f"model {name!r}").positions
    if scheme in RELATIVE_SCHEMES:
        from posmech.models.loading import analysis_context, load_model

        e = entry or {}
        model = load_model(manifest, e.get("device", "cpu"), e.get("dtype", "float32"),
                           e.get("processing", "compatibility"), e.get("engine", "auto"))
        return (relative_from_model(model, name, analysis_context(name, e, hf_dir)),
                load_tokenizer(hf_dir) if tokenizer else None)
    refuse_unsupported(cfg, name)
    if is_tl_legacy_dir(hf_dir):
        from safetensors.numpy import load_file

        own = (hf_dir / "tokenizer_config.json").exists()
        if not own and not cfg.get("tokenizer_name"):
            raise PosmechError(f"model {name!r}: {str(hf_dir)!r} has no tokenizer; save it into the directory")
        tok = load_tokenizer(hf_dir if own else cfg["tokenizer_name"]) if tokenizer else None
        return weights_from_tl(load_file(str(hf_dir / "model.safetensors")), cfg, name), tok
    return weights_from_hf(weight_view(manifest), name), load_tokenizer(hf_dir) if tokenizer else None

