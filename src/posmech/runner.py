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
from collections.abc import Callable
from typing import Any

from posmech.errors import PosmechError

LOG = logging.getLogger("posmech")


def setup_logging(log_path: str | None) -> logging.Logger:
    """Send ``posmech`` log records to ``log_path`` (append) and to stderr."""
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
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
