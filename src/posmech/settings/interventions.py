"""Settings of the interventions family (docs/workflow.md, "Families"): ``interventions`` config section."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from posmech.settings import Settings


@dataclass(frozen=True)
class InterventionsPrevKnockoutSettings(Settings):
    """The ``interventions.prev_knockout`` config section (config/README.md; defaults: the schema)."""

    section: ClassVar[str] = "interventions.prev_knockout"

    period: int
    phase: int
    layers: tuple[int, ...] | None


@dataclass(frozen=True)
class InterventionsExtendedAveragingSettings(Settings):
    """The ``interventions.extended_averaging`` config section (config/README.md; defaults: the schema)."""

    section: ClassVar[str] = "interventions.extended_averaging"

    group_size: int


@dataclass(frozen=True)
class InterventionsRepeatedTokensSettings(Settings):
    """The ``interventions.repeated_tokens`` config section (config/README.md; defaults: the schema)."""

    section: ClassVar[str] = "interventions.repeated_tokens"

    context: int


@dataclass(frozen=True)
class InterventionsInductionInterventionSettings(Settings):
    """The ``interventions.induction_intervention`` config section (config/README.md; defaults: the schema)."""

    section: ClassVar[str] = "interventions.induction_intervention"

    prompt: str
    output_scale: float


@dataclass(frozen=True)
class InterventionsSettings(Settings):
    """The ``interventions`` config section (config/README.md; defaults: the schema)."""

    section: ClassVar[str] = "interventions"

    models: tuple[str, ...]
    corpus: str | None
    n_documents: int
    min_tokens: int | None
    max_tokens: int | None
    zoom: int | None
    zoom_start: int
    prev_knockout: InterventionsPrevKnockoutSettings
    extended_averaging: InterventionsExtendedAveragingSettings
    repeated_tokens: InterventionsRepeatedTokensSettings
    induction_intervention: InterventionsInductionInterventionSettings
