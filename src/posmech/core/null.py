"""Whether the analyses running now compute a random-init twin's null (config section
`twins`, run as one job: :mod:`posmech.pipeline.sweep`).

The null is read only through its claims' values (:func:`posmech.verdicts.findings.with_twins`):
within :func:`claims_only` an analysis may leave out what no claim's quantity reads (a table's
rows of conditions no claim reads), never change how a quantity is defined. Each such cut is
listed in the schema's description of `twins.claims_only` and in docs/performance.md, "Twins".
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_CLAIMS_ONLY: ContextVar[bool] = ContextVar("posmech_claims_only", default=False)


@contextmanager
def claims_only(on: bool = True) -> Iterator[None]:
    """Within this context (``on``) :func:`only_claims` is true: a twin's analyses compute only
    what its claims read."""
    token = _CLAIMS_ONLY.set(bool(on))
    try:
        yield
    finally:
        _CLAIMS_ONLY.reset(token)


def only_claims() -> bool:
    """Whether the running analyses compute only what their claims read (a twin's null)."""
    return _CLAIMS_ONLY.get()
