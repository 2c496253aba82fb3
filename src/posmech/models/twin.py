"""Random-init twins: the same architecture and size as a model, with seeded random weights.

A finding that holds on a trained model *and* on its twin is true at initialisation — a
property of the architecture (P8's layer-0 identity, a head attending to the previous
token because every head attends broadly over a short context), not something training
made; one that holds on the model and fails on its twin was learned. The findings table
(:func:`posmech.verdicts.findings.with_twins`) says which.

The twin is built by the pipeline (rule ``build_twin``; no download), as one of two nulls
(config ``twins.weights``, :data:`TWIN_WEIGHTS`):

* ``init`` (the default): from the model's own ``config.json`` alone. For a Hugging Face
  directory, ``AutoModelForCausalLM.from_config`` under ``torch.manual_seed(seed)`` — the
  family's own initialisation (GPT-2, GPT-NeoX, Llama, BLOOM, OPT: normal weights of standard
  deviation ``initializer_range``, zero biases, unit norms); for a legacy TransformerLens
  checkpoint, TransformerLens's ``gpt2`` initialisation (every ``W_*`` normal with standard
  deviation ``initializer_range``, by default ``0.8/sqrt(d_model)``; biases zero; LayerNorm
  scales one). The null of a trained model's mechanisms at the scale where training starts.
* ``shuffled``: the model's own weights with the entries of every parameter tensor permuted
  at random (:func:`shuffled_state`; one permutation per tensor, seeded by ``seed`` and the
  tensor's name). Each matrix keeps its scale and its distribution of entries (norm, largest
  entries) and loses its structure (which token, position, head or dimension carries what):
  the null matched to the model's weight scale, for a model whose weights are not at its
  family's initialisation scale (a hand-made random model, say). Every parameter is shuffled,
  biases and norm gains included (which dimension a gain amplifies is structure too); tied
  parameters (input and output embeddings) are one parameter, shuffled once, and stay tied.
  Buffers are not parameters and are kept: rotary ``inv_freq`` and ALiBi slopes (functions of
  the config, never learned), causal masks, TransformerLens's ``IGNORE``.

The tokenizer files are copied, so the twin reads the same tokens.

Config: the ``twins`` section (``enabled``, on by default; ``weights``, ``trained``,
``figures``, ``models``, ``seed``); a twin of model ``m`` is the model ``m-twin`` of the run
(:func:`add_twins`), in every config section that lists ``m``. Every model the run does not
train gets one unless the config turns it off: a verdict is read against it
(:func:`posmech.verdicts.findings.judge_against_null`). Without figures (the default) a twin's
analyses run as one job (:mod:`posmech.pipeline.sweep`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

from posmech.core.errors import PosmechError

#: a twin's model name is its model's name followed by this
SUFFIX = "-twin"
#: the model entry keys that say where the weights come from (not copied to a twin)
WEIGHTS_KEYS = ("source", "revision", "train")
#: the nulls a twin can be, by where its weights come from (config ``twins.weights``; module
#: docstring): the family's own initialisation, or the model's own weights with each parameter
#: tensor's entries permuted. (Not ``twins.null``: YAML reads an unquoted ``null:`` key as None.)
TWIN_WEIGHTS = ("init", "shuffled")
#: the weights of a twin whose config entry (or manifest) names none: those twins had before
#: ``twins.weights`` existed
DEFAULT_WEIGHTS = "init"


def twin_name(model: str) -> str:
    """The run's name of ``model``'s twin."""
    return model + SUFFIX


def add_twins(config: dict[str, Any]) -> list[str]:
    """Add a model entry ``<m>-twin`` to ``config["models"]`` (in place) for every model of
    the ``twins`` section when ``twins.enabled`` (the default): those of ``twins.models``, else
    every model the run does not train (``train:``), and the trained ones too when
    ``twins.trained``. Each entry holds the model's analysis keys (context,
    device, dtype, processing, engine, …) with ``twin_of``, ``seed`` and, unless it is the
    default ``init``, ``twin_weights`` (``twins.weights``) in place of where the weights come
    from (an ``init`` twin's entry, and so every job's params, stay what they were before
    ``twins.weights`` existed: no existing run reruns its twins); and add the twin wherever a config section's ``models`` list
    names its model. Returns the twins' names. A name taken by a configured model is a
    :class:`PosmechError` naming the key."""
    sec = config.get("twins") or {}
    if not sec.get("enabled", True):
        return []
    models = config["models"]
    chosen = [m for m in models if m in (sec.get("models") or [])] or [
        m for m in models if "twin_of" not in models[m] and ("train" not in models[m] or sec.get("trained", False))]
    added = []
    for m in chosen:
        t = twin_name(m)
        if t in models:
            raise PosmechError(f"config key `models.{t}`: the name is the twin of model {m!r} (config section `twins`); "
                               f"rename the model, or set `twins.models` without {m!r}")
        entry = {k: v for k, v in models[m].items() if k not in WEIGHTS_KEYS}
        weights = check_weights(str(sec.get("weights", DEFAULT_WEIGHTS)))
        models[t] = {**entry, "twin_of": m, "seed": int(sec.get("seed", 0)),
                     **({} if weights == DEFAULT_WEIGHTS else {"twin_weights": weights})}
        added.append(t)
    for section in config.values():
        if isinstance(section, dict) and isinstance(section.get("models"), list) and section is not sec:
            listed = section["models"]
            section["models"] = listed + [twin_name(m) for m in listed if twin_name(m) in added]
    return added


def twins_of(config: dict[str, Any]) -> dict[str, str]:
    """``{twin: its model}`` of the run's configured models."""
    return {n: e["twin_of"] for n, e in config["models"].items() if "twin_of" in e}


