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

Engines (``cache.engine``): ``posmech`` runs the model on the posmech forward engine
(:class:`posmech.models.lens.Lens`: the processing mode's weight transformations applied
once to the weights, fused attention and GELU; GPT-2, GPT-Neo, legacy TransformerLens
checkpoints); ``bridge`` uses TransformerLens hooks (any architecture); ``auto`` the first
where it runs the model.  Both give the same values to float32 rounding (tested).

Per batch, after the forward pass: float64 sums, storage-dtype conversion and one HDF5
write per hook, on the main thread (a writer thread was tried: on this project's 2-core
machine it slowed the forward pass more than it hid).

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

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from posmech.data.tokens import DESCRIPTIONS as TOKEN_DESCRIPTIONS
from posmech.data.tokens import TokenSet
from posmech.core.errors import PosmechError, exhaustion
from posmech.store.hdf5 import (
    STR,
    attr_json,
    checksummed,
    copy_compressed,
    describe,
    open_artifact,
    preallocated_dataset,
    provenance,
    require_datasets,
    set_attrs,
)
from posmech.core.io import atomic_path
from posmech.settings.cache import CacheSettings

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


# --------------------------------------------------------------------------- forward pass
def forward_batch(bridge: Any, ids: np.ndarray, hooks: tuple[str, ...]) -> dict[str, list[Any]]:
    """Run ``bridge`` on ``ids`` (int ``[batch, pos]``) and return, per hook, one float32
    CPU tensor ``[batch, pos, d_model]`` per hook point, in layer order.  No logits are
    computed."""
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
        out[h] = [got[(h, i)].float().cpu() for i in range(n)]
    return out


def padding_mask(lengths: np.ndarray, n_pos: int) -> np.ndarray:
    """``[batch, n_pos]`` bool: True where position ``p < lengths[b]`` (a real token)."""
    return np.arange(n_pos)[None, :] < np.asarray(lengths)[:, None]


class HookCapture:
    """The cached hooks of a model with TransformerLens's hook interface — the posmech
    engine (:class:`posmech.models.lens.Lens`) or a TransformerBridge — via
    :func:`forward_batch`.  On the engine the hooks only keep references to tensors the
    forward pass makes anyway (its fused attention runs: no pattern is hooked), so a cached
    forward costs what an uncached one does."""

    def __init__(self, model: Any) -> None:
        from posmech.models.lens import Lens

        self.model = model
        self.n_layers, self.d_model = int(model.cfg.n_layers), int(model.cfg.d_model)
        self.device = model.cfg.device
        self.engine = "posmech" if isinstance(model, Lens) else "bridge"

    def __call__(self, ids: np.ndarray, hooks: tuple[str, ...]) -> dict[str, list[Any]]:
        return forward_batch(self.model, ids, hooks)


#: ``cache.engine`` -> ``load_model``'s engine (``hf``: the former name of ``posmech``)
CACHE_ENGINES = {"auto": "auto", "posmech": "posmech", "hf": "posmech", "bridge": "bridge"}


def as_capture(model: Any, processing: str | None = None) -> HookCapture:
    """Wrap the posmech engine or a TransformerBridge (``processing`` ignored: the model is
    already in its mode), or a Hugging Face GPT-2/GPT-Neo model in memory (needs
    ``processing``; run by the posmech engine on a copy of its weights, the model is not
    modified)."""
    if isinstance(model, HookCapture):
        return model
    if hasattr(model, "cfg") and hasattr(model, "hooks"):
        return HookCapture(model)
    if processing is None:
        raise PosmechError("a Hugging Face model needs the processing mode (`compatibility` or `raw`)")
    from posmech.models.lens import from_hf

    p = next(model.parameters())
    return HookCapture(from_hf(model, None, processing, str(p.device), str(p.dtype).removeprefix("torch.")))


