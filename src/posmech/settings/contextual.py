"""Settings of the contextual family (docs/workflow.md, "Families"): ``contextual`` config section."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from posmech.settings import Context, example, first_corpus
from posmech.settings.schema_fields import ContextualFields


@dataclass(frozen=True)
class ContextualSettings(ContextualFields):
    """The ``contextual`` config section: its keys are the fields of
    :mod:`posmech.settings.schema_fields` (from the schema; config/README.md).

    Resolved (:meth:`resolved`): ``corpora`` (empty: every corpus) in the config's order
    with the pattern corpus first, ``pattern_corpus`` (null: the first of them),
    ``scale_corpus`` (null: the first configured corpus). The positions left null scale
    with a model's context: rule layer0_decomposition resolves them
    (:func:`posmech.settings.positions_for`: :meth:`with_positions`, checked by
    :meth:`position_problems`); layer0.h5 records the section as configured
    (``contextual_config``) and the model's context (``n_ctx``), from which the rules
    reading it get the same values (:meth:`~posmech.settings.Settings.recorded`)."""

    #: the keys a message's "values that fit" leaves null (their values shown)
    FIT_KEYS = ("positions", "variance_positions", "max_position", "classify_position", "denominator_from")

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

    def with_positions(self, n_ctx: int) -> ContextualSettings:
        """The context-scaled keys left null resolved (:meth:`scaled`), ``max_position``
        (null: ``n_ctx − 2``) and ``classify_position`` (null: the largest of ``positions``)
        filled, ``positions`` and ``variance_positions`` sorted; unchecked."""
        s = self.scaled(n_ctx)
        mp = n_ctx - 2 if s.max_position is None else int(s.max_position)
        positions = sorted(int(n) for n in s.positions)
        return s.replace(max_position=mp, positions=positions, variance_positions=sorted(int(n) for n in s.variance_positions),
                         classify_position=max(positions) if s.classify_position is None else int(s.classify_position),
                         denominator_from=int(s.denominator_from), grid=int(s.grid))

    def position_problems(self, n_ctx: int, at: Context) -> list[str]:
        """The first position that does not fit (the checks after it assume the ones before):
        ``max_position`` within ``1..n_ctx − 1``, ``positions`` and ``variance_positions``
        within it and up to ``max_position``, ``classify_position`` within ``k0 + 1 ..
        max_position``, ``local_window`` keys at it; the message adds values that fit."""
        why = self._first_problem(n_ctx, at.model)
        if why is None:
            return []
        fit = at.fit()
        hint = ""
        if fit is not None and fit._first_problem(n_ctx, at.model) is None:
            hint = (f"; values that fit it: positions {example(fit.positions)}, variance_positions "
                    f"{example(fit.variance_positions)}, denominator_from {fit.denominator_from}, "
                    f"max_position {fit.max_position} (null: scaled with each model's context)")
        return [f"{why} (model {at.model!r} has a context of {n_ctx} tokens{hint})"]

    def _first_problem(self, n_ctx: int, model: str) -> str | None:
        mp, of = int(self.max_position), f" (model {model})" if model else ""
        for key, values in (("max_position", [mp]), ("positions", self.positions),
                            ("variance_positions", self.variance_positions)):
            bad = [int(n) for n in values if not 1 <= int(n) < n_ctx]
            if bad:
                return (f"config key `contextual.{key}`{of}: position(s) {bad} are outside "
                        f"1..{n_ctx - 1} (the model's context is {n_ctx}); lower them")
            beyond = [int(n) for n in values if int(n) > mp]
            if beyond:
                return (f"config key `contextual.{key}`{of}: {beyond} beyond "
                        f"`contextual.max_position` = {mp}; lower them or raise max_position")
        cp = int(self.classify_position)
        if not self.k0 + 1 <= cp <= mp:
            return (f"config key `contextual.classify_position`{of}: {cp} must be in "
                    f"{self.k0 + 1}..{mp} (k0 + 1 .. max_position)")
        if self.local_window > cp - self.k0 + 1:
            return (f"config key `contextual.local_window`: {self.local_window} is more keys than "
                    f"position {cp} has after k0")
        return None
