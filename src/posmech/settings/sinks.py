"""Settings of the sinks family (docs/workflow.md, "Families"): ``sinks`` config section."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from posmech.core.errors import PosmechError
from posmech.settings import first_corpus
from posmech.settings.schema_fields import SinksFields


def uniform_alpha0(T: int) -> float:
    """Gu et al.'s ``alpha[0]`` of a head attending uniformly on ``T`` tokens: ``H_T / T``."""
    return sum(1.0 / i for i in range(1, T + 1)) / T


@dataclass(frozen=True)
class SinksSettings(SinksFields):
    """The ``sinks`` config section: its keys are the fields of
    :mod:`posmech.settings.schema_fields` (from the schema; config/README.md)."""

    def resolved(self, config: Mapping[str, Any]) -> SinksSettings:
        """``corpus`` null: the first configured corpus (what the tables record)."""
        return self.replace(corpus=first_corpus(config, self.corpus))

    def check(self) -> None:
        """A uniform head must not count as a sink: ``H_T / T`` below ``epsilon`` (else every
        random-init head would be one and S1 would hold on noise)."""
        base = uniform_alpha0(self.n_tokens)
        if base >= self.epsilon:
            raise PosmechError(
                f"config keys `sinks.n_tokens` ({self.n_tokens}) and `sinks.epsilon` ({self.epsilon:g}): a head "
                f"attending uniformly has alpha[0] = H_T / T = {base:.3f}, not below epsilon, so every random-init "
                "head would be a sink; raise `sinks.n_tokens` or `sinks.epsilon`")
