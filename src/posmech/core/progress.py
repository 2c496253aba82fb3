"""Progress of long loops in a rule's log: ``what done/total (pct), rate/s, ~ETA`` at a bounded
interval (no progress bars: they repeat in a terminal and garble a log file)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

#: progress lines go to the rule's log file only, not to the terminal (jobs run side by side)
PROGRESS_LOG = logging.getLogger("posmech.progress")
T = TypeVar("T")
#: seconds between two progress lines of a long loop (POSMECH_PROGRESS_SECONDS overrides)
PROGRESS_SECONDS = 30.0


class Progress:
    """Progress of a long loop in the rule's log: ``what done/total (pct), rate/s, ~ETA``.

    Call :meth:`update` with the count done so far (or :meth:`advance`); a line is logged
    on the first update, then at most every ``every_s`` seconds, and when ``total`` is
    reached, so a log of a long rule shows it is alive without flooding it (no progress
    bars: they repeat in a terminal and garble a log file)."""

    def __init__(self, total: int | None, what: str = "documents", every_s: float | None = None,
                 logger: logging.Logger | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.total, self.what, self.log, self.clock = total, what, logger or PROGRESS_LOG, clock
        self.every_s = float(os.environ.get("POSMECH_PROGRESS_SECONDS", PROGRESS_SECONDS)) if every_s is None else every_s
        self.t0 = clock()
        self.last: float | None = None
        self.done = 0
        self.logged_done = -1

    def line(self) -> str:
        base = (f"{self.what} {self.done}/{self.total} ({100 * self.done / self.total:.0f} %)" if self.total
                else f"{self.what} {self.done}")
        dt = self.clock() - self.t0
        if dt < 1.0 or self.done == 0:  # too early for a rate worth printing
            return base
        rate = self.done / dt
        eta = ""
        if self.total and self.done < self.total:
            eta = f", ~{(self.total - self.done) / rate:.0f} s left"
        return f"{base}, {rate:.3g}/s{eta}"

    def update(self, done: int) -> None:
        self.done = int(done)
        now = self.clock()
        finished = self.total is not None and self.done >= self.total
        if self.last is None or finished or now - self.last >= self.every_s:
            self.log.info("%s", self.line())
            self.last, self.logged_done = now, self.done

    def advance(self, n: int = 1) -> None:
        self.update(self.done + n)

    def finish(self) -> None:
        """Log the final count unless it was the last line logged."""
        if self.logged_done != self.done:
            self.log.info("%s", self.line())
            self.last, self.logged_done = self.clock(), self.done


def logged(items: Iterable[T], total: int | None = None, what: str = "documents", every_s: float | None = None) -> Iterator[T]:
    """``items`` unchanged, logging :class:`Progress` as they are consumed (``total``
    defaults to ``len(items)`` when it has one)."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    progress = Progress(total, what, every_s)
    for i, item in enumerate(items, 1):
        yield item
        progress.update(i)
    progress.finish()
