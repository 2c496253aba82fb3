"""Settings of the cache family (docs/workflow.md, "Families"): ``cache`` config section."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from posmech.settings.schema_fields import CacheFields


@dataclass(frozen=True)
class CacheSettings(CacheFields):
    """The ``cache`` config section: its keys are the fields of
    :mod:`posmech.settings.schema_fields` (from the schema; config/README.md)."""

    def fingerprint_fields(self) -> dict[str, Any]:
        """The settings that shape a cache file's contents (part of the resume fingerprint of
        :func:`posmech.analyses.cache.cache_activations`: a checkpoint written with other
        values is not resumed). Compression, checkpointing and the engine are not among them."""
        return {"hooks": list(self.hooks), "n_documents": self.n_documents, "batch_size": self.batch_size,
                "storage_dtype": self.storage_dtype, "chunk_tokens": self.chunk_tokens}
