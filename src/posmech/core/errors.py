"""The project's one exception type.

Every error a user can cause (bad config, missing file, unreachable hub, corrupt
artifact) is raised as :class:`PosmechError` with a message that names the key or
file and says what to do.  Scripts run by Snakemake print only that message (no
traceback wall) via :func:`posmech.pipeline.runner.run`.
"""

import re
from typing import Any


class PosmechError(RuntimeError):
    """A user-facing error: the message names the key/file and the fix."""


HUB_HINT = (
    "The Hugging Face Hub is unreachable from this machine. Two ways on: run the offline "
    "default with `snakemake --cores 8 --configfile config/demo.yaml`, or point the "
    "entry's `source` at a local copy (a Hugging Face model directory such as "
    "`/data/gpt2`, or for a corpus a dataset directory / .jsonl / .parquet file)."
)


def hub_unreachable(timeout: float = 5.0) -> str | None:
    """Why the Hugging Face Hub cannot be reached from this machine, in words
    (``HF_HUB_OFFLINE`` set, or no TCP connection to the endpoint within ``timeout``
    seconds); ``None`` when it can."""
    import os
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return "HF_HUB_OFFLINE is set"
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as err:
        return f"{host}:{port} is unreachable ({err})"
    return None


def require_hub(what: str, timeout: float = 5.0) -> None:
    """Fail fast, naming the offline alternatives, when the Hugging Face Hub cannot be
    reached (:func:`hub_unreachable`); avoids the Hub client's minute of retries and warnings."""
    why = hub_unreachable(timeout)
    if why is not None:
        raise PosmechError(f"cannot fetch {what}: {why}.\n{HUB_HINT}")


def mean_over(total: Any, count: int, what: str) -> Any:
    """``total / count``; an average over nothing (``count == 0``) is an error naming
    ``what`` was averaged and why there was nothing, never 0.  ``what`` reads like
    "the held-out loss of rule `posembed_averaging` (no document has 2 or more tokens:
    check `posembed_averaging.corpus`)"."""
    if count <= 0:
        raise PosmechError(f"nothing to average for {what}")
    return total / count


#: what Snakemake writes to its log when a signal (Ctrl-C, SIGTERM, scancel) stops a run
_STOPPING = "Will exit after finishing currently running jobs"


def stop_explanation(log_paths: list[str]) -> str | None:
    """What to tell a user whose run ended without success (``onerror``), when Snakemake's
    own last words mislead: a run stopped by a signal after its running jobs finished
    ends with "At least one job did not complete successfully" although no job failed.
    Returns the explanation when the run's log shows a stop by signal and no failed job,
    else None (a real failure: the failing job's log says why)."""
    text = ""
    for p in log_paths:
        try:
            with open(p, encoding="utf-8", errors="replace") as f:
                text += f.read()
        except OSError:
            continue
    if _STOPPING not in text or "Error in rule" in text:
        return None
    return ("posmech: the run was stopped by a signal (Ctrl-C, SIGTERM or scancel) and ended after the "
            "jobs that were running had finished. No job failed: Snakemake's \"At least one job did not "
            "complete successfully\" below means the jobs it did not start. Every finished output is kept; "
            "run the same command again to continue.")


#: errno of a write that hit a resource limit: what each says in messages that carry no errno
#: attribute (HDF5 reports a failed write inside a ValueError or RuntimeError text)
EXHAUSTION = {
    27: ("errno = 27", "File too large", "file too large"),
    28: ("errno = 28", "No space left on device"),
    122: ("errno = 122", "Disk quota exceeded"),
}


def exhaustion(err: BaseException | None) -> tuple[int, BaseException] | None:
    """``(errno, the exception that says so)`` when ``err`` or an exception it was raised
    from or during (``__cause__``/``__context__``) is a write that hit a resource limit:
    27 file-size limit, 28 disk full, 122 disk quota; else None.  Of several, the one with
    an ``errno`` attribute, else the one naming its file, else the first."""
    seen: set[int] = set()
    stack = [err]
    found: list[tuple[int, BaseException]] = []
    while stack:
        e = stack.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        code = getattr(e, "errno", None)
        if code in EXHAUSTION:
            found.append((int(code), e))
        else:
            text = str(e)
            found += [(n, e) for n, words in EXHAUSTION.items() if any(w in text for w in words)][:1]
        stack += [e.__cause__, e.__context__]
    for pick in (lambda e: getattr(e, "errno", None) in EXHAUSTION, lambda e: failed_write_file(e) is not None,
                 lambda e: True):
        for n, e in found:
            if pick(e):
                return n, e
    return None


def failed_write_file(err: BaseException) -> str | None:
    """The file an HDF5 write error names (``filename = '...'`` in its text), or None."""
    m = re.search(r"filename = '([^']+)'", str(err))
    return m.group(1) if m else None
