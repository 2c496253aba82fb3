"""Settings of the attn_only family (docs/workflow.md, "Families"): ``attn_only`` config section."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from posmech.core.errors import PosmechError
# the nested objects' classes are written whole from the schema; imported here too, where they were
from posmech.settings.schema_fields import (  # noqa: F401
    AttnOnlyBosInductionSettings,
    AttnOnlyFields,
    AttnOnlyInductionScoreSettings,
    AttnOnlyRoleMinScoreSettings,
)


@dataclass(frozen=True)
class AttnOnlySettings(AttnOnlyFields):
    """The ``attn_only`` config section: its keys are the fields of
    :mod:`posmech.settings.schema_fields` (from the schema; config/README.md)."""

    def bos_for(self, entry: Mapping[str, Any]) -> bool:
        """Whether the sequences of the model of config entry ``entry`` start with BOS:
        ``bos: model`` follows its ``prepend_bos`` (default true)."""
        return bool(entry.get("prepend_bos", True)) if self.bos == "model" else bool(self.bos)

    def sequence_lengths(self, bos: bool) -> dict[str, int]:
        """Length in tokens of every sequence the L rules build, by config key."""
        b = 1 if bos else 0
        return {
            "attn_only.n_tokens": self.n_tokens + b,
            "attn_only.induction_score.half_length": 2 * self.induction_score.half_length + b,
            "attn_only.bos_induction.n_random": self.bos_induction.n_random + 4,
        }

    def largest_fitting(self, key: str, n_ctx: int, bos: bool) -> int:
        """The largest value of ``key`` (a key of :meth:`sequence_lengths`) whose sequences fit
        a context of ``n_ctx`` tokens (what a pre-run message suggests)."""
        b = 1 if bos else 0
        return {"attn_only.n_tokens": n_ctx - b, "attn_only.induction_score.half_length": (n_ctx - b) // 2,
                "attn_only.bos_induction.n_random": n_ctx - 4}[key]

    def longest_sequence(self, *keys: str) -> int:
        """The longest sequence (tokens, BOS counted) an L rule builds from the settings
        ``keys`` (``n_tokens``, ``induction_score.half_length``, ``bos_induction.n_random``):
        its memory estimate's context."""
        lengths = self.sequence_lengths(True)
        return max(lengths[f"attn_only.{k}"] for k in keys)

    def check(self) -> None:
        """Checks the settings alone allow (run when the workflow is parsed and by every rule)."""
        T = self.n_tokens + 1
        if not 0 < self.query < T:
            raise PosmechError(f"attn_only.query: {self.query} is not a query position of BOS + {self.n_tokens} tokens")
        if not 3 <= self.first_query < T:
            raise PosmechError(
                f"attn_only.first_query: {self.first_query} must be >= 3 (offsets -1..-3 then skip BOS) and < {T}")
        for key, v in (("attn_only.n_sequences", self.n_sequences), ("attn_only.batch_size", self.batch_size),
                       ("attn_only.induction_score.n_sequences", self.induction_score.n_sequences),
                       ("attn_only.bos_induction.n_samples", self.bos_induction.n_samples)):
            if v < 1:
                raise PosmechError(f"{key}: must be at least 1 (an average over nothing is undefined)")


def models(settings: AttnOnlySettings, config: Mapping[str, Any], bos: bool | None = None) -> list[str]:
    """Models of the ``attn_only`` section (empty: every model); ``bos=True``: only those
    run with BOS (bos_induction, L4, compares with and without it), ``bos=False`` those
    without."""
    chosen = settings.chosen(config["models"])
    if bos is None:
        return chosen
    return [m for m in chosen if settings.bos_for(config["models"][m]) == bos]


def check(settings: AttnOnlySettings, config: Mapping[str, Any]) -> None:
    """What the config alone tells about the L rules, before any job: the settings
    (:meth:`AttnOnlySettings.check`), and sequence lengths against the context of trained
    models (``n_ctx`` in the config), when the workflow is parsed."""
    settings.check()
    for m in models(settings, config):
        entry = config["models"][m]
        if "train" not in entry:
            continue
        for key, n in settings.sequence_lengths(settings.bos_for(entry)).items():
            if n > entry["train"]["n_ctx"]:
                raise PosmechError(
                    f"{key}: sequences of {n} tokens are longer than model `{m}`'s context "
                    f"(models.{m}.train.n_ctx = {entry['train']['n_ctx']}); lower it"
                )
