"""Settings of rule ``rotary_frequencies`` (P17, P18): the ``rotary_frequencies`` config section."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from posmech.settings import first_corpus
from posmech.settings.schema_fields import RotaryFrequenciesFields


@dataclass(frozen=True)
class RotaryFrequenciesSettings(RotaryFrequenciesFields):
    """The ``rotary_frequencies`` config section: its keys are the fields of
    :mod:`posmech.settings.schema_fields` (from the schema; config/README.md)."""

    def resolved(self, config: Mapping[str, Any]) -> RotaryFrequenciesSettings:
        """``corpus`` null: the first configured corpus (what the tables record)."""
        return self.replace(corpus=first_corpus(config, self.corpus))
