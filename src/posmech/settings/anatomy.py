"""Settings of the anatomy family (docs/workflow.md, "Families"): ``anatomy`` config section."""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any, ClassVar

from posmech.settings import Settings, first_corpus


@dataclass(frozen=True)
class AnatomyTaxaSettings(Settings):
    """The ``anatomy.taxa`` config section (config/README.md; defaults: the schema): the
    score taxa's thresholds (:func:`posmech.analyses.anatomy.classify_taxa`)."""

    section: ClassVar[str] = "anatomy.taxa"

    row_min: float
    dip_min: float
    bump_min: float
    fraction_min: float
    trend_min: float | None


@dataclass(frozen=True)
class AnatomySettings(Settings):
    """The ``anatomy`` config section (config/README.md; defaults: the schema)."""

    section: ClassVar[str] = "anatomy"

    models: tuple[str, ...]
    corpus: str | None
    context: int | None
    heads: dict[str, tuple[str, ...]]
    document: int
    zoom_start: int
    zoom_size: int
    figure_heads: int
    n_documents: int
    batch_size: int
    window: int
    rows_per_document: int | None
    first_query: int | None
    taxa: AnatomyTaxaSettings

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
