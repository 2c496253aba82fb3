"""The per-layer activation cache: one forward pass over a tokenized corpus, streamed to HDF5.

``results/{model}/activations/{corpus}.h5`` (kind ``activations``, rule
``cache_activations``; every dataset and attribute is listed in ``docs/artifacts.md``):

* the token layout of the tokens file (``token_ids``, ``doc_ids``, ``positions``,
  ``doc_offsets``, ``documents/*``) for the cached documents;
* ``activations/{hook}`` ``[n_layers_hook, n_tokens, d_model]`` in the storage dtype,
  documents concatenated along the token axis (document ``j`` is
  ``[:, doc_offsets[j]:doc_offsets[j+1]]``), chunked ``(1, chunk_tokens, d_model)`` so
  one layer of one document, or one layer of a range of positions of every document, is
  a few chunk reads;
* ``position_stats/{hook}/mean`` ``[n_layers_hook, n_positions, d_model]`` float64 and
  ``position_stats/count`` ``[n_positions]`` int64: the mean over documents at every
  position, accumulated in float64 from the forward pass's own precision (exact whatever
  the storage dtype).

Hooks (TransformerLens names, in the configured processing mode):

* ``resid_pre``: ``blocks.{l}.hook_resid_pre`` for every block, then ``ln_final.hook_in``
  (the final residual) — ``n_layers + 1`` entries;
* ``ln1_out``: ``blocks.{l}.ln1.hook_out`` (the post-ln1 input to attention) — ``n_layers``.

Engines (``cache.engine``): ``hf`` runs the plain Hugging Face model (GPT-2-style
architectures) and applies the processing mode exactly (:class:`HFCapture`), ``bridge``
uses TransformerLens hooks (:class:`BridgeCapture`, any architecture); both give the same
values to float32 rounding (tested).

Resumability: the file is written at ``<path>.partial`` with every dataset allocated up
front (so a kill, even ``kill -9``, can only leave raw data of unfinished batches
half-written, never the file's structure); after every ``checkpoint_every`` batches (and at
most every ``checkpoint_seconds``) the float64 running sums and the number of finished
documents go to an atomically replaced checkpoint ``<path>.partial.ckpt.npz``.  A rerun with the same inputs and settings resumes
after the last checkpoint (batches have fixed boundaries, so the result is bitwise equal
to an uninterrupted run); anything that does not match or does not open restarts cleanly.
The file is renamed onto ``path`` only after the completion marker is set.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from posmech.errors import PosmechError
from posmech.hdf5 import (
    STR,
    attr_json,
    copy_compressed,
    open_artifact,
    preallocated_dataset,
    provenance,
    set_attrs,
)
from posmech.io import atomic_path
from posmech.tokens import TokenSet

LOG = logging.getLogger(__name__)

KIND = "activations"
RULE = "cache_activations"
HOOKS = ("resid_pre", "ln1_out")
PARTIAL = ".partial"
CHECKPOINT = ".partial.ckpt.npz"


def hook_points(hook: str, n_layers: int) -> list[str]:
    """TransformerLens hook names cached under ``hook``, in layer order."""
    if hook == "resid_pre":
        return [f"blocks.{layer}.hook_resid_pre" for layer in range(n_layers)] + ["ln_final.hook_in"]
    if hook == "ln1_out":
        return [f"blocks.{layer}.ln1.hook_out" for layer in range(n_layers)]
    raise PosmechError(f"config key `cache.hooks`: unknown hook {hook!r}; expected one of {', '.join(HOOKS)}")


@dataclass
class CacheSettings:
    """The ``cache:`` config section (see config/README.md)."""

    hooks: tuple[str, ...] = HOOKS
    n_documents: int | None = None
    batch_size: int = 8
    storage_dtype: str = "float16"
    compression: str | None = None
    compression_level: int = 4
    chunk_tokens: int = 128
    checkpoint_every: int = 1
    checkpoint_seconds: float = 10.0
    engine: str = "auto"

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> CacheSettings:
        keys = cls.__dataclass_fields__
        kw = {k: v for k, v in cfg.items() if k in keys}
        if "hooks" in kw:
            kw["hooks"] = tuple(kw["hooks"])
        return cls(**kw)

    def fingerprint_fields(self) -> dict[str, Any]:
        return {"hooks": list(self.hooks), "n_documents": self.n_documents, "batch_size": self.batch_size,
                "storage_dtype": self.storage_dtype, "chunk_tokens": self.chunk_tokens}


# --------------------------------------------------------------------------- forward pass
def forward_batch(bridge: Any, ids: np.ndarray, hooks: tuple[str, ...]) -> dict[str, Any]:
    """Run ``bridge`` on ``ids`` (int ``[batch, pos]``) and return, per hook, a float32 CPU
    tensor ``[n_layers_hook, batch, pos, d_model]``.  No logits are computed."""
    import torch

    n_layers = bridge.cfg.n_layers
    got: dict[tuple[str, int], Any] = {}

    def grab(key: tuple[str, int]) -> Callable[..., Any]:
        def fn(t: Any, hook: Any) -> Any:
            got[key] = t.detach()
            return t

        return fn

    fwd = [(name, grab((h, i))) for h in hooks for i, name in enumerate(hook_points(h, n_layers))]
    x = torch.as_tensor(ids, dtype=torch.long, device=bridge.cfg.device)
    with torch.inference_mode(), bridge.hooks(fwd_hooks=fwd):
        bridge(x, return_type=None)
    out = {}
    for h in hooks:
        n = len(hook_points(h, n_layers))
        missing = [i for i in range(n) if (h, i) not in got]
        if missing:
            raise PosmechError(f"hook {hook_points(h, n_layers)[missing[0]]!r} did not fire; this architecture "
                               f"does not expose `{h}`; remove it from `cache.hooks`")
        out[h] = torch.stack([got[(h, i)].float().cpu() for i in range(n)])
    return out


def padding_mask(lengths: np.ndarray, n_pos: int) -> np.ndarray:
    """``[batch, n_pos]`` bool: True where position ``p < lengths[b]`` (a real token)."""
    return np.arange(n_pos)[None, :] < np.asarray(lengths)[:, None]


class HFCapture:
    """The cached hooks from a plain Hugging Face GPT-2-style model (``transformer.h[i].ln_1``,
    ``transformer.ln_f``: GPT-2, GPT-Neo), with the processing mode applied exactly.

    The TransformerBridge's compatibility mode centres every weight that writes to the
    residual stream and folds each layer norm's affine into the next weights, so its
    ``hook_resid_pre`` is Hugging Face's residual minus its mean over ``d_model`` and its
    ``ln1.hook_out`` is the layer norm without affine; in ``raw`` mode both are Hugging
    Face's own.  Computing them from the plain model skips the bridge's per-module
    overhead (the forward pass is the same); tests check both engines agree.
    """

    def __init__(self, model: Any, processing: str) -> None:
        if processing not in ("compatibility", "raw"):
            raise PosmechError(f"unknown processing mode {processing!r}; expected `compatibility` or `raw`")
        self.model, self.processing = model, processing
        self.body = model.transformer
        self.n_layers = len(self.body.h)
        self.d_model = int(model.config.hidden_size)
        self.device = next(model.parameters()).device
        self.eps = [float(blk.ln_1.eps) for blk in self.body.h]

    @staticmethod
    def supports(model: Any) -> bool:
        body = getattr(model, "transformer", None)
        return body is not None and hasattr(body, "h") and hasattr(body, "ln_f") and all(
            hasattr(b, "ln_1") for b in body.h)

    def __call__(self, ids: np.ndarray, hooks: tuple[str, ...]) -> dict[str, Any]:
        import torch

        resid: dict[int, Any] = {}
        ln1: dict[int, Any] = {}
        handles = [self.body.ln_f.register_forward_pre_hook(
            lambda m, a: resid.__setitem__(self.n_layers, a[0].detach()))]
        for i, blk in enumerate(self.body.h):
            handles.append(blk.ln_1.register_forward_pre_hook(lambda m, a, i=i: resid.__setitem__(i, a[0].detach())))
            if self.processing == "raw" and "ln1_out" in hooks:
                handles.append(blk.ln_1.register_forward_hook(lambda m, a, o, i=i: ln1.__setitem__(i, o.detach())))
        x = torch.as_tensor(ids, dtype=torch.long, device=self.device)
        try:
            with torch.inference_mode():
                self.body(input_ids=x, use_cache=False)
        finally:
            for h in handles:
                h.remove()
        r = torch.stack([resid[i].float().cpu() for i in range(self.n_layers + 1)])
        out = {}
        if self.processing == "compatibility":
            r = r - r.mean(dim=-1, keepdim=True)
        if "ln1_out" in hooks:
            if self.processing == "raw":
                out["ln1_out"] = torch.stack([ln1[i].float().cpu() for i in range(self.n_layers)])
            else:
                eps = torch.tensor(self.eps)[:, None, None, None]
                body = r[: self.n_layers]
                out["ln1_out"] = body / torch.sqrt(body.pow(2).mean(dim=-1, keepdim=True) + eps)
        if "resid_pre" in hooks:
            out["resid_pre"] = r
        return out


class BridgeCapture:
    """The cached hooks from a TransformerLens ``TransformerBridge`` (any architecture it
    supports), via :func:`forward_batch`."""

    def __init__(self, bridge: Any) -> None:
        self.bridge = bridge
        self.n_layers, self.d_model = int(bridge.cfg.n_layers), int(bridge.cfg.d_model)

    def __call__(self, ids: np.ndarray, hooks: tuple[str, ...]) -> dict[str, Any]:
        return forward_batch(self.bridge, ids, hooks)


def as_capture(model: Any, processing: str | None = None) -> HFCapture | BridgeCapture:
    """Wrap a TransformerBridge (``processing`` ignored: the bridge is already in its mode)
    or a Hugging Face model (needs ``processing``)."""
    if isinstance(model, (HFCapture, BridgeCapture)):
        return model
    if hasattr(model, "cfg") and hasattr(model, "hooks"):
        return BridgeCapture(model)
    if processing is None:
        raise PosmechError("a Hugging Face model needs the processing mode (`compatibility` or `raw`)")
    if not HFCapture.supports(model):
        raise PosmechError(f"{type(model).__name__} has no GPT-2-style blocks; use `cache.engine: bridge`")
    return HFCapture(model, processing)


def load_capture(manifest: dict[str, Any], device: str, dtype: str, processing: str, engine: str = "auto") -> HFCapture | BridgeCapture:
    """The model to cache from: ``engine='hf'`` (plain Hugging Face model, GPT-2-style
    architectures), ``'bridge'`` (TransformerBridge, any architecture), ``'auto'`` (hf when
    supported)."""
    from posmech.models import is_tl_legacy_dir, load_bridge, load_hf, resolve_device

    if engine in ("auto", "hf") and not is_tl_legacy_dir(manifest["hf_dir"]):
        model, _ = load_hf(manifest, resolve_device(device), dtype)
        if HFCapture.supports(model):
            return HFCapture(model, processing)
        if engine == "hf":
            raise PosmechError(f"config key `cache.engine`: `hf` does not support {type(model).__name__}; "
                               "use `auto` or `bridge`")
        del model
    elif engine == "hf":
        raise PosmechError("config key `cache.engine`: `hf` does not support legacy TransformerLens "
                           "checkpoints; use `auto` or `bridge`")
    return BridgeCapture(load_bridge(manifest, device, dtype, processing))


def accumulate(sums: np.ndarray, acts: Any, lengths: np.ndarray) -> None:
    """Add the activations of one batch to the running position-wise sums (in place).

    ``sums`` float64 ``[L, n_positions, d]``; ``acts`` float tensor/array
    ``[L, batch, pos, d]``; ``lengths`` ``[batch]`` (positions ``>= lengths[b]`` of
    document ``b`` are padding and ignored).  The matching counts are
    ``padding_mask(lengths, pos).sum(0)``.
    """
    import torch

    a = torch.as_tensor(acts)
    total = torch.from_numpy(sums)  # shares memory: float32 values are added exactly in float64
    for b, n in enumerate(np.asarray(lengths).tolist()):
        total[:, :n].add_(a[:, b, :n])


def ragged(acts: Any, lengths: np.ndarray, dtype: str) -> np.ndarray:
    """The real tokens of a right-padded batch, documents concatenated:
    ``[L, batch, pos, d]`` → ``[L, sum(lengths), d]`` in ``dtype``."""
    import torch

    a = torch.as_tensor(acts).to(getattr(torch, dtype))
    T = a.shape[2]
    if (np.asarray(lengths) < T).any():
        a = a[:, torch.as_tensor(padding_mask(lengths, T))]
    else:
        a = a.reshape(a.shape[0], -1, a.shape[-1])
    return a.numpy()


# --------------------------------------------------------------------------- writer
def _fingerprint(attrs: dict[str, Any], settings: CacheSettings, tokens: TokenSet) -> str:
    from posmech.config import config_hash

    return config_hash({
        "attrs": {k: v for k, v in attrs.items() if k not in ("created",)},
        "settings": settings.fingerprint_fields(),
        "tokens": [tokens.attrs.get("config_hash"), tokens.attrs.get("created"), int(tokens.offsets[-1])],
    })


def _create_partial(tmp: Path, tokens: TokenSet, n_docs: int, n_layers: int, d_model: int,
                    settings: CacheSettings, attrs: dict[str, Any]) -> None:
    off = tokens.offsets[: n_docs + 1]
    n_tok = int(off[-1])
    lengths = np.diff(off)
    n_pos = int(lengths.max())
    with h5py.File(tmp, "w") as f:
        set_attrs(f, {**provenance(), "kind": KIND, "rule": RULE, "complete": False, **attrs})
        flat = tokens.flat[:n_tok].astype(np.int32)
        f.create_dataset("token_ids", data=flat)
        f.create_dataset("doc_ids", data=np.repeat(np.arange(n_docs, dtype=np.int32), lengths))
        f.create_dataset("positions", data=np.concatenate([np.arange(n, dtype=np.int32) for n in lengths]))
        f.create_dataset("doc_offsets", data=off.astype(np.int64))
        g = f.create_group("documents")
        g.create_dataset("length", data=lengths.astype(np.int32))
        g.create_dataset("title", data=tokens.titles[:n_docs], dtype=STR)
        chunk = min(settings.chunk_tokens, max(1, n_tok))
        for h in settings.hooks:
            names = hook_points(h, n_layers)
            d = preallocated_dataset(f, f"activations/{h}", (len(names), n_tok, d_model),
                                     settings.storage_dtype, (1, chunk, d_model), fillvalue=np.nan)
            common = {"hook": h, "hook_points": names, "layers": list(range(len(names))),
                      **{k: attrs[k] for k in ("model", "processing", "corpus") if k in attrs}}
            set_attrs(d, {**common, "dtype": settings.storage_dtype, "axes": ["layer", "token", "d_model"]})
            m = preallocated_dataset(f, f"position_stats/{h}/mean", (len(names), n_pos, d_model), "float64",
                                     None, fillvalue=np.nan)
            set_attrs(m, {**common, "dtype": "float64", "axes": ["layer", "position", "d_model"]})
        c = preallocated_dataset(f, "position_stats/count", (n_pos,), "int64", None, fillvalue=0)
        set_attrs(c, {"axes": ["position"]})


def _save_checkpoint(path: Path, fingerprint: str, docs_done: int, sums: dict[str, np.ndarray],
                     count: np.ndarray) -> None:
    with atomic_path(path, suffix=".tmp") as tmp, open(tmp, "wb") as fh:
        np.savez(fh, fingerprint=np.array(fingerprint), docs_done=np.array(docs_done), count=count,
                 **{f"sum_{h}": s for h, s in sums.items()})


def _load_checkpoint(path: Path, fingerprint: str, hooks: tuple[str, ...]) -> tuple[int, dict[str, np.ndarray], np.ndarray] | None:
    try:
        with np.load(path) as z:
            if str(z["fingerprint"]) != fingerprint:
                return None
            return int(z["docs_done"]), {h: z[f"sum_{h}"].copy() for h in hooks}, z["count"].copy()
    except (OSError, KeyError, ValueError):
        return None


def _open_resumable(tmp: Path, ckpt: Path, fingerprint: str, settings: CacheSettings) -> tuple[h5py.File, int, dict[str, np.ndarray], np.ndarray] | None:
    """The partial file and checkpoint of an interrupted run with the same fingerprint, or None."""
    if not (tmp.exists() and ckpt.exists()):
        return None
    state = _load_checkpoint(ckpt, fingerprint, settings.hooks)
    if state is None:
        return None
    try:
        f = h5py.File(tmp, "r+")
    except OSError:
        return None
    if f.attrs.get("fingerprint") != fingerprint:
        f.close()
        return None
    return f, *state


def cache_activations(
    model: Any,
    tokens: TokenSet,
    path: str | os.PathLike[str],
    settings: CacheSettings,
    attrs: dict[str, Any],
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Run ``model`` over the first ``settings.n_documents`` documents of ``tokens`` and
    write the activation cache to ``path`` (see the module docstring for the layout).

    ``model``: a TransformerBridge, or an :class:`HFCapture`/:class:`BridgeCapture`
    (:func:`load_capture`).

    Memory is bounded by one batch plus the ``[L, n_positions, d_model]`` float64 sums,
    whatever the number of documents.  Returns a summary: ``n_documents``, ``n_tokens``,
    ``resumed_from`` (documents already done by an interrupted run), ``seconds``,
    ``tokens_per_second`` (of this invocation).
    """
    path = Path(path)
    n_docs = tokens.n_documents if settings.n_documents is None else min(settings.n_documents, tokens.n_documents)
    if n_docs < 1:
        raise PosmechError(f"no documents to cache for {str(path)!r}")
    for h in settings.hooks:
        hook_points(h, 0)
    capture = as_capture(model)
    n_layers, d_model = capture.n_layers, capture.d_model
    off = tokens.offsets[: n_docs + 1]
    lengths = np.diff(off)
    n_pos = int(lengths.max())
    attrs = {**attrs, "hooks": list(settings.hooks), "n_layers": n_layers, "d_model": d_model,
             "n_documents": n_docs, "n_tokens": int(off[-1]), "n_positions": n_pos,
             "storage_dtype": settings.storage_dtype, "batch_size": settings.batch_size,
             "compression": settings.compression or "none",
             "engine": "hf" if isinstance(capture, HFCapture) else "bridge"}
    fp = _fingerprint(attrs, settings, tokens)
    attrs["fingerprint"] = fp
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp, ckpt = path.with_name(path.name + PARTIAL), path.with_name(path.name + CHECKPOINT)

    state = _open_resumable(tmp, ckpt, fp, settings)
    if state is None:
        for p in (tmp, ckpt):
            p.unlink(missing_ok=True)
        _create_partial(tmp, tokens, n_docs, n_layers, d_model, settings, attrs)
        f = h5py.File(tmp, "r+")
        done, count = 0, np.zeros(n_pos, dtype=np.int64)
        sums = {h: np.zeros((len(hook_points(h, n_layers)), n_pos, d_model)) for h in settings.hooks}
    else:
        f, done, sums, count = state
        LOG.info("resuming %s after %d of %d documents (checkpoint %s)", path, done, n_docs, ckpt.name)
    resumed_from = done
    t0, n_tok_run = time.perf_counter(), 0
    try:
        bs, since, last_ckpt = settings.batch_size, 0, time.monotonic()
        for start in range(done, n_docs, bs):
            stop = min(start + bs, n_docs)
            lens = lengths[start:stop]
            ids = np.zeros((stop - start, int(lens.max())), dtype=np.int64)
            for b, j in enumerate(range(start, stop)):
                ids[b, : lens[b]] = tokens.doc(j)
            acts = capture(ids, settings.hooks)
            a0, a1 = int(off[start]), int(off[stop])
            count[: ids.shape[1]] += padding_mask(lens, ids.shape[1]).sum(axis=0)
            for h, a in acts.items():
                accumulate(sums[h], a, lens)
                f[f"activations/{h}"][:, a0:a1] = ragged(a, lens, settings.storage_dtype)
            done, since, n_tok_run = stop, since + 1, n_tok_run + (a1 - a0)
            due = since >= settings.checkpoint_every and time.monotonic() - last_ckpt >= settings.checkpoint_seconds
            if due or done == n_docs:
                f.flush()
                _save_checkpoint(ckpt, fp, done, sums, count)
                since, last_ckpt = 0, time.monotonic()
            if progress:
                progress(done, n_docs)
        for h in settings.hooks:
            with np.errstate(invalid="ignore", divide="ignore"):
                f[f"position_stats/{h}/mean"][...] = sums[h] / count[None, :, None]
        f["position_stats/count"][...] = count
        f.attrs["complete"] = True
        f.flush()
    finally:
        f.close()
    if settings.compression:
        with atomic_path(path, suffix=".compressing") as out:
            copy_compressed(tmp, out, settings.compression, settings.compression_level)
        tmp.unlink()
    else:
        os.replace(tmp, path)
    ckpt.unlink(missing_ok=True)
    secs = time.perf_counter() - t0
    return {"n_documents": n_docs, "n_tokens": int(off[-1]), "resumed_from": resumed_from,
            "seconds": secs, "tokens_per_second": n_tok_run / secs if secs > 0 else float("nan")}


