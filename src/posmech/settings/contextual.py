"""Settings of the contextual family (docs/workflow.md, "Families"): ``contextual`` config section."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from posmech.settings import Settings, first_corpus


@dataclass(frozen=True)
class ContextualSettings(Settings):
    """The ``contextual`` config section (config/README.md; defaults: the schema).

    Resolved (:meth:`resolved`): ``corpora`` (empty: every corpus) in the config's order
    with the pattern corpus first, ``pattern_corpus`` (null: the first of them),
    ``scale_corpus`` (null: the first configured corpus). The positions left null scale
    with a model's context (:meth:`scaled`,
    :func:`posmech.analyses.contextual.resolved_positions`)."""

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

    def resolved(self, config: Mapping[str, Any]) -> ContextualSettings:
        """The corpora resolved against ``config["corpora"]``: ``corpora`` the chosen ones
        (empty: all) in the config's order, the pattern corpus (null: the first of them)
        moved first; ``scale_corpus`` null: the first corpus."""
        chosen = self.chosen(config["corpora"], "corpora")
        pattern = self.pattern_corpus or chosen[0]
        return self.replace(pattern_corpus=pattern, corpora=[pattern] + [c for c in chosen if c != pattern],
                            scale_corpus=first_corpus(config, self.scale_corpus))

    @property
    def token_corpora(self) -> tuple[str, ...]:
        """The corpora whose tokens the family reads (resolved settings): the texts'
        corpora, then the LN-scale corpus, each once."""
        return tuple(dict.fromkeys((*self.corpora, self.scale_corpus)))