def tl_initialisation(state: dict[str, Any], cfg: dict[str, Any], seed: int) -> dict[str, Any]:
    """TransformerLens's ``gpt2`` initialisation of a legacy state dict's tensors (same names,
    shapes and dtypes): ``W_*`` normal with standard deviation ``initializer_range`` (default
    ``0.8/sqrt(d_model)``), biases zero, LayerNorm scales one; buffers (the causal mask,
    ``IGNORE``) kept."""
    import torch

    std = cfg.get("initializer_range") or 0.8 / math.sqrt(cfg["d_model"])
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name in sorted(state):
        t, kind = state[name], tl_parameter_kind(name)
        if kind == "weight":
            out[name] = (torch.randn(t.shape, generator=gen, dtype=torch.float32) * std).to(t.dtype)
        elif kind == "bias":  # biases, LayerNorm shifts
            out[name] = torch.zeros_like(t)
        elif kind == "scale":  # LayerNorm scales
            out[name] = torch.ones_like(t)
        else:  # buffers: the causal mask, IGNORE
            out[name] = t.clone()
    return out


def tl_parameter_kind(name: str) -> str | None:
    """What a legacy TransformerLens state dict's tensor ``name`` is: ``weight`` (``W_*``),
    ``bias`` (``b_*``, a LayerNorm's ``b``), ``scale`` (a LayerNorm's ``w``), or ``None`` for a
    buffer (the causal ``mask``, ``IGNORE``), which is no parameter."""
    last = name.rsplit(".", 1)[-1]
    if last.startswith("W_"):
        return "weight"
    if last.startswith("b_") or last == "b":
        return "bias"
    return "scale" if last == "w" else None


def tensor_seed(seed: int, name: str) -> int:
    """The seed of parameter ``name``'s permutation: the first 8 bytes of sha256 of
    ``"<seed>:<name>"``, so each tensor's permutation depends on the twin's seed and its own
    name only (not on which other tensors a checkpoint holds, nor their order)."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little") & (2**63 - 1)


def shuffle_entries(t: Any, seed: int, name: str) -> Any:
    """``t`` with its entries permuted at random (one permutation of all ``t.numel()``
    entries, seeded by :func:`tensor_seed`): the same multiset of values, the same shape."""
    import torch

    perm = torch.randperm(t.numel(), generator=torch.Generator().manual_seed(tensor_seed(seed, name)))
    return t.reshape(-1)[perm].reshape(t.shape).clone()


def shuffled_state(state: dict[str, Any], seed: int, is_parameter: Any) -> dict[str, Any]:
    """The ``shuffled`` null of a state dict: every tensor whose name ``is_parameter`` has its
    entries permuted (:func:`shuffle_entries`), every other one (a buffer) copied."""
    return {name: shuffle_entries(t, seed, name) if is_parameter(name) else t.clone()
            for name, t in sorted(state.items())}


def _shuffled_hf_model(src: Path, seed: int) -> Any:
    """The Hugging Face model of ``src`` (its own dtype) with every parameter's entries
    permuted in place. ``named_parameters`` lists a tied parameter once (the input and output
    embeddings are one tensor), so it is shuffled once and stays tied; buffers (rotary
    ``inv_freq``, ALiBi slopes, causal masks) are not parameters and are kept."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src, dtype="auto")
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(shuffle_entries(p.detach(), seed, name))
    return model


