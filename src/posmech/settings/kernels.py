"""Settings of the kernels family (docs/workflow.md, "Families"): ``kernels`` config section."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from posmech.settings import first_corpus
from posmech.settings.schema_fields import KernelsFields


@dataclass(frozen=True)
class KernelsSettings(KernelsFields):
    """The ``kernels`` config section: its keys are the fields of
    :mod:`posmech.settings.schema_fields` (from the schema; config/README.md).

    Resolved (:meth:`resolved`): ``means_corpus`` and ``query_corpus`` left null are the
    first configured corpus. The query positions left null scale with a model's context
    (:meth:`scaled`); kernels.h5 records them (``kernels_config``) and the rules reading
    it use those (:meth:`recorded`)."""

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
