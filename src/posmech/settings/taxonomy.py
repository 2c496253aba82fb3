"""Settings of the taxonomy family (docs/workflow.md, "Families"): ``taxonomy`` config section."""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any

from posmech.settings import first_corpus
from posmech.settings.schema_fields import TaxonomyFields


@dataclass(frozen=True)
class TaxonomySettings(TaxonomyFields):
    """The ``taxonomy`` config section: its keys are the fields of
    :mod:`posmech.settings.schema_fields` (from the schema; config/README.md)."""

    def resolved(self, config: Mapping[str, Any]) -> TaxonomySettings:
        """``corpus`` null: the first configured corpus (what the tables record)."""
        return self.replace(corpus=first_corpus(config, self.corpus))

    def pinned(self, model: str) -> Any:
        """The heads ``pin`` fixes for ``model`` (None: none, the ranking chooses)."""
        return (self.pin or {}).get(model)