def check_weights(weights: str) -> str:
    """``weights`` if it is one of :data:`TWIN_WEIGHTS`, else a :class:`PosmechError` naming
    the key."""
    if weights not in TWIN_WEIGHTS:
        raise PosmechError(f"config key `twins.weights`: {weights!r} is no twin's weights; use one of "
                           f"{', '.join(TWIN_WEIGHTS)}")
    return weights


def build_twin_dir(parent_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str], seed: int,
                   weights: str = DEFAULT_WEIGHTS) -> None:
    """Write the twin of the model directory ``parent_dir`` to ``out_dir`` (which must not
    exist): the same ``config.json`` and tokenizer files, and weights per ``weights``
    (:data:`TWIN_WEIGHTS`): freshly initialised with ``seed`` (``init``), or the model's own with
    each parameter tensor's entries permuted with ``seed`` (``shuffled``; module docstring)."""
    import torch

    from posmech.models.loading import is_tl_legacy_dir

    check_weights(weights)
    src, out = Path(parent_dir), Path(out_dir)
    cfg_path = src / "config.json"
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as err:
        raise PosmechError(f"twin: cannot read {cfg_path} ({err}); rerun the model's rule") from None
    out.mkdir(parents=True)
    for f in src.iterdir():  # tokenizer files, generation config: everything but the weights
        if f.is_file() and ".safetensors" not in f.name and not f.name.endswith((".bin", ".pth", ".pt")):
            shutil.copy2(f, out / f.name)
    if is_tl_legacy_dir(src):
        from safetensors.torch import load_file, save_file

        state: dict[str, Any] = {}
        for w in sorted(src.glob("*.safetensors")):
            state.update(load_file(str(w)))
        if not state:
            raise PosmechError(f"twin: {src} holds no safetensors weights to take the shapes from")
        twin = (tl_initialisation(state, cfg, seed) if weights == "init"
                else shuffled_state(state, seed, lambda name: tl_parameter_kind(name) is not None))
        save_file(twin, str(out / "model.safetensors"))
        return
    from transformers import AutoConfig, AutoModelForCausalLM

    if weights == "shuffled":
        model = _shuffled_hf_model(src, seed)
    else:
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src))
    model.save_pretrained(out, safe_serialization=True)


def build_twin(name: str, entry: dict[str, Any], parent_manifest: str | os.PathLike[str],
               out_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Rule ``build_twin``: the twin ``name`` of the model whose manifest is
    ``parent_manifest`` (``entry``: the twin's config entry, with ``twin_of``, ``seed`` and
    ``twin_weights``, :data:`DEFAULT_WEIGHTS` when absent), written to ``out_dir/hf`` with its manifest
    (kind ``twin``, its ``twin_weights`` recorded), as ``fetch_model`` writes a model's. A
    ``shuffled`` twin reads its model's weights (the manifest's ``hf_dir``, verified against
    its hashes), an ``init`` twin only its ``config.json``."""
    from posmech.core.io import atomic_path, write_json
    from posmech.models.loading import (HF_SUBDIR, MANIFEST, hash_weights, manifest_architecture, manifest_hf_dir,
                                        read_manifest, record_verified)

    parent = read_manifest(parent_manifest)
    weights = check_weights(str(entry.get("twin_weights", DEFAULT_WEIGHTS)))
    out = Path(out_dir)
    with atomic_path(out / HF_SUBDIR) as tmp:
        build_twin_dir(parent["hf_dir"], tmp, int(entry["seed"]), weights)
    full, digest = hash_weights(out / HF_SUBDIR)
    manifest = {
        "name": name,
        "kind": "twin",
        "source": f"twin of {entry['twin_of']}" + ("" if weights == DEFAULT_WEIGHTS else f" ({weights})"),
        "twin_of": entry["twin_of"],
        "seed": int(entry["seed"]),
        "twin_weights": weights,
        "twin_of_weights": parent.get("weights_sha256_16"),
        "hf_dir": manifest_hf_dir(out / HF_SUBDIR, out),
        "revision": None,
        "resolved_revision": f"twin:{digest}",
        "weights_sha256_16": digest,
        "weights_sha256": full,
        "architecture": manifest_architecture(out / HF_SUBDIR, name),
    }
    write_json(out / MANIFEST, manifest)
    record_verified(out, out / HF_SUBDIR, full)
    return manifest