def load_capture(manifest: dict[str, Any], device: str, dtype: str, processing: str, engine: str = "auto") -> HookCapture:
    """The model to cache from, by ``cache.engine`` (:data:`CACHE_ENGINES`): the posmech
    engine (GPT-2, GPT-Neo, OPT, GPT-NeoX, Llama/Mistral/Qwen2, BLOOM, GPT-J, GPT-BigCode, Phi, Falcon, Gemma, Gemma 2, legacy TransformerLens
    checkpoints: :func:`posmech.models.lens.unsupported_hf` says what it refuses), the TransformerBridge (any
    architecture TransformerLens supports), or ``auto`` (the engine where it runs the model)
    — :func:`posmech.models.loading.load_model`."""
    from posmech.models.loading import load_model

    if engine not in CACHE_ENGINES:
        raise PosmechError(f"config key `cache.engine`: {engine!r} is not one of {', '.join(CACHE_ENGINES)}")
    return HookCapture(load_model(manifest, device, dtype, processing, CACHE_ENGINES[engine]))


def accumulate(sums: np.ndarray, acts: Any, lengths: np.ndarray) -> None:
    """Add the activations of one batch to the running position-wise sums (in place).

    ``sums`` float64 ``[L, n_positions, d]``; ``acts`` one ``[batch, pos, d]`` float
    tensor/array per layer (a sequence, or an ``[L, batch, pos, d]`` array);
    ``lengths`` ``[batch]`` (positions ``>= lengths[b]`` of document ``b`` are padding
    and ignored).  The matching counts are ``padding_mask(lengths, pos).sum(0)``.  Each
    value is converted to float64 before it is summed, so the sums carry the forward
    pass's own precision.
    """
    lengths = np.asarray(lengths)
    keep = None
    for layer, a in enumerate(acts):
        x = np.asarray(a)
        T = x.shape[1]
        if keep is None and (lengths < T).any():
            keep = padding_mask(lengths, T)[:, :, None]
        if keep is not None:  # padding contributes exact zeros
            x = np.where(keep, x, 0.0)
        sums[layer, :T] += x.sum(axis=0, dtype=np.float64)


def ragged(acts: Any, lengths: np.ndarray, dtype: str) -> np.ndarray:
    """The real tokens of a right-padded batch, documents concatenated: one
    ``[batch, pos, d]`` tensor per layer (or ``[L, batch, pos, d]``) → ``[L, sum(lengths), d]``
    numpy array in ``dtype``."""
    import torch

    layers = [torch.as_tensor(a) for a in acts]
    B, T, d = layers[0].shape
    lengths = np.asarray(lengths)
    out = torch.empty((len(layers), int(lengths.sum()), d), dtype=getattr(torch, dtype))
    keep = torch.as_tensor(padding_mask(lengths, T)) if (lengths < T).any() else None
    for layer, a in enumerate(layers):
        out[layer].copy_(a.reshape(B * T, d) if keep is None else a[keep])  # copy_ converts the dtype
    return out.numpy()


# --------------------------------------------------------------------------- writer
def write_tokens(ds: h5py.Dataset, start: int, block: np.ndarray) -> None:
    """``ds[:, start:start + n] = block`` for ``block`` ``[L, n, d]`` of the dataset's dtype,
    through h5py's low-level interface (the same HDF5 write without the high-level
    selection machinery, which costs about a fifth of a small write)."""
    block = np.ascontiguousarray(block)
    if block.dtype != ds.dtype:
        raise PosmechError(f"internal: {block.dtype} block for {ds.dtype} dataset {ds.name}")
    fspace = ds.id.get_space()
    fspace.select_hyperslab((0, start, 0), block.shape)
    ds.id.write(h5py.h5s.create_simple(block.shape), fspace, block)


# --------------------------------------------------------------------------- kept copies
KEEP_DIR = ".kept"


def kept_path(path: Path, fingerprint: str) -> Path:
    """Where the finished cache ``path`` with ``fingerprint`` is kept (a hard link):
    ``<dir>/.kept/<name>.<fingerprint>``."""
    return path.parent / KEEP_DIR / f"{path.name}.{fingerprint}"


def _kept_sha(kept: Path) -> Path:
    """The kept copy's recorded sha256 (its bytes when it was kept): ``<kept>.sha256``."""
    return kept.with_name(kept.name + ".sha256")


