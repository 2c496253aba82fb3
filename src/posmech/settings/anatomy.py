"""Settings of the anatomy family (docs/workflow.md, "Families"): ``anatomy`` config section."""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any

from posmech.settings import first_corpus
# anatomy.taxa's class is written whole from the schema; imported here too, where it was
from posmech.settings.schema_fields import AnatomyFields, AnatomyTaxaSettings  # noqa: F401


@dataclass(frozen=True)
class AnatomySettings(AnatomyFields):
    """The ``anatomy`` config section: its keys are the fields of
    :mod:`posmech.settings.schema_fields` (from the schema; config/README.md)."""

    def resolved(self, config: Mapping[str, Any]) -> AnatomySettings:
        """``corpus`` null: the first configured corpus (what the tables record)."""
        return self.replace(corpus=first_corpus(config, self.corpus))

    def pinned(self, model: str) -> tuple[str, ...] | None:
        """The heads ``heads`` pins for ``model`` (None: the chosen sharp and early heads)."""
        return (self.heads or {}).get(model)

    def for_pass(self, config: Mapping[str, Any], model: str) -> AnatomySettings | None:
        """These settings when ``model`` is one of the section's models (config ``config``,
        twins and checkpoints added), else None: the shared pass (attention_statistics)
        computes the P13 rows only for the anatomy models."""
        return self if model in self.chosen(config["models"]) else None
