"""Settings of the contextual family (docs/workflow.md, "Families"): ``contextual`` config section."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from posmech.settings import first_corpus
from posmech.settings.schema_fields import ContextualFields


@dataclass(frozen=True)
class ContextualSettings(ContextualFields):
    """The ``contextual`` config section: its keys are the fields of
    :mod:`posmech.settings.schema_fields` (from the schema; config/README.md).

    Resolved (:meth:`resolved`): ``corpora`` (empty: every corpus) in the config's order
    with the pattern corpus first, ``pattern_corpus`` (null: the first of them),
    ``scale_corpus`` (null: the first configured corpus). The positions left null scale
    with a model's context (:meth:`scaled`,
    :func:`posmech.analyses.contextual.resolved_positions`)."""

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
