"""Settings of the geometry family (docs/workflow.md, "Families"): ``geometry`` config section."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from posmech.settings import Settings


@dataclass(frozen=True)
class GeometrySettings(Settings):
    """The ``geometry`` config section (config/README.md; defaults: the schema)."""

    section: ClassVar[str] = "geometry"

    models: tuple[str, ...]
    n_tokens: int
    seed: int
    batch_size: int
    bos: str
    first_position: int | None
    layer: int
    n_components: int
    k: int
    min_gap: float
    sparsity_threshold: float
