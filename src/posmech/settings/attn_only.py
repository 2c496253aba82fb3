"""Settings of the attn_only family (docs/workflow.md, "Families"): ``attn_only`` config section."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from posmech.settings import Settings


@dataclass(frozen=True)
class AttnOnlyInductionScoreSettings(Settings):
    """The ``attn_only.induction_score`` config section (config/README.md; defaults: the schema)."""

    section: ClassVar[str] = "attn_only.induction_score"

    n_sequences: int
    half_length: int


@dataclass(frozen=True)
class AttnOnlyBosInductionSettings(Settings):
    """The ``attn_only.bos_induction`` config section (config/README.md; defaults: the schema)."""

    section: ClassVar[str] = "attn_only.bos_induction"

    n_samples: int
    n_random: int


@dataclass(frozen=True)
class AttnOnlyRoleMinScoreSettings(Settings):
    """The ``attn_only.role_min_score`` config section (config/README.md; defaults: the schema)."""

    section: ClassVar[str] = "attn_only.role_min_score"

    previous: float
    look_back_two: float
    induction: float


@dataclass(frozen=True)
class AttnOnlySettings(Settings):
    """The ``attn_only`` config section (config/README.md; defaults: the schema)."""

    section: ClassVar[str] = "attn_only"

    models: tuple[str, ...]
    seed: int
    n_sequences: int
    n_tokens: int
    query: int
    first_query: int
    bos: bool | str
    batch_size: int
    induction_score: AttnOnlyInductionScoreSettings
    bos_induction: AttnOnlyBosInductionSettings
    role_min_score: AttnOnlyRoleMinScoreSettings
    pin: dict[str, Any]
