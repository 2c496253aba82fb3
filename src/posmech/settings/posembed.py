"""Settings of the posembed family (docs/workflow.md, "Families"): ``posembed_averaging``, ``posembed_attention`` config section."""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any, ClassVar

from posmech.settings import Settings, first_corpus


@dataclass(frozen=True)
class PosembedAveragingSettings(Settings):
    """The ``posembed_averaging`` config section (config/README.md; defaults: the schema)."""

    section: ClassVar[str] = "posembed_averaging"

    models: tuple[str, ...]
    corpus: str | None
    n_documents: int
    ks: tuple[int, ...]
    prompts: str
    prompt_ids: tuple[str, ...]
    loss_tolerance: float
    probability_tolerance: float

    def resolved(self, config: Mapping[str, Any]) -> PosembedAveragingSettings:
        """``corpus`` null: the first configured corpus (what the tables record)."""
        return self.replace(corpus=first_corpus(config, self.corpus))


@dataclass(frozen=True)
class PosembedAttentionSettings(Settings):
    """The ``posembed_attention`` config section (config/README.md; defaults: the schema)."""

    section: ClassVar[str] = "posembed_attention"

    models: tuple[str, ...]
    corpus: str | None
    document: int
    start: int
    size: int
    k: int

    def resolved(self, config: Mapping[str, Any]) -> PosembedAttentionSettings:
        """``corpus`` null: the first configured corpus (what the tables record)."""
        return self.replace(corpus=first_corpus(config, self.corpus))
