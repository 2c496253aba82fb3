"""Settings of the cache family (docs/workflow.md, "Families"): ``cache`` config section."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

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