def _keep(path: Path, kept: Path) -> None:
    """Hard-link the finished ``path`` into the keep directory, with the sha256 of its bytes
    beside it (:func:`_kept_sha`), replacing older kept copies of the same file (other
    fingerprints).  Snakemake deletes a job's outputs before running it again; the kept
    link survives that, so a re-run that fails leaves the expensive cache on disk and a
    re-run with the same fingerprint relinks it instead of recomputing.  A hard link shares
    its bytes with the output: the recorded sha256 is checked before reuse, so damage to
    either is never reused.  A file system without hard links keeps nothing."""
    from posmech.models.loading import file_sha256

    kept.parent.mkdir(exist_ok=True)
    tmp = kept.with_name(kept.name + ".link")
    try:
        tmp.unlink(missing_ok=True)
        os.link(path, tmp)
        with atomic_path(_kept_sha(kept), suffix=".tmp") as sha_tmp:
            Path(sha_tmp).write_text(file_sha256(tmp) + "\n")
        os.replace(tmp, kept)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        LOG.warning("could not keep a hard link of %s (%s): a failed re-run will have to recompute it", path, err)
        return
    for old in kept.parent.glob(f"{path.name}.*"):
        if old not in (kept, _kept_sha(kept)):
            old.unlink(missing_ok=True)


def _reuse_kept(kept: Path, path: Path, fingerprint: str) -> bool:
    """Link a kept copy back onto ``path`` when it is complete, of this fingerprint,
    written by this code (same ``git_commit``) and its bytes are the ones recorded when it
    was kept (sha256); its mtime is set to now, so Snakemake sees an output newer than its
    inputs.  A kept copy whose bytes changed is deleted (and the cache recomputed)."""
    from posmech.store.hdf5 import git_commit
    from posmech.models.loading import file_sha256

    if not kept.is_file():
        return False
    try:
        recorded = _kept_sha(kept).read_text().strip()
    except OSError:
        recorded = ""
    got = file_sha256(kept) if recorded else ""
    if got != recorded or not recorded:
        LOG.warning("not reusing kept cache %s: %s; recomputing", kept,
                    f"its sha256 is {got}, recorded {recorded} (its bytes changed)" if recorded
                    else "no recorded sha256 beside it")
        for p in (kept, _kept_sha(kept)):
            p.unlink(missing_ok=True)
        return False
    try:
        with h5py.File(kept, "r") as f:
            ok = (bool(f.attrs.get("complete")) and f.attrs.get("fingerprint") == fingerprint
                  and f.attrs.get("git_commit") == git_commit())
    except OSError:
        ok = False
    if not ok:
        return False
    tmp = path.with_name(path.name + ".link")
    tmp.unlink(missing_ok=True)
    os.link(kept, tmp)
    os.replace(tmp, path)
    os.utime(path)
    return True


@contextlib.contextmanager
def _discard_on_write_error(*paths: Path) -> Iterator[None]:
    """A write that fails (``OSError``: disk full, file-size limit, quota, I/O error; or an
    HDF5 ``ValueError``/``RuntimeError`` whose text names errno 27, 28 or 122) removes the in-progress file and its checkpoint: a preallocated partial file can be
    as large as the finished cache, and a resume would hit the same wall.  Any other
    failure, and a kill, keeps them for the resume."""
    try:
        yield
    except Exception as err:
        if not isinstance(err, OSError) and exhaustion(err) is None:
            raise  # not a failed write (HDF5 wraps one in ValueError / RuntimeError): kept for the resume
        for p in paths:
            p.unlink(missing_ok=True)
        found = exhaustion(err)
        LOG.error("write failed (%s); removed the in-progress files %s", found[1] if found else err,
                  ", ".join(p.name for p in paths))
        raise


def _fingerprint(attrs: dict[str, Any], settings: CacheSettings, tokens: TokenSet) -> str:
    from posmech.core.config import config_hash

    return config_hash({
        "attrs": {k: v for k, v in attrs.items() if k not in ("created",)},
        "settings": settings.fingerprint_fields(),
        "tokens": [tokens.attrs.get("config_hash"), tokens_digest(tokens)],
    })


