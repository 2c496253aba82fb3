"""Settings of the kernels family (docs/workflow.md, "Families"): ``kernels`` config section."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from posmech.settings import Settings, first_corpus


@dataclass(frozen=True)
class KernelsSettings(Settings):
    """The ``kernels`` config section (config/README.md; defaults: the schema).

    Resolved (:meth:`resolved`): ``means_corpus`` and ``query_corpus`` left null are the
    first configured corpus. The query positions left null scale with a model's context
    (:meth:`scaled`); kernels.h5 records them (``kernels_config``) and the rules reading
    it use those (:meth:`recorded`)."""

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

    def resolved(self, config: Mapping[str, Any]) -> KernelsSettings:
        """The corpora left null (``means_corpus``, ``query_corpus``): the first corpus."""
        return self.replace(means_corpus=first_corpus(config, self.means_corpus),
                            query_corpus=first_corpus(config, self.query_corpus))

    def recorded(self, recorded: Mapping[str, Any]) -> KernelsSettings:
        """A copy with the context-scaled keys taken from ``recorded``, the section as the
        job that wrote an artifact resolved it for the model (kernels.h5's
        ``kernels_config``; :func:`posmech.core.config.recorded_scaled`)."""
        from posmech.core.config import recorded_scaled

        return type(self).from_section(recorded_scaled(self.section, self.as_dict(), recorded))
