"""Settings of the taxonomy family (docs/workflow.md, "Families"): ``taxonomy`` config section."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from posmech.settings import Settings


@dataclass(frozen=True)
class TaxonomySettings(Settings):
    """The ``taxonomy`` config section (config/README.md; defaults: the schema)."""

    section: ClassVar[str] = "taxonomy"

    models: tuple[str, ...]
    corpus: str | None
    n_documents: int
    context: int | None
    batch_size: int
    exclude_first_query: bool
    tie_rtol: float
    early_top_n: int
    pin: dict[str, Any]
