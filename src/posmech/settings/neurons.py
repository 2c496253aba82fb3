"""Settings of the neurons family (docs/workflow.md, "Families"): ``neurons`` config section."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from posmech.settings import Settings


@dataclass(frozen=True)
class NeuronsSettings(Settings):
    """The ``neurons`` config section (config/README.md; defaults: the schema)."""

    section: ClassVar[str] = "neurons"

    models: tuple[str, ...]
    heads: tuple[str, ...]
    head_classes: tuple[str, ...]
    calibration_text: str | int | None
    from_position: int | None
    reference_position: int | None
    ln2: str
    ln2_scale: float | None
    neurons: tuple[int, ...]
    n_auto: int
    n_tokens: int
    min_token_count: int
