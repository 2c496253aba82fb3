"""Settings of the contextual family (docs/workflow.md, "Families"): ``contextual`` config section."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from posmech.settings import Settings


@dataclass(frozen=True)
class ContextualSettings(Settings):
    """The ``contextual`` config section (config/README.md; defaults: the schema)."""

    section: ClassVar[str] = "contextual"

    models: tuple[str, ...]
    corpora: tuple[str, ...]
    pattern_corpus: str | None
    scale_corpus: str | None
    destination_token: str
    ln_scale: float | None
    n_per_corpus: int
    seed: int
    max_position: int | None
    positions: tuple[int, ...] | None
    grid: int | None
    k0: int
    classify_position: int | None
    local_window: int
    duplicate_min_excess: float
    local_min_mass: float
    uniform_min_fraction: float
    denominator_from: int | None
    n_most_varying: int
    variance_positions: tuple[int, ...] | None
    n_resamples: int
    mostly_positional_max_tv: float
