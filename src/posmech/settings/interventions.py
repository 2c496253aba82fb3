"""Settings of the interventions family (docs/workflow.md, "Families"): ``interventions`` config section."""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any, ClassVar

from posmech.settings import Settings, first_corpus


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
    """The ``interventions`` config section (config/README.md; defaults: the schema).

    ``corpus`` stays as configured (null too): the tables record the section as given
    (``interventions_config``, ``config_hash``); :meth:`corpus_or_first` is the corpus
    the rules read."""

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

    def corpus_or_first(self, config: Mapping[str, Any]) -> str:
        """The web-text corpus of P5, P14, P15: ``corpus``, or (null) the first corpus
        under ``corpora``."""
        return first_corpus(config, self.corpus)
