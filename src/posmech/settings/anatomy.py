"""Settings of the anatomy family (docs/workflow.md, "Families"): ``anatomy`` config section."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from posmech.settings import Settings


@dataclass(frozen=True)
class AnatomyTaxaSettings(Settings):
    """The ``anatomy.taxa`` config section (config/README.md; defaults: the schema)."""

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
