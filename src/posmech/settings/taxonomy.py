"""Settings of the taxonomy family (docs/workflow.md, "Families"): ``taxonomy`` config section."""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any, ClassVar

from posmech.settings import Settings, first_corpus


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

    def resolved(self, config: Mapping[str, Any]) -> TaxonomySettings:
        """``corpus`` null: the first configured corpus (what the tables record)."""
        return self.replace(corpus=first_corpus(config, self.corpus))

    def pinned(self, model: str) -> Any:
        """The heads ``pin`` fixes for ``model`` (None: none, the ranking chooses)."""
        return (self.pin or {}).get(model)
