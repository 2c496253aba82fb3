"""Settings of the interventions family (docs/workflow.md, "Families"): ``interventions`` config section."""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any

from posmech.settings import first_corpus
# the nested objects' classes are written whole from the schema; imported here too, where they were
from posmech.settings.schema_fields import (  # noqa: F401
    InterventionsExtendedAveragingSettings,
    InterventionsFields,
    InterventionsInductionInterventionSettings,
    InterventionsPrevKnockoutSettings,
    InterventionsRepeatedTokensSettings,
)


@dataclass(frozen=True)
class InterventionsSettings(InterventionsFields):
    """The ``interventions`` config section: its keys are the fields of
    :mod:`posmech.settings.schema_fields` (from the schema; config/README.md).

    ``corpus`` stays as configured (null too): the tables record the section as given
    (``interventions_config``, ``config_hash``); :meth:`corpus_or_first` is the corpus
    the rules read."""

    def corpus_or_first(self, config: Mapping[str, Any]) -> str:
        """The web-text corpus of P5, P14, P15: ``corpus``, or (null) the first corpus
        under ``corpora``."""
        return first_corpus(config, self.corpus)