def tokens_digest(tokens: TokenSet) -> str:
    """sha256 (16 hex digits) of the token ids and document offsets: what the cache's
    content depends on, not when the tokens file was written."""
    import hashlib

    h = hashlib.sha256()
    for a in (tokens.flat.astype(np.int32), tokens.offsets.astype(np.int64)):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def _create_partial(tmp: Path, tokens: TokenSet, n_docs: int, n_layers: int, d_model: int,
                    settings: CacheSettings, attrs: dict[str, Any]) -> None:
    off = tokens.offsets[: n_docs + 1]
    n_tok = int(off[-1])
    lengths = np.diff(off)
    n_pos = int(lengths.max())
    with h5py.File(tmp, "w") as f, checksummed(f):
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
                                     settings.storage_dtype, (1, chunk, d_model), fillvalue=np.nan,
                                     write_fill=False)
            common = {"hook": h, "hook_points": names, "layers": list(range(len(names))),
                      **{k: attrs[k] for k in ("model", "processing", "corpus") if k in attrs}}
            set_attrs(d, {**common, "dtype": settings.storage_dtype, "axes": ["layer", "token", "d_model"]})
            m = preallocated_dataset(f, f"position_stats/{h}/mean", (len(names), n_pos, d_model), "float64",
                                     (1, n_pos, d_model), fillvalue=np.nan)  # chunked: checksummed
            set_attrs(m, {**common, "dtype": "float64", "axes": ["layer", "position", "d_model"]})
        c = preallocated_dataset(f, "position_stats/count", (n_pos,), "int64", (n_pos,), fillvalue=0)
        set_attrs(c, {"axes": ["position"]})
        describe(f, {**{k: v for k, v in TOKEN_DESCRIPTIONS.items() if k in f}, **{
            "documents/title": "[n_documents] str title from the tokens file (Bible: 'Genesis 1'; empty for web text)",
            "position_stats/count": "[n_positions] int64 number of documents reaching each position",
            **{f"activations/{h}": f"[n_layers_hook, n_tokens, d_model] {settings.storage_dtype} activation of every "
               f"token at every hook point of `{h}` (attribute hook_points); document j, layer l is "
               "[l, doc_offsets[j]:doc_offsets[j+1]]" for h in settings.hooks},
            **{f"position_stats/{h}/mean": f"[n_layers_hook, n_positions, d_model] float64 mean over documents of the "
               f"`{h}` activation at each position" for h in settings.hooks},
        }})


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
        f = h5py.File(tmp, "r+", rdcc_nbytes=0)
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
    keep: bool = False,
) -> dict[str, Any]:
    """Run ``model`` over the first ``settings.n_documents`` documents of ``tokens`` and
    write the activation cache to ``path`` (see the module docstring for the layout).

    ``keep``: also keep the finished file as a hard link in ``.kept/`` next to it
    (:func:`kept_path`), and reuse a kept file of the same fingerprint instead of
    recomputing (the rule does: a failed re-run never loses the cache).

    ``model``: the posmech engine, a TransformerBridge, or a :class:`HookCapture`
    (:func:`load_capture`).

    Memory is bounded by one batch plus the ``[L, n_positions, d_model]`` float64 sums,
    whatever the number of documents.  Returns a summary: ``n_documents``, ``n_tokens``,
    ``resumed_from`` (documents already done by an interrupted run), ``seconds``,
    ``tokens_per_second`` (of this invocation), ``reused`` when a kept file was relinked.
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
             "engine": capture.engine}
    fp = _fingerprint(attrs, settings, tokens)
    attrs["fingerprint"] = fp
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp, ckpt = path.with_name(path.name + PARTIAL), path.with_name(path.name + CHECKPOINT)
    kept = kept_path(path, fp) if keep else None
    if kept is not None and _reuse_kept(kept, path, fp):
        LOG.info("reusing %s: a finished cache with the same fingerprint %s (kept in %s/)", path, fp, KEEP_DIR)
        return {"n_documents": n_docs, "n_tokens": int(off[-1]), "resumed_from": n_docs, "reused": True,
                "seconds": 0.0, "tokens_per_second": float("nan")}

    with _discard_on_write_error(tmp, ckpt):
        state = _open_resumable(tmp, ckpt, fp, settings)
        if state is None:
            for p in (tmp, ckpt):
                p.unlink(missing_ok=True)
            _create_partial(tmp, tokens, n_docs, n_layers, d_model, settings, attrs)
            f = h5py.File(tmp, "r+", rdcc_nbytes=0)
            done, count = 0, np.zeros(n_pos, dtype=np.int64)
            sums = {h: np.zeros((len(hook_points(h, n_layers)), n_pos, d_model)) for h in settings.hooks}
        else:
            f, done, sums, count = state
            LOG.info("resuming %s after %d of %d documents (checkpoint %s)", path, done, n_docs, ckpt.name)
        resumed_from = done
        t0 = time.perf_counter()
        datasets = {h: f[f"activations/{h}"] for h in settings.hooks}
        n_tok_run = 0
        try:
            since, last_ckpt = 0, time.monotonic()
            for start in range(done, n_docs, settings.batch_size):
                stop = min(start + settings.batch_size, n_docs)
                lens = lengths[start:stop]
                a0, a1 = int(off[start]), int(off[stop])
                T = int(lens.max())
                if (lens == T).all():
                    ids = tokens.flat[a0:a1].reshape(stop - start, T).astype(np.int64)
                else:
                    ids = np.zeros((stop - start, T), dtype=np.int64)
                    for b, j in enumerate(range(start, stop)):
                        ids[b, : lens[b]] = tokens.doc(j)
                acts = capture(ids, settings.hooks)
                count[:T] += padding_mask(lens, T).sum(axis=0)
                for h, a in acts.items():
                    accumulate(sums[h], a, lens)
                    write_tokens(datasets[h], a0, ragged(a, lens, settings.storage_dtype))
                since, n_tok_run = since + 1, n_tok_run + (a1 - a0)
                due = since >= settings.checkpoint_every and time.monotonic() - last_ckpt >= settings.checkpoint_seconds
                if due or stop == n_docs:
                    f.flush()
                    _save_checkpoint(ckpt, fp, stop, sums, count)
                    since, last_ckpt = 0, time.monotonic()
                if progress:
                    progress(stop, n_docs)
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
        if kept is not None:
            _keep(path, kept)
        ckpt.unlink(missing_ok=True)
    secs = time.perf_counter() - t0
    return {"n_documents": n_docs, "n_tokens": int(off[-1]), "resumed_from": resumed_from,
            "seconds": secs, "tokens_per_second": n_tok_run / secs if secs > 0 else float("nan")}


# --------------------------------------------------------------------------- readers
def _check_hook(f: h5py.File, path: Any, hook: str, datasets: tuple[str, ...]) -> None:
    """The hook was cached, and every dataset a reader needs for it is there."""
    have = attr_json(f, "hooks") if "hooks" in f.attrs else []
    if hook not in have:
        raise PosmechError(
            f"{str(path)!r} has no hook {hook!r} (cached hooks: {have}); add it to `cache.hooks` "
            f"and rerun rule `{RULE}`"
        )
    require_datasets(f, path, [d.format(hook=hook) for d in datasets])


_MEANS = ("position_stats/{hook}/mean", "position_stats/count")
_ACTS = ("activations/{hook}", "doc_offsets")


def read_position_means(path: str | os.PathLike[str], hook: str) -> tuple[np.ndarray, np.ndarray]:
    """Position-wise mean over documents of one hook.

    Returns ``mean`` float64 ``[n_layers_hook, n_positions, d_model]`` and ``count``
    int64 ``[n_positions]`` (documents reaching each position).  ``hook`` is
    ``resid_pre`` (``n_layers + 1`` entries, the last the final residual) or ``ln1_out``.
    """
    with open_artifact(path, KIND) as f:
        _check_hook(f, path, hook, _MEANS)
        return f[f"position_stats/{hook}/mean"][()], f["position_stats/count"][()]


def read_document(path: str | os.PathLike[str], hook: str, layer: int, doc: int) -> np.ndarray:
    """Cached activations of one document at one layer: ``[len_doc, d_model]`` (storage dtype)."""
    with open_artifact(path, KIND) as f:
        _check_hook(f, path, hook, _ACTS)
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
        _check_hook(f, path, hook, _ACTS)
        ds = f[f"activations/{hook}"]
        off = f["doc_offsets"][()]
        out = np.full((len(off) - 1, stop - start, ds.shape[2]), np.nan, dtype=np.float32)
        for j in range(len(off) - 1):
            a, b = off[j] + start, min(off[j] + stop, off[j + 1])
            if b > a:
                out[j, : b - a] = ds[layer, a:b]
        return out, np.diff(off)
