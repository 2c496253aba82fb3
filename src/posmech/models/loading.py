"""Models: fetch from the Hub, validate a local directory, load a TransformerBridge (the
demo model is trained by :mod:`posmech.models.training`).

Every configured model ends up described by a *manifest* (``resources/models/{model}/manifest.json``)
with the Hugging Face directory to load, its kind (``hub``/``local``/``train``), the
resolved revision and a hash of the weights.  :func:`load_bridge` is the one loader used
by every analysis: it loads weights from safetensors only, never with
``trust_remote_code``, and applies the configured processing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from posmech.core.config import local_path
from posmech.core.errors import HUB_HINT, PosmechError, require_hub
from posmech.core.io import atomic_path, write_json
from posmech.models.model_dir import safetensors_header, tokenizer_problem

LOG = logging.getLogger(__name__)

MANIFEST = "manifest.json"
HF_SUBDIR = "hf"
BOS_TOKEN = "<|endoftext|>"
UNK_TOKEN = "<|unk|>"
HUB_FILES = ["*.safetensors", "*.json", "*.txt", "*.model", "merges.txt", "vocab.*"]


# --------------------------------------------------------------------------- manifests
def read_manifest(path: str | os.PathLike[str], verify: bool = True) -> dict[str, Any]:
    """Read a model manifest; fail naming the file and the rule to rerun if it is missing or
    bad.  With ``verify`` (every rule's way in), the weights are checked against the hashes
    it records (:func:`verify_weights`) before anything reads them."""
    p = Path(path)
    if p.is_dir():
        p = p / MANIFEST
    try:
        with open(p) as f:
            m = json.load(f)
        hf = m["hf_dir"]
    except (OSError, ValueError, KeyError) as err:
        raise PosmechError(
            f"model manifest {str(p)!r} is missing or unreadable ({err}); rerun the model rule "
            "(`snakemake --forcerun fetch_model` or `train_demo_model`)"
        ) from None
    if not os.path.isabs(hf):  # relative to the manifest's directory (a relocatable project)
        m["hf_dir"] = str((p.parent / hf).resolve())
    m["manifest_path"] = str(p)
    if verify:
        verify_weights(m)
    return m


def manifest_hf_dir(hf_dir: str | os.PathLike[str], manifest_dir: str | os.PathLike[str]) -> str:
    """How a manifest records its model directory: relative to the manifest's directory
    when both lie inside the working directory (the project: a copied or moved project
    loads its own model), else absolute (a model directory elsewhere on the machine)."""
    hf, md, root = (Path(x).resolve() for x in (hf_dir, manifest_dir, Path.cwd()))
    if hf.is_relative_to(root) and md.is_relative_to(root):
        return os.path.relpath(hf, md)
    return str(hf)


def weights_digest(hf_dir: str | os.PathLike[str]) -> str:
    """sha256 over the safetensors files of a directory (sorted by name), first 16 hex digits
    (the manifest's ``weights_sha256_16``; :func:`hash_weights` gives it with the full hashes)."""
    return hash_weights(hf_dir)[1]


def _weight_files(hf_dir: str | os.PathLike[str]) -> list[Path]:
    return sorted(Path(hf_dir).glob("*.safetensors"))


def file_sha256(path: str | os.PathLike[str]) -> str:
    """Full sha256 (64 hex digits) of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def hash_weights(hf_dir: str | os.PathLike[str]) -> tuple[dict[str, str], str]:
    """One read of every safetensors file of ``hf_dir`` (sorted by name): the full sha256 of
    each (``{file name: 64 hex digits}``, the manifest's ``weights_sha256``) and the first 16
    hex digits of the sha256 over their names and bytes in turn (``weights_sha256_16``)."""
    combined = hashlib.sha256()
    per_file = {}
    for f in _weight_files(hf_dir):
        combined.update(f.name.encode())
        h = hashlib.sha256()
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
                combined.update(block)
        per_file[f.name] = h.hexdigest()
    return per_file, combined.hexdigest()[:16]


def weights_identity(manifest: dict[str, Any]) -> str:
    """What the weights are, for fingerprints: sha256 (16 hex digits) over the manifest's
    per-file hashes (``weights_sha256``), else its ``weights_sha256_16``, else ``unknown``."""
    full = manifest.get("weights_sha256")
    if isinstance(full, dict) and full:
        text = "".join(f"{k}:{v}\n" for k, v in sorted(full.items()))
        return hashlib.sha256(text.encode()).hexdigest()[:16]
    return str(manifest.get("weights_sha256_16", "unknown"))


#: beside the manifest: the sha256 of each weights file already hashed, with the file's
#: size, mtime_ns, ctime_ns and inode when it was (any write changes mtime and ctime), so a
#: file is hashed once, not at every job
VERIFIED = "weights.verified.json"


def _stat_key(path: Path) -> dict[str, int]:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "ino": st.st_ino}


def _cached_sha256(path: Path, cache: dict[str, Any]) -> tuple[str, bool]:
    """``(sha256 of path, whether it was hashed now)``, reusing ``cache``'s entry for the
    same path, size, mtime, ctime and inode; the cache is updated in place."""
    key, stat = str(path.resolve()), _stat_key(path)
    hit = cache.get(key)
    if isinstance(hit, dict) and all(hit.get(k) == v for k, v in stat.items()) and isinstance(hit.get("sha256"), str):
        return hit["sha256"], False
    digest = file_sha256(path)
    cache[key] = {**stat, "sha256": digest}
    return digest, True


def weights_fix(manifest: dict[str, Any]) -> str:
    """How to get weights that match a manifest again, naming the rule that writes them
    (a fresh manifest: the check before any job would refuse ``--forcerun`` of the model rule
    itself, so the fix deletes the directory and reruns)."""
    kind, name = manifest.get("kind"), manifest.get("name", "<model>")
    mpath = manifest.get("manifest_path")
    mdir = os.path.relpath(Path(mpath).parent) if mpath else f"resources/models/{name}"
    if kind == "local":
        return (f"restore the local copy; or, if the new weights are intended, delete {mdir}/{MANIFEST} and "
                "rerun (fetch_model checks the directory again and records their hashes)")
    if kind == "twin":
        whose = "weights" if manifest.get("twin_weights") == "shuffled" else "config.json"  # twins.weights
        return (f"delete {mdir}/ and rerun: rule build_twin builds the twin again from the {whose} of "
                f"{manifest.get('twin_of', 'its model')!r} (seeded: the same weights)")
    if kind == "checkpoint":
        saved = f"resources/models/{manifest.get('checkpoint_of')}/checkpoints/step{manifest.get('step')}/hf/"
        return (f"delete {mdir}/ and rerun: rule checkpoint_model copies the checkpoint again from the one "
                f"the training saved ({saved}, checked against the hash the training recorded)")
    if kind == "saved_checkpoint":  # the training's own copy, checkpoints/step<N>/ (posmech.models.training)
        ckpts = os.path.relpath(Path(mpath).parent.parent) if mpath else "the checkpoints"
        return (f"delete {ckpts}/ and rerun: rule train_demo_model trains {manifest.get('checkpoint_of')!r} "
                "again, its checkpoints included (the training is seeded and deterministic on CPU: the same "
                "weights; what was computed from the model and its checkpoints is computed again)")
    again = "trained again (train_demo_model)" if kind == "train" else "fetched again (fetch_model)"
    return f"delete {mdir}/ and rerun: the model is {again}"


def verify_weights(manifest: dict[str, Any], manifest_path: str | os.PathLike[str] | None = None) -> None:
    """The weights a manifest describes are the bytes it recorded: the full sha256 of every
    safetensors file (``weights_sha256``; an older manifest with only ``weights_sha256_16``
    is checked against that, hashing every time), no file missing or added.  A file is hashed
    once: :data:`VERIFIED` beside the manifest (``manifest_path``, else the manifest's
    ``manifest_path`` key set by :func:`read_manifest`) keeps each hash with the file's
    size, mtime, ctime and inode.  A mismatch is a :class:`PosmechError` naming the file,
    both hashes and the fix (:func:`weights_fix`: the rule that writes that kind of model again);
    the message calls the record the manifest's ``recorded_in`` (default "its manifest": a
    training's checkpoint record is another file).  A manifest that records no hash (a
    hand-made dict) is not checked."""
    full = manifest.get("weights_sha256")
    short = manifest.get("weights_sha256_16")
    hf_dir = Path(manifest["hf_dir"])
    name = manifest.get("name", "?")
    try:
        memo = (str(hf_dir.resolve()), json.dumps([full, short], sort_keys=True),
                tuple(tuple(_stat_key(f).values()) for f in _weight_files(hf_dir)))
    except OSError:
        memo = None
    if memo is not None and memo in _VERIFIED_HERE:
        return
    _verify_weights(manifest, full, short, hf_dir, name, manifest_path)
    if memo is not None:
        _VERIFIED_HERE.add(memo)


#: (directory, recorded hashes, files' stats) verified in this process: a rule that loads
#: its model twice (or through two loaders) checks it once
_VERIFIED_HERE: set[tuple[Any, ...]] = set()


def _read_cache(cache_file: Path | None) -> dict[str, Any]:
    if cache_file is None:
        return {}
    try:
        cache = json.loads(cache_file.read_text())
    except (OSError, ValueError):
        return {}
    return cache if isinstance(cache, dict) else {}


def _write_cache(cache_file: Path | None, cache: dict[str, Any]) -> None:
    if cache_file is None:
        return
    try:
        write_json(cache_file, cache)
    except OSError as err:  # read-only or full: verified anyway, hashed again next time
        LOG.warning("could not record verified weight hashes in %s (%s)", cache_file, err)


def record_verified(manifest_dir: str | os.PathLike[str], hf_dir: str | os.PathLike[str], full: dict[str, str]) -> None:
    """Record the hashes just computed for a new manifest (:func:`hash_weights`) in
    :data:`VERIFIED`, so that the first load does not hash the files again."""
    cache_file = Path(manifest_dir) / VERIFIED
    cache = _read_cache(cache_file)
    for fname, digest in full.items():
        p = Path(hf_dir) / fname
        cache[str(p.resolve())] = {**_stat_key(p), "sha256": digest}
    _write_cache(cache_file, cache)


def _verify_weights(manifest: dict[str, Any], full: Any, short: Any, hf_dir: Path, name: str,
                    manifest_path: str | os.PathLike[str] | None) -> None:
    mpath = manifest_path or manifest.get("manifest_path")
    cache_file = Path(mpath).parent / VERIFIED if mpath else None
    cache = _read_cache(cache_file)
    changed = False
    record = manifest.get("recorded_in") or "its manifest"  # the file that holds the hashes
    try:
        if isinstance(full, dict) and full:
            for fname, expected in sorted(full.items()):
                p = hf_dir / fname
                if not p.is_file():
                    raise PosmechError(f"model {name!r}: weights file {str(p)!r} recorded in {record} is "
                                       f"missing. Fix: {weights_fix(manifest)}")
                got, hashed = _cached_sha256(p, cache)
                changed |= hashed
                if got != expected:
                    raise PosmechError(
                        f"model {name!r}: weights file {str(p)!r} has sha256 {got}, but {record} records "
                        f"{expected}: the file changed after it was written (disk or copy error, or edited); "
                        f"nothing was computed from it. Fix: {weights_fix(manifest)}")
            extra = sorted({f.name for f in _weight_files(hf_dir)} - set(full))
            if extra:
                raise PosmechError(f"model {name!r}: {str(hf_dir)!r} holds weights files {record} does not "
                                   f"record ({', '.join(extra)}); remove them, or {weights_fix(manifest)}")
        elif isinstance(short, str) and short not in ("", "unknown"):
            # a manifest written before full hashes were recorded: the 16-digit digest over all files
            key = "dir:" + str(hf_dir.resolve())
            stats = [[f.name, *_stat_key(f).values()] for f in _weight_files(hf_dir)]
            hit = cache.get(key)
            if isinstance(hit, dict) and hit.get("stats") == stats and isinstance(hit.get("sha256_16"), str):
                got = hit["sha256_16"]
            else:
                got = weights_digest(hf_dir)
                cache[key], changed = {"stats": stats, "sha256_16": got}, True
            if got != short:
                raise PosmechError(
                    f"model {name!r}: the weights in {str(hf_dir)!r} have sha256 (16 digits) {got}, but its "
                    f"manifest records {short}: a weights file changed after it was written; nothing was "
                    f"computed from it. Fix: {weights_fix(manifest)}")
    finally:
        if changed:  # what was hashed is recorded either way: the comparison is always to the manifest
            _write_cache(cache_file, cache)


def check_safetensors(path: str | os.PathLike[str], key: str) -> dict[str, tuple[int, ...]]:
    """A ``.safetensors`` file is whole: its 8-byte header length, its JSON header, and
    the end of the last tensor's data equal to the file's size (a truncated or corrupt
    download fails here, naming the file, instead of later inside a loader). Returns the
    header's ``{tensor name: shape}`` (:func:`posmech.models.model_dir.safetensors_header`)."""
    p = Path(path)
    size = p.stat().st_size
    fix = (f"it is truncated or corrupt: delete it and fetch the model again "
           f"(`snakemake --forcerun fetch_model`), or re-save it with `save_pretrained(dir, safe_serialization=True)`")
    try:
        shapes, expected = safetensors_header(p)
    except ValueError as err:
        raise PosmechError(f"{key}: weights file {str(p)!r} has no valid safetensors header ({err}); {fix}") from None
    if expected != size:
        raise PosmechError(f"{key}: weights file {str(p)!r} is {size} bytes but its header describes "
                           f"{expected}; {fix}")
    return shapes


def check_hf_dir(path: str | os.PathLike[str], key: str) -> None:
    """A usable local model directory: config.json, whole safetensors weights, a tokenizer."""
    p = Path(path)
    if not (p / "config.json").is_file():
        raise PosmechError(f"{key}: {str(p)!r} has no config.json; expected a Hugging Face model directory")
    for w in sorted(p.glob("*.safetensors")):
        check_safetensors(w, key)
    if is_tl_legacy_dir(p) and list(p.glob("*.safetensors")):
        return
    if not list(p.glob("*.safetensors")):
        raise PosmechError(
            f"{key}: {str(p)!r} has no .safetensors weights; posmech loads safetensors only "
            "(re-save with `model.save_pretrained(dir, safe_serialization=True)`)"
        )
    missing = tokenizer_problem(p)
    if missing:
        raise PosmechError(f"{key}: {missing}")


def manifest_architecture(hf_dir: str | os.PathLike[str], name: str) -> dict[str, Any]:
    """The manifest's ``architecture``: position scheme, context, attention scale and
    grouping of the model in ``hf_dir``, read once from its config.json
    (:func:`posmech.models.architecture.read_architecture`)."""
    from posmech.models.architecture import read_architecture
    from posmech.models.lens import with_engine_refusal

    cfg = json.loads((Path(hf_dir) / "config.json").read_text())
    return with_engine_refusal(read_architecture(hf_dir, f"model {name!r}"), cfg).to_dict()


def prepare_local_model(name: str, entry: dict[str, Any], out_dir: str | os.PathLike[str], base: str = ".") -> dict[str, Any]:
    """Validate a local model directory and write a manifest pointing at it (used in place)."""
    src = local_path(entry["source"], base)
    key = f"config key `models.{name}.source`"
    hf_dir = Path(src)
    if is_tl_legacy_dir(src) and not list(Path(src).glob("*.safetensors")):
        # a legacy TransformerLens checkpoint (config.json + .pth): converted once, like the Hub's
        with atomic_path(Path(out_dir) / HF_SUBDIR) as tmp:
            convert_tl_legacy(Path(src), tmp, key)
        hf_dir = (Path(out_dir) / HF_SUBDIR).resolve()
    check_hf_dir(hf_dir, key)
    src = hf_dir
    full, digest = hash_weights(src)
    manifest = {
        "name": name,
        "kind": "local",
        "source": entry["source"],
        "hf_dir": manifest_hf_dir(src, out_dir),
        "revision": entry.get("revision", "main"),
        "resolved_revision": f"local:{digest}",
        "weights_sha256_16": digest,
        "weights_sha256": full,
        "architecture": manifest_architecture(src, name),
    }
    write_json(Path(out_dir) / MANIFEST, manifest)
    record_verified(out_dir, src, full)
    return manifest


def cached_hub_snapshot(repo: str, revision: str = "main") -> Path | None:
    """The local Hugging Face cache's snapshot of Hub model ``repo`` at ``revision`` (a
    branch, tag or commit), when it holds a ``config.json`` and safetensors weights (no
    download, no network); ``None`` otherwise, and for the legacy TransformerLens repositories
    (:data:`TL_LEGACY_PREFIXES`, converted on download)."""
    if repo.startswith(TL_LEGACY_PREFIXES):
        return None
    try:
        from huggingface_hub import snapshot_download

        path = Path(snapshot_download(repo_id=repo, revision=revision, allow_patterns=HUB_FILES,
                                      local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached (or an id the cache cannot hold)
        return None
    if (path / "config.json").is_file() and (
            (path / "model.safetensors").is_file() or (path / "model.safetensors.index.json").is_file()):
        return path
    return None


def _copy_snapshot(snapshot: Path, dest: Path) -> None:
    """The :data:`HUB_FILES` of a cached snapshot (symbolic links to the cache's blobs)
    copied into ``dest`` as files."""
    import fnmatch
    import shutil

    for f in sorted(snapshot.iterdir()):
        if f.is_file() and any(fnmatch.fnmatch(f.name, pat) for pat in HUB_FILES):
            shutil.copyfile(f, dest / f.name)


def fetch_hub_model(name: str, entry: dict[str, Any], out_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Snapshot a Hub model (safetensors, config, tokenizer) once into ``out_dir/hf``; when
    the Hub is unreachable (``HF_HUB_OFFLINE`` set, or no connection), from the local
    Hugging Face cache if it holds the model (:func:`cached_hub_snapshot`), else an error
    naming the fixes (preflight reports that case before any job: ``hub_problems``)."""
    from huggingface_hub import snapshot_download

    repo, revision = entry["source"], entry.get("revision", "main")
    cached = None
    try:
        require_hub(f"model {repo!r}")
    except PosmechError:
        cached = cached_hub_snapshot(repo, revision)
        if cached is None:
            raise
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / HF_SUBDIR) as tmp:
        try:
            if cached is not None:
                tmp.mkdir(parents=True, exist_ok=True)
                _copy_snapshot(cached, tmp)
                path = str(tmp)
            elif repo.startswith(TL_LEGACY_PREFIXES):
                path = _fetch_tl_legacy(repo, revision, tmp)
            else:
                path = snapshot_download(
                    repo_id=repo, revision=revision, allow_patterns=HUB_FILES, local_dir=str(tmp)
                )
        except PosmechError:
            raise
        except Exception as err:  # noqa: BLE001 - the hub raises many types
            raise PosmechError(
                f"could not download model {repo!r} (revision {revision!r}) for `models.{name}`: "
                f"{type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''}\n{HUB_HINT}"
            ) from None
        check_hf_dir(path, f"model {repo!r} from the Hub")
        # a cached snapshot's folder is named by its commit
        resolved = cached.name if cached is not None else _resolved_revision(repo, revision)
    hf_dir = out / HF_SUBDIR
    full, digest = hash_weights(hf_dir)
    manifest = {
        "name": name,
        "kind": "hub",
        "source": repo,
        "hf_dir": manifest_hf_dir(hf_dir, out),
        "revision": revision,
        "resolved_revision": resolved,
        "weights_sha256_16": digest,
        "weights_sha256": full,
        "architecture": manifest_architecture(hf_dir, name),
    }
    write_json(out / MANIFEST, manifest)
    record_verified(out, hf_dir, full)
    return manifest


TL_LEGACY_PREFIXES = ("NeelNanda/", "ArthurConmy/", "Baidicoot/")


def is_tl_legacy_dir(path: str | os.PathLike[str]) -> bool:
    """A legacy TransformerLens checkpoint directory: config.json in TransformerLens form
    (``d_model``, ``n_layers``, no ``model_type``), as written by :func:`_fetch_tl_legacy`."""
    try:
        cfg = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return "model_type" not in cfg and "d_model" in cfg and "n_layers" in cfg


def refuse_shortformer(cfg: dict[str, Any], where: str) -> None:
    """TransformerBridge (TransformerLens 4.3) has no shortformer positions: refuse them by name."""
    if cfg.get("shortformer_pos") or cfg.get("positional_embedding_type") == "shortformer":
        raise PosmechError(
            f"{where}: shortformer positional embeddings (config.json `positional_embedding_type: shortformer`) "
            "are not supported by TransformerLens 4.3's TransformerBridge; choose a model with standard "
            "learned positions"
        )


def convert_tl_legacy(src: Path, out: Path, where: str, tokenizer_name: str | None = None) -> Path:
    """A legacy TransformerLens checkpoint directory (TransformerLens ``config.json`` + a
    ``*final.pth`` state dict, or a single ``*.pth``) → ``out`` with ``model.safetensors``, the
    config and the tokenizer (the directory's own tokenizer files, else the one the config names).
    The state dict is read with ``torch.load(weights_only=True)`` (tensors only, no pickled code)."""
    import shutil

    import torch
    from safetensors.torch import save_file

    cfg = json.loads((src / "config.json").read_text())
    refuse_shortformer(cfg, where)
    pths = sorted(src.glob("*final.pth")) or sorted(src.glob("*.pth"))
    if len(pths) != 1:
        raise PosmechError(
            f"{where}: legacy TransformerLens checkpoint {str(src)!r} needs one '*final.pth' state dict "
            f"(found {[p.name for p in pths] or 'none'})"
        )
    sd = torch.load(pths[0], map_location="cpu", weights_only=True)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in sd.items()}, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    tok_files = [f for f in src.iterdir() if f.name.startswith(("tokenizer", "special_tokens_map", "vocab."))
                 or f.name == "merges.txt"]
    for f in tok_files:
        shutil.copy2(f, out / f.name)
    name = tokenizer_name or cfg.get("tokenizer_name")
    if not tok_files and name:
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(name).save_pretrained(out)
    elif not tok_files:
        raise PosmechError(
            f"{where}: {str(src)!r} has no tokenizer files and its config.json names no `tokenizer_name`; "
            "save the tokenizer into the directory (`tokenizer.save_pretrained(dir)`)"
        )
    return out


def _fetch_tl_legacy(repo: str, revision: str, out: Path) -> Path:
    """Legacy TransformerLens repos (``NeelNanda/Attn_Only_2L512W_C4_Code`` …) ship a
    TransformerLens config.json and ``*final.pth`` state dicts: both are downloaded and
    converted by :func:`convert_tl_legacy`, so loading is safetensors-only like every other
    model.  A shortformer config is refused before the weights are downloaded."""
    import tempfile

    from huggingface_hub import HfApi, hf_hub_download

    cfg_path = hf_hub_download(repo, "config.json", revision=revision)
    refuse_shortformer(json.loads(Path(cfg_path).read_text()), f"model {repo!r}")
    files = HfApi().list_repo_files(repo, revision=revision)
    final = [f for f in files if f.endswith("final.pth")]
    if not final:
        raise PosmechError(f"legacy TransformerLens repo {repo!r} has no '*final.pth' weights ({files[:8]})")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp)
        Path(src / "config.json").write_text(Path(cfg_path).read_text())
        (src / "model_final.pth").symlink_to(hf_hub_download(repo, final[0], revision=revision))
        return convert_tl_legacy(src, out, f"model {repo!r}")


def _load_tl_legacy(hf_dir: str, device: str, dtype: str) -> Any:
    """Boot a native TransformerBridge from a local legacy TransformerLens directory."""
    import torch
    from safetensors.torch import load_file
    from transformer_lens.config import TransformerBridgeConfig
    from transformer_lens.model_bridge.sources.native import boot as boot_native
    from transformer_lens.utilities.tl_checkpoint_conversion import convert_tl_checkpoint

    cj = json.loads((Path(hf_dir) / "config.json").read_text())
    refuse_shortformer(cj, repr(str(hf_dir)))
    cfg = TransformerBridgeConfig(
        d_model=cj["d_model"], n_layers=cj["n_layers"], d_mlp=cj["d_mlp"], d_head=cj["d_head"],
        n_heads=cj["n_heads"], n_ctx=cj["n_ctx"], d_vocab=cj["d_vocab"], act_fn=cj["act_fn"],
        attn_only=cj["attn_only"], final_rms=cj.get("final_rms", False),
        normalization_type=cj.get("normalization", cj.get("normalization_type")),
        positional_embedding_type="standard", tokenizer_name=cj.get("tokenizer_name"), eps=cj.get("eps", 1e-5),
        architecture="TransformerLensNative",
    )
    cfg.original_architecture = cj.get("architecture", "neel")  # type: ignore[attr-defined]
    tok = load_tokenizer(hf_dir) if (Path(hf_dir) / "tokenizer_config.json").exists() else None
    tdtype = getattr(torch, dtype)
    bridge = boot_native(cfg, tokenizer=tok, device=device, dtype=tdtype, model_name=str(hf_dir))
    sd = {k: v.to(tdtype) for k, v in load_file(str(Path(hf_dir) / "model.safetensors")).items()}
    converted = convert_tl_checkpoint(sd, cfg)
    converted.setdefault("unembed.bias", torch.zeros(cfg.d_vocab, dtype=tdtype))
    result = bridge.load_state_dict(converted, strict=True)
    if result.missing_keys or result.unexpected_keys:
        raise PosmechError(f"{hf_dir!r}: weights do not match the config ({result})")
    return bridge.to(device)


def model_context(hf_dir: str | os.PathLike[str], name: str = "<name>", n_ctx: int | None = None) -> int:
    """The model's context length from its config.json (the first of the keys
    :data:`posmech.models.architecture.CONTEXT_KEYS`), else ``n_ctx`` (the config key
    ``models.<name>.n_ctx``: BLOOM's config records none); neither is an error naming it."""
    from posmech.models.architecture import context_length, read_architecture

    return context_length(read_architecture(hf_dir, f"model {name!r}"), name, n_ctx)


def analysis_context(name: str, entry: dict[str, Any], hf_dir: str | os.PathLike[str]) -> int:
    """Tokens per document: ``models.<name>.n_ctx``, or the model's context when null; a
    value beyond the model's context is an error naming the key (never clamped)."""
    ctx = model_context(hf_dir, name, entry.get("n_ctx"))
    asked = entry.get("n_ctx")
    if asked and int(asked) > ctx:
        raise PosmechError(f"config key `models.{name}.n_ctx`: {asked} is beyond the model's context of {ctx} "
                           f"tokens ({str(hf_dir)!r}/config.json); give at most {ctx}, or null")
    return int(asked or ctx)


def _resolved_revision(repo: str, revision: str) -> str:
    try:
        from huggingface_hub import HfApi

        return str(HfApi().model_info(repo, revision=revision).sha)
    except Exception:  # noqa: BLE001 - offline snapshot: keep the requested revision
        return revision


# --------------------------------------------------------------------------- loading
def resolve_device(device: str) -> str:
    """``auto`` → ``cuda`` when available, else ``cpu``; ``cuda`` without a GPU is an error."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise PosmechError("model device is `cuda` but no CUDA device is visible; set `device: cpu` or `auto`")
    return device


class WeightView:
    """The weights of a Hugging Face directory with the attribute paths of the model's modules,
    read on demand as numpy arrays, without building the model or importing torch:
    ``view.transformer.h[0].attn.c_attn.weight`` is the tensor ``h.0.attn.c_attn.weight``,
    ``view.config.to_dict()`` the directory's ``config.json``; a module or parameter the model
    does not have is ``None`` (as ``getattr(module, name, None)``). For code that reads a few
    weights (the layer-0 analyses); see :func:`weight_view`."""

    def __init__(self, get: Any, keys: frozenset[str], config: dict[str, Any], prefix: str = "") -> None:
        self._get, self._keys, self._config, self._prefix = get, keys, config, prefix

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if not self._prefix and name == "config":
            return SimpleNamespace(to_dict=lambda: dict(self._config))
        if not self._prefix and name == "transformer":
            return self
        key = self._prefix + name
        if key in self._keys:
            return self._get(key)
        if any(k.startswith(key + ".") for k in self._keys):
            return WeightView(self._get, self._keys, self._config, key + ".")
        return None

    def __getitem__(self, i: int) -> Any:
        return getattr(self, str(i))


def weight_view(manifest: dict[str, Any]) -> WeightView:
    """:class:`WeightView` of a configured model's Hugging Face directory (safetensors)."""
    from posmech.models.lens import hf_dir_reader

    check_hf_dir(manifest["hf_dir"], f"model {manifest.get('name')!r}")
    verify_weights(manifest)
    get_np, config = hf_dir_reader(manifest["hf_dir"], framework="numpy")
    get_pt: list[Any] = []

    def get(name: str) -> Any:
        try:
            return get_np(name)
        except TypeError:  # bfloat16: numpy has no such dtype; read it with torch as float32
            if not get_pt:
                get_pt.append(hf_dir_reader(manifest["hf_dir"], framework="pt")[0])
            return get_pt[0](name).float().numpy()

    return WeightView(get, get_np.names, config)


#: the ``tokenizer_class`` values of a tokenizer that is its ``tokenizer.json`` and nothing
#: more: ``AutoTokenizer`` instantiates exactly ``PreTrainedTokenizerFast`` for them
#: (transformers 5 names that class ``TokenizersBackend``; the demo models save it)
PLAIN_FAST_TOKENIZERS = ("TokenizersBackend", "PreTrainedTokenizerFast")


def load_tokenizer(hf_dir: str | os.PathLike[str]) -> Any:
    """The Hugging Face tokenizer saved in ``hf_dir``, as ``AutoTokenizer`` loads it.

    A directory whose ``tokenizer_config.json`` names a plain fast tokenizer
    (:data:`PLAIN_FAST_TOKENIZERS`) and holds its ``tokenizer.json`` is loaded by that class
    directly: the same class and files ``AutoTokenizer`` would resolve, without importing
    ``transformers.models`` — whose import structure transformers builds by reading each of
    its ~1,100 model files, ~3.5 CPU s in every job that reads a tokenizer (5.4 vs 1.6 CPU s
    for the demo's tokenizer; tests/models/test_loading.py checks both give the same
    class, vocabulary, special tokens and ids).  Any other tokenizer goes through
    ``AutoTokenizer``."""
    d = Path(hf_dir)
    cfg_file = d / "tokenizer_config.json"
    if cfg_file.is_file() and (d / "tokenizer.json").is_file():
        try:
            cls = json.loads(cfg_file.read_text()).get("tokenizer_class")
        except (OSError, ValueError):
            cls = None
        if cls in PLAIN_FAST_TOKENIZERS:
            from transformers import PreTrainedTokenizerFast

            return PreTrainedTokenizerFast.from_pretrained(d)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(hf_dir, trust_remote_code=False)


def load_hf(manifest: dict[str, Any], device: str = "cpu", dtype: str = "float32") -> tuple[Any, Any]:
    """The Hugging Face model (eager attention, safetensors only) and its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM

    hf_dir = manifest["hf_dir"]
    check_hf_dir(hf_dir, f"model {manifest.get('name')!r}")
    verify_weights(manifest)
    model = AutoModelForCausalLM.from_pretrained(
        hf_dir,
        use_safetensors=True,
        trust_remote_code=False,
        attn_implementation="eager",
        dtype=getattr(torch, dtype),
    )
    tok = load_tokenizer(hf_dir)
    model.to(device).eval()
    return model, tok


def load_bridge(
    manifest: dict[str, Any] | str | os.PathLike[str],
    device: str = "auto",
    dtype: str = "float32",
    processing: str = "compatibility",
) -> Any:
    """A TransformerLens ``TransformerBridge`` for a configured model.

    ``processing='compatibility'`` applies ``enable_compatibility_mode()`` (fold LN, centre
    writing weights, fold value biases: HookedTransformer numerics, as in the posts);
    ``'raw'`` keeps the Hugging Face weights.  Run forward passes under
    ``torch.inference_mode()``.
    """
    import torch
    from transformer_lens.model_bridge import TransformerBridge

    m = manifest if isinstance(manifest, dict) else read_manifest(manifest)
    verify_weights(m)
    dev = resolve_device(device)
    if is_tl_legacy_dir(m["hf_dir"]):
        bridge = _load_tl_legacy(m["hf_dir"], dev, dtype)
    else:
        hf_model, tok = load_hf(m, dev, dtype)
        bridge = TransformerBridge.boot_transformers(
            m["hf_dir"], hf_model=hf_model, tokenizer=tok, device=dev, dtype=getattr(torch, dtype)
        )
    if processing == "compatibility":
        bridge.enable_compatibility_mode(disable_warnings=True)
    elif processing != "raw":
        raise PosmechError(f"unknown processing mode {processing!r}; expected `compatibility` or `raw`")
    bridge.eval()
    count_bridge_forwards(bridge)
    return bridge


def count_bridge_forwards(bridge: Any) -> Any:
    """Count every forward pass of ``bridge`` with :func:`posmech.core.perf.count_forward`: a
    pre-hook on its token embedding, which every whole-model forward calls once with the
    ``[batch, pos]`` token ids (``bridge(...)``, ``run_with_hooks``, ``run_with_cache``; a
    pre-hook on the bridge itself misses the latter two).  Returns the hook's handle."""
    from posmech.core import perf

    module = getattr(bridge, "embed", None) or bridge
    return module.register_forward_pre_hook(
        lambda m, args, kwargs: perf.count_tensor_forward(args[0] if args else next(iter(kwargs.values()), None)),
        with_kwargs=True)


ENGINES = ("auto", "posmech", "bridge")


def _deferred_tokenizer(hf_dir: str | os.PathLike[str]) -> Any:
    """The directory's Hugging Face tokenizer, loaded when the analysis first reads it."""
    from posmech.models.lens import DeferredTokenizer

    return DeferredTokenizer(lambda: load_tokenizer(hf_dir))


def engine_words(manifest: dict[str, Any], processing: str | None = None, engine: str = "auto") -> str:
    """The forward engine :func:`load_model` runs the manifest's model on, in the words of its
    log line: ``posmech (<dir>[, <processing>])`` or ``bridge (<why not posmech's>)``;
    ``processing`` None: in the raw mode at least (fetch_model, which does not know it)."""
    from posmech.models import lens

    if engine == "bridge":
        return "bridge (config key `models.<name>.engine` is bridge)"
    hf_dir = Path(manifest["hf_dir"])
    cj = json.loads((hf_dir / "config.json").read_text())
    legacy = is_tl_legacy_dir(hf_dir)
    why = lens.unsupported(tl_config=cj) if legacy else lens.unsupported_hf(cj, processing)
    if why is not None:
        return f"bridge (the posmech engine does not run this model: {why})"
    where = "legacy TransformerLens checkpoint" if legacy else str(hf_dir)
    return f"posmech ({where}" + (f", {processing})" if processing else ")")


def load_model(
    manifest: dict[str, Any] | str | os.PathLike[str],
    device: str = "auto",
    dtype: str = "float32",
    processing: str = "compatibility",
    engine: str = "auto",
) -> Any:
    """The model an analysis runs, with TransformerLens's interface (hooks, ``cfg``, processed
    weights): ``engine='posmech'`` is :class:`posmech.models.lens.Lens`, the forward at the
    cost of a bare Hugging Face pass (GPT-2, GPT-Neo, OPT, GPT-NeoX/Pythia, Llama, Mistral,
    Qwen2, BLOOM, GPT-J, GPT-BigCode, Phi, Falcon, Gemma, Gemma 2 and legacy TransformerLens checkpoints; ``lens.unsupported_hf`` says what
    it refuses); ``'bridge'`` is :func:`load_bridge` (any architecture
    TransformerLens supports, ~2x slower per pass in the compatibility mode); ``'auto'``
    is ``posmech`` where it runs the model, else ``bridge``.  Both give the same hook values
    to float32 rounding (``tests/models/test_lens.py``)."""

    from posmech.models import lens

    if engine not in ENGINES:
        raise PosmechError(f"config key `models.<name>.engine`: {engine!r} is not one of {', '.join(ENGINES)}")
    m = manifest if isinstance(manifest, dict) else read_manifest(manifest)
    verify_weights(m)
    log = logging.getLogger("posmech")
    if engine != "bridge":
        dev = resolve_device(device)
        if is_tl_legacy_dir(m["hf_dir"]):
            cj = json.loads((Path(m["hf_dir"]) / "config.json").read_text())
            refuse_shortformer(cj, repr(str(m["hf_dir"])))
            why = lens.unsupported(tl_config=cj)
            if why is None:
                import torch
                from safetensors.torch import load_file

                hf_dir = Path(m["hf_dir"])
                tok = _deferred_tokenizer(hf_dir) if (hf_dir / "tokenizer_config.json").exists() else None
                sd = {k: v.to(torch.float32) for k, v in load_file(str(hf_dir / "model.safetensors")).items()}
                log.info("forward engine: posmech (legacy TransformerLens checkpoint, %s)", processing)
                return lens.from_tl_state(sd, cj, tok, processing, dev, dtype, copy=False)
        else:
            check_hf_dir(m["hf_dir"], f"model {m.get('name')!r}")
            why = lens.unsupported_hf(json.loads((Path(m["hf_dir"]) / "config.json").read_text()), processing)
            if why is None:
                tok = _deferred_tokenizer(m["hf_dir"])
                log.info("forward engine: posmech (%s, %s)", m["hf_dir"], processing)
                return lens.from_hf_dir(m["hf_dir"], tok, processing, dev, dtype)
        if engine == "posmech":
            raise PosmechError(f"config key `models.<name>.engine`: `posmech` does not run model "
                               f"{m.get('name')!r} ({why}); use `auto` or `bridge`")
        log.info("forward engine: bridge (the posmech engine does not run this model: %s)", why)
    else:
        log.info("forward engine: bridge (config key `models.<name>.engine` is bridge)")
    return load_bridge(m, device, dtype, processing)