# --------------------------------------------------------------------------- readers
def _check_hook(f: h5py.File, path: Any, hook: str) -> None:
    if f"activations/{hook}" not in f and f"position_stats/{hook}/mean" not in f:
        have = attr_json(f, "hooks")
        raise PosmechError(
            f"{str(path)!r} has no hook {hook!r} (cached hooks: {have}); add it to `cache.hooks` "
            f"and rerun rule `{RULE}`"
        )


def read_position_means(path: str | os.PathLike[str], hook: str) -> tuple[np.ndarray, np.ndarray]:
    """Position-wise mean over documents of one hook.

    Returns ``mean`` float64 ``[n_layers_hook, n_positions, d_model]`` and ``count``
    int64 ``[n_positions]`` (documents reaching each position).  ``hook`` is
    ``resid_pre`` (``n_layers + 1`` entries, the last the final residual) or ``ln1_out``.
    """
    with open_artifact(path, KIND) as f:
        _check_hook(f, path, hook)
        return f[f"position_stats/{hook}/mean"][()], f["position_stats/count"][()]


def read_document(path: str | os.PathLike[str], hook: str, layer: int, doc: int) -> np.ndarray:
    """Cached activations of one document at one layer: ``[len_doc, d_model]`` (storage dtype)."""
    with open_artifact(path, KIND) as f:
        _check_hook(f, path, hook)
        ds = f[f"activations/{hook}"]
        off = f["doc_offsets"]
        if not (0 <= doc < len(off) - 1) or not (-ds.shape[0] <= layer < ds.shape[0]):
            raise PosmechError(f"{str(path)!r}: document {doc} / layer {layer} out of range "
                               f"({len(off) - 1} documents, {ds.shape[0]} layers for {hook!r})")
        return ds[layer, int(off[doc]) : int(off[doc + 1])]


def read_positions(path: str | os.PathLike[str], hook: str, layer: int, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions ``start:stop`` of every document at one layer.

    Returns ``acts`` ``[n_documents, stop - start, d_model]`` (float32; NaN where a
    document is shorter) and ``lengths`` ``[n_documents]``.
    """
    with open_artifact(path, KIND) as f:
        _check_hook(f, path, hook)
        ds = f[f"activations/{hook}"]
        off = f["doc_offsets"][()]
        out = np.full((len(off) - 1, stop - start, ds.shape[2]), np.nan, dtype=np.float32)
        for j in range(len(off) - 1):
            a, b = off[j] + start, min(off[j] + stop, off[j + 1])
            if b > a:
                out[j, : b - a] = ds[layer, a:b]
        return out, np.diff(off)
