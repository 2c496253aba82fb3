"""Settings of the neurons family (docs/workflow.md, "Families"): ``neurons`` config section."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from posmech.core.errors import PosmechError
from posmech.settings.schema_fields import NeuronsFields


@dataclass(frozen=True)
class NeuronsSettings(NeuronsFields):
    """The ``neurons`` config section: its keys are the fields of
    :mod:`posmech.settings.schema_fields` (from the schema; config/README.md)."""


def has_mlp(name: str, entry: Mapping[str, Any], arch: Any) -> bool:
    """False for an attention-only model, known from its config before any job: its
    architecture (``arch``: a trained ``attn_only`` model, a config.json with
    ``attn_only``), or, not known yet, an attention-only Hub id (``attn_only`` in its source)."""
    if arch is not None:
        return bool(arch.has_mlp)
    return "attn_only" not in str(entry.get("source", "")).lower()


def models(settings: NeuronsSettings, config: Mapping[str, Any], architectures: Mapping[str, Any]) -> list[str]:
    """The models of the ``neurons`` section: those it names, or (none named) every model
    with an MLP in layer 0; an attention-only model named there is an error (contextual
    neurons need an MLP). ``architectures``: each model's, or None where not known yet."""
    everything = list(config["models"])
    mlp = [m for m in everything if has_mlp(m, config["models"][m], architectures.get(m))]
    if not settings.models:
        return mlp
    chosen = settings.chosen(everything)
    bad = [m for m in chosen if m not in mlp]
    if bad:
        raise PosmechError(f"config key `neurons.models`: {bad} have no MLP in layer 0 (attention-only): "
                           "contextual neurons need one; remove them")
    return chosen
