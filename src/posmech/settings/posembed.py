"""Settings of the posembed family (docs/workflow.md, "Families"): ``posembed_averaging``, ``posembed_attention`` config section."""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any

from posmech.settings import first_corpus
from posmech.settings.schema_fields import PosembedAveragingFields, PosembedAttentionFields


@dataclass(frozen=True)
class PosembedAveragingSettings(PosembedAveragingFields):
    """The ``posembed_averaging`` config section: its keys are the fields of
    :mod:`posmech.settings.schema_fields` (from the schema; config/README.md)."""

    def resolved(self, config: Mapping[str, Any]) -> PosembedAveragingSettings:
        """``corpus`` null: the first configured corpus (what the tables record)."""
        return self.replace(corpus=first_corpus(config, self.corpus))


@dataclass(frozen=True)
class PosembedAttentionSettings(PosembedAttentionFields):
    """The ``posembed_attention`` config section: its keys are the fields of
    :mod:`posmech.settings.schema_fields` (from the schema; config/README.md)."""

    def resolved(self, config: Mapping[str, Any]) -> PosembedAttentionSettings:
        """``corpus`` null: the first configured corpus (what the tables record)."""
        return self.replace(corpus=first_corpus(config, self.corpus))
