"""Settings of the interventions family (docs/workflow.md, "Families"): ``interventions`` config section."""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any

from posmech.settings import Context, first_corpus, null_gives
# the nested objects' classes are written whole from the schema; imported here too, where they were
from posmech.settings.schema_fields import (  # noqa: F401
    InterventionsExtendedAveragingSettings,
    InterventionsFields,
    InterventionsInductionInterventionSettings,
    InterventionsPrevKnockoutSettings,
    InterventionsRepeatedTokensSettings,
)


@dataclass(frozen=True)
class InterventionsSettings(InterventionsFields):
    """The ``interventions`` config section: its keys are the fields of
    :mod:`posmech.settings.schema_fields` (from the schema; config/README.md).

    ``corpus`` stays as configured (null too): the tables record the section as given
    (``interventions_config``, ``config_hash``); :meth:`corpus_or_first` is the corpus
    the rules read. ``min_tokens`` and ``zoom`` left null scale with the context of the
    model's documents: each rule resolves them once
    (:func:`posmech.settings.positions_for`) and records them in its table."""

    def corpus_or_first(self, config: Mapping[str, Any]) -> str:
        """The web-text corpus of P5, P14, P15: ``corpus``, or (null) the first corpus
        under ``corpora``."""
        return first_corpus(config, self.corpus)

    def position_problems(self, n_ctx: int, at: Context) -> list[str]:
        """``min_tokens`` within the context (documents are cut to it), a zoom from
        ``zoom_start`` holding at least 2 positions, ``max_tokens`` not below ``min_tokens``."""
        out = []
        pre = at.has_context(n_ctx)
        if int(self.min_tokens) > n_ctx:
            out.append(f"config key `interventions.min_tokens`: {pre}: documents are cut to it, so none has "
                       f"{self.min_tokens}; set it to at most {n_ctx}, e.g. {at.fit().min_tokens} "
                       f"({null_gives('interventions', 'min_tokens')})")
        if int(self.zoom_start) + 2 > n_ctx:
            out.append(f"config key `interventions.zoom_start`: {pre}: a zoom from position {self.zoom_start} "
                       f"holds fewer than 2 positions; set it to at most {n_ctx - 2}, e.g. 0")
        if self.max_tokens is not None and int(self.max_tokens) < int(self.min_tokens):
            out.append(f"config key `interventions.max_tokens`: {self.max_tokens} is below `min_tokens` "
                       f"({self.min_tokens} for model {at.model!r}): every document would be cut shorter than "
                       "the documents kept; raise it or set null")
        return out
