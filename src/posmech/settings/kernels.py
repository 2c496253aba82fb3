"""Settings of the kernels family (docs/workflow.md, "Families"): ``kernels`` config section."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from posmech.settings import Settings


@dataclass(frozen=True)
class KernelsSettings(Settings):
    """The ``kernels`` config section (config/README.md; defaults: the schema)."""

    section: ClassVar[str] = "kernels"

    models: tuple[str, ...]
    means_corpus: str | None
    query_corpus: str | None
    n_chapters: int
    seed: int
    k0: int
    heatmap_max_position: int | None
    etc_positions: tuple[int, ...] | None
    etc_heatmap_position: int | None
    local_max_fraction: float
    uniform_min_fraction: float
    equivariance_max_offset: int
    selected_heads: tuple[str, ...]
