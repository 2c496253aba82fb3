"""Glue for the thin scripts in ``scripts/``: logging to the rule's log, clean errors.

Usage in a script::

    from posmech.runner import run

    def main(smk, log): ...

    run(snakemake, main)
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from posmech.errors import PosmechError

LOG = logging.getLogger("posmech")
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


def setup_logging(log_path: str | None) -> logging.Logger:
    """Send ``posmech`` log records to ``log_path`` and to stderr; progress lines
    (:class:`Progress`, logger ``posmech.progress``) only to ``log_path``."""
    terminal = logging.StreamHandler(sys.stderr)
    terminal.addFilter(lambda record: not record.name.startswith(PROGRESS_LOG.name))
    handlers: list[logging.Handler] = [terminal]
    if log_path:
        os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
        handlers.append(logging.FileHandler(log_path, mode="w"))
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in handlers:
        h.setFormatter(fmt)
        root.addHandler(h)
    root.setLevel(logging.INFO)
    return LOG


def run(smk: Any, main: Callable[[Any, logging.Logger], None]) -> None:
    """Run ``main(snakemake, logger)``; a :class:`PosmechError` ends the job with its
    message only (written to the log and stderr), exit status 1."""
    log_path = str(smk.log[0]) if len(smk.log) else None
    log = setup_logging(log_path)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    threads = int(getattr(smk, "threads", 1) or 1)
    try:
        import torch

        torch.set_num_threads(max(1, threads))
    except ImportError:  # pragma: no cover
        pass
    t0 = time.perf_counter()
    try:
        main(smk, log)
    except PosmechError as err:
        log.error("rule %s failed: %s", getattr(smk, "rule", "?"), err)
        sys.exit(1)
    log.info("rule %s done in %.1f s", getattr(smk, "rule", "?"), time.perf_counter() - t0)
