"""Settings of the neurons family (docs/workflow.md, "Families"): ``neurons`` config section."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from posmech.core.errors import PosmechError
from posmech.settings import Context, null_gives
from posmech.settings.schema_fields import NeuronsFields


@dataclass(frozen=True)
class NeuronsSettings(NeuronsFields):
    """The ``neurons`` config section: its keys are the fields of
    :mod:`posmech.settings.schema_fields` (from the schema; config/README.md).

    ``from_position`` left null scales with the model's context: rule
    extended_token_embeddings resolves it (:func:`posmech.settings.positions_for`, the
    context and ``max_position`` of layer0.h5) and records it in extended_tokens.h5
    (``neurons_config``); the rules reading that take it from there
    (:meth:`~posmech.settings.Settings.recorded`)."""

    def position_problems(self, n_ctx: int, at: Context) -> list[str]:
        """``reference_position`` within ``1..n_ctx − 1``; ``from_position`` leaves at least
        two destination positions ``n >= it`` up to the contextual section's ``max_position``
        (``at.max_position``; None: ``n_ctx − 2``)."""
        out = []
        mp = n_ctx - 2 if at.max_position is None else int(at.max_position)
        ref = self.reference_position
        if ref is not None and not 1 <= int(ref) < n_ctx:
            out.append(f"config key `neurons.reference_position`: model {at.model!r} has a context of {n_ctx} "
                       f"tokens: {ref} is outside 1..{n_ctx - 1}; give a position in it, e.g. {mp}, or null "
                       "(contextual.max_position)")
        if int(self.from_position) > mp - 1:
            out.append(f"config key `neurons.from_position`: model {at.model!r} has a context of {n_ctx} tokens "
                       f"(destination positions 1..{mp}, contextual.max_position): {self.from_position} leaves "
                       f"fewer than 2 positions n >= it; set it to at most {mp - 1}, e.g. "
                       f"{at.fit().from_position} ({null_gives('neurons', 'from_position')})")
        return out


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
