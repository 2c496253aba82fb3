"""Forward-pass accounting of a job: every engine calls :func:`count_forward` once per pass."""

from __future__ import annotations

from collections import Counter

_PASSES: Counter[str] = Counter()


def count_forward(batch: int, n_tokens: int) -> None:
    """Record one forward pass of ``batch`` sequences of ``n_tokens`` positions."""
    _PASSES[f"{int(batch)}x{int(n_tokens)}"] += 1


def forward_passes() -> dict[str, int]:
    """Passes so far in this process, by shape ``"{batch}x{n_tokens}"``."""
    return dict(_PASSES)
