"""Random-init twins: the same architecture and size as a model, with seeded random weights.

A finding that holds on a trained model *and* on its twin is true at initialisation — a
property of the architecture (P8's layer-0 identity, a head attending to the previous
token because every head attends broadly over a short context), not something training
made; one that holds on the model and fails on its twin was learned. The findings table
(:func:`posmech.verdicts.findings.with_twins`) says which.

The twin is built by the pipeline from the model's own ``config.json`` (rule
``build_twin``; no download): for a Hugging Face directory, ``AutoModelForCausalLM.from_config``
under ``torch.manual_seed(seed)`` — the family's own initialisation (GPT-2, GPT-NeoX,
Llama, BLOOM, OPT: normal weights of standard deviation ``initializer_range``, zero biases,
unit norms); for a legacy TransformerLens checkpoint, TransformerLens's ``gpt2``
initialisation (every ``W_*`` normal with standard deviation ``initializer_range``, by
default ``0.8/sqrt(d_model)``; biases zero; LayerNorm scales one). The tokenizer files are
copied, so the twin reads the same tokens.

Config: the ``twins`` section (``enabled``, on by default; ``trained``, ``figures``,
``models``, ``seed``); a twin of model ``m`` is the model ``m-twin`` of the run
(:func:`add_twins`), in every config section that lists ``m``. Every model the run does not
train gets one unless the config turns it off: a verdict is read against it
(:func:`posmech.verdicts.findings.judge_against_null`). Without figures (the default) a twin's
analyses run as one job (:mod:`posmech.pipeline.sweep`).
"""

from __future__ import annotations

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


def twin_name(model: str) -> str:
    """The run's name of ``model``'s twin."""
    return model + SUFFIX


def add_twins(config: dict[str, Any]) -> list[str]:
    """Add a model entry ``<m>-twin`` to ``config["models"]`` (in place) for every model of
    the ``twins`` section when ``twins.enabled`` (the default): those of ``twins.models``, else
    every model the run does not train (``train:``), and the trained ones too when
    ``twins.trained``. Each entry holds the model's analysis keys (context,
    device, dtype, processing, engine, …) with ``twin_of`` and ``seed`` in place of where
    the weights come from; and add the twin wherever a config section's ``models`` list
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
        models[t] = {**entry, "twin_of": m, "seed": int(sec.get("seed", 0))}
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
        t, last = state[name], name.rsplit(".", 1)[-1]
        if last.startswith("W_"):
            out[name] = (torch.randn(t.shape, generator=gen, dtype=torch.float32) * std).to(t.dtype)
        elif last.startswith("b_") or last == "b":  # biases, LayerNorm shifts
            out[name] = torch.zeros_like(t)
        elif last == "w":  # LayerNorm scales
            out[name] = torch.ones_like(t)
        else:  # buffers: the causal mask, IGNORE
            out[name] = t.clone()
    return out


def build_twin_dir(parent_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str], seed: int) -> None:
    """Write the twin of the model directory ``parent_dir`` to ``out_dir`` (which must not
    exist): the same ``config.json`` and tokenizer files, weights freshly initialised with
    ``seed`` (module docstring)."""
    import torch

    from posmech.models.loading import is_tl_legacy_dir

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
        save_file(tl_initialisation(state, cfg, seed), str(out / "model.safetensors"))
        return
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src))
    model.save_pretrained(out, safe_serialization=True)


def build_twin(name: str, entry: dict[str, Any], parent_manifest: str | os.PathLike[str],
               out_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Rule ``build_twin``: the twin ``name`` of the model whose manifest is
    ``parent_manifest`` (``entry``: the twin's config entry, with ``twin_of`` and ``seed``),
    written to ``out_dir/hf`` with its manifest (kind ``twin``), as ``fetch_model`` writes a
    model's."""
    from posmech.core.io import atomic_path, write_json
    from posmech.models.loading import (HF_SUBDIR, MANIFEST, hash_weights, manifest_architecture, manifest_hf_dir,
                                        read_manifest, record_verified)

    parent = read_manifest(parent_manifest)
    out = Path(out_dir)
    with atomic_path(out / HF_SUBDIR) as tmp:
        build_twin_dir(parent["hf_dir"], tmp, int(entry["seed"]))
    full, digest = hash_weights(out / HF_SUBDIR)
    manifest = {
        "name": name,
        "kind": "twin",
        "source": f"twin of {entry['twin_of']}",
        "twin_of": entry["twin_of"],
        "seed": int(entry["seed"]),
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
