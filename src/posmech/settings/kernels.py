"""Settings of the kernels family (docs/workflow.md, "Families"): ``kernels`` config section."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from posmech.settings import Context, example, first_corpus, null_gives
from posmech.settings.schema_fields import KernelsFields


@dataclass(frozen=True)
class KernelsSettings(KernelsFields):
    """The ``kernels`` config section: its keys are the fields of
    :mod:`posmech.settings.schema_fields` (from the schema; config/README.md).

    Resolved (:meth:`resolved`): ``means_corpus`` and ``query_corpus`` left null are the
    first configured corpus. The query positions left null scale with a model's context:
    rule positional_kernels resolves them once (:func:`posmech.settings.positions_for`,
    checked by :meth:`position_problems`) and records them in kernels.h5
    (``kernels_config``); the rules reading it take those (:meth:`recorded`)."""

    def resolved(self, config: Mapping[str, Any]) -> KernelsSettings:
        """The corpora left null (``means_corpus``, ``query_corpus``): the first corpus."""
        return self.replace(means_corpus=first_corpus(config, self.means_corpus),
                            query_corpus=first_corpus(config, self.query_corpus))

    def position_problems(self, n_ctx: int, at: Context) -> list[str]:
        """The query positions (resolved, :func:`posmech.settings.positions_for`) below the
        context: ``etc_positions``, ``heatmap_max_position``, and ``etc_heatmap_position`` a
        computed query position (``k0..heatmap_max_position`` or one of ``etc_positions``)."""
        out: list[str] = []
        pre = at.has_context(n_ctx) + ": "
        bad = [int(n) for n in self.etc_positions if int(n) >= n_ctx]
        if bad:
            out.append(f"config key `kernels.etc_positions`: {pre}positions {bad} are beyond it; set "
                       f"kernels.etc_positions to values <= {n_ctx - 1}, e.g. {example(at.fit().etc_positions)} "
                       f"({null_gives('kernels', 'etc_positions')})")
        if int(self.heatmap_max_position) >= n_ctx:
            out.append(f"config key `kernels.heatmap_max_position`: {pre}{self.heatmap_max_position} is beyond "
                       f"it; set it to at most {n_ctx - 1}, e.g. {at.fit().heatmap_max_position} "
                       f"({null_gives('kernels', 'heatmap_max_position')})")
        computed = set(range(int(self.k0), int(self.heatmap_max_position) + 1)) | {int(n) for n in self.etc_positions}
        n = int(self.etc_heatmap_position)
        if n >= n_ctx:
            out.append(f"config key `kernels.etc_heatmap_position`: {pre}{n} is beyond it; set it to one of "
                       f"`etc_positions` below {n_ctx}, e.g. {max(at.fit().etc_positions)} "
                       f"({null_gives('kernels', 'etc_heatmap_position')})")
        elif n not in computed:
            out.append(f"config key `kernels.etc_heatmap_position`: {n} is not a computed query position of "
                       f"model {at.model!r} (k0..heatmap_max_position, or one of `etc_positions` "
                       f"{example(sorted(int(x) for x in self.etc_positions))}); give one of them, or null")
        return out
