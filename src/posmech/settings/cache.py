"""Settings of the cache family (docs/workflow.md, "Families"): ``cache`` config section."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from posmech.settings import Settings


@dataclass(frozen=True)
class CacheSettings(Settings):
    """The ``cache`` config section (config/README.md; defaults: the schema)."""

    section: ClassVar[str] = "cache"

    models: tuple[str, ...]
    corpora: tuple[str, ...]
    hooks: tuple[str, ...]
    n_documents: int | None
    batch_size: int
    storage_dtype: str
    compression: str | None
    compression_level: int
    chunk_tokens: int
    checkpoint_every: int
    checkpoint_seconds: float
    engine: str

    def fingerprint_fields(self) -> dict[str, Any]:
        """The settings that shape a cache file's contents (part of the resume fingerprint of
        :func:`posmech.analyses.cache.cache_activations`: a checkpoint written with other
        values is not resumed). Compression, checkpointing and the engine are not among them."""
        return {"hooks": list(self.hooks), "n_documents": self.n_documents, "batch_size": self.batch_size,
                "storage_dtype": self.storage_dtype, "chunk_tokens": self.chunk_tokens}
