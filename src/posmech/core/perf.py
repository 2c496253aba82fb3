"""Per-job accounting: forward passes by shape, CPU time and peak memory from the OS.

Every forward engine calls :func:`count_forward` once per forward pass of the whole model
(the TransformerLens bridge through a pre-hook installed by
:func:`posmech.models.loading.load_bridge`, the posmech engine, :class:`posmech.models.lens.Lens`, in its
``__call__``, which the cache runs too).
:func:`posmech.pipeline.runner.run` ends each job with :func:`job_record`: one log line
``PERF {json}`` and the same JSON in ``<log>.perf.json`` beside the rule's log
(docs/performance.md, "Per-job accounting").

* ``cpu_s``: user + system CPU seconds of the job's process and of its waited-for
  children (``resource.getrusage``), the OS's own count, not Snakemake's sampled
  ``benchmark:`` TSV.
* ``peak_rss_mb``: the largest resident set of the process (``ru_maxrss``, MiB) — or of
  a child, if one was larger.
* ``cpu_s_first_forward``: ``cpu_s`` when the first forward pass began (interpreter
  start, imports, model load: the job's fixed cost); ``null`` without forward passes.
* ``forwards``: forward passes by shape ``"{batch}x{n_tokens}"`` (sequences × positions
  per sequence), e.g. ``{"1x1024": 12}``.
* ``libraries``: which of the heavy libraries (:data:`HEAVY_LIBRARIES`) the job had
  imported by its end — on a small model their import is most of a job's cost
  (docs/performance.md), so a job that loads one it does not need shows here.
* ``probe`` (only with ``POSMECH_PERF_PROBE`` set, only in a job that made forward passes and
  finished): the job's own floor, measured in its process right after its work, so that
  its CPU seconds can be set against a bare forward pass timed at the same moment on the
  same (shared, drifting) machine — :func:`probe`.  ``POSMECH_PERF_PROBE`` names a local
  Hugging Face GPT-2 directory (``bench/study.py`` sets it to its stand-in);
  ``POSMECH_PERF_PROBE_ROUNDS`` (default 3) is the number of bare forwards
  (:func:`bare_forward_cpu_s`) of one random sequence of ``min(1024, n_positions)``
  tokens, with the job's own torch thread count.  The record holds ``{"shape": "1x1024",
  "cpu_s_per_pass": median CPU seconds of one pass, "rounds": …, "threads": …,
  "cpu_s_total": the probe's whole cost, model load included}``.  ``cpu_s``,
  ``peak_rss_mb`` and ``wall_s`` are taken *before* the probe and exclude it.  A probe that
  fails logs a warning and records nothing; the job's outcome is unchanged.  Unset (the
  default; production runs), nothing is loaded or timed.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import Counter
from typing import Any

#: forward passes counted in this process, by ``(batch, n_tokens)``
_FORWARDS: Counter[tuple[int, int]] = Counter()
#: prefix of the runner's log line
LINE_PREFIX = "PERF "
#: suffix of the JSON written beside the rule's log
JSON_SUFFIX = ".perf.json"
#: environment variable naming the local model directory of the per-job floor probe
PROBE_ENV = "POSMECH_PERF_PROBE"
#: environment variable: bare forwards the probe times (median taken)
PROBE_ROUNDS_ENV = "POSMECH_PERF_PROBE_ROUNDS"
#: default of ``POSMECH_PERF_PROBE_ROUNDS``
PROBE_ROUNDS = 3
#: positions of the probe's one sequence (fewer if the model's context is shorter)
PROBE_TOKENS = 1024
#: libraries whose import costs ~0.3-3 CPU s each, named in each job's record
HEAVY_LIBRARIES = ("torch", "transformers", "transformer_lens", "pandas", "matplotlib", "scipy",
                   "h5py", "sklearn", "datasets", "tokenizers")


#: CPU seconds of the process (self + children) when its first forward pass began
_FIRST: list[float] = []


def _cpu_s() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def count_forward(batch: int, n_tokens: int) -> None:
    """Record one forward pass over ``batch`` sequences of ``n_tokens`` positions each."""
    if not _FORWARDS:
        _FIRST[:] = [_cpu_s()]
    _FORWARDS[(int(batch), int(n_tokens))] += 1


def forwards() -> dict[str, int]:
    """Forward passes so far, ``{"BxT": count}``, largest shapes first."""
    return {f"{b}x{t}": n for (b, t), n in sorted(_FORWARDS.items(), key=lambda kv: (-kv[0][0] * kv[0][1], kv[0]))}


def forward_passes() -> dict[str, int]:
    """Passes so far in this process, by shape ``"{batch}x{n_tokens}"`` (= :func:`forwards`)."""
    return forwards()


def reset() -> None:
    """Forget the forward passes counted so far (tests, benchmarks)."""
    _FORWARDS.clear()
    _FIRST.clear()


def count_tensor_forward(ids: Any) -> None:
    """:func:`count_forward` for a token tensor/array of shape ``[batch, pos]`` or ``[pos]``;
    anything else (a string the engine tokenizes itself) is counted as one sequence of
    unknown length ``0``."""
    shape = tuple(getattr(ids, "shape", ()))
    if len(shape) >= 2:
        count_forward(shape[0], shape[1])
    elif len(shape) == 1:
        count_forward(1, shape[0])
    else:
        count_forward(len(ids) if isinstance(ids, (list, tuple)) else 1, 0)


def _maxrss_mb(who: int) -> float:
    kb = resource.getrusage(who).ru_maxrss
    return kb / (1024 * 1024) if sys.platform == "darwin" else kb / 1024  # bytes on macOS, KiB on Linux


def job_record(rule: str = "?", wall_s: float | None = None) -> dict[str, Any]:
    """The job's accounting so far: rule, wall, CPU seconds (self + children), peak RSS (MiB)
    and forward passes by shape."""
    return {
        "rule": rule,
        "wall_s": None if wall_s is None else round(wall_s, 3),
        "cpu_s": round(_cpu_s(), 3),
        "cpu_s_first_forward": round(_FIRST[0], 3) if _FIRST else None,
        "peak_rss_mb": round(max(_maxrss_mb(resource.RUSAGE_SELF), _maxrss_mb(resource.RUSAGE_CHILDREN)), 1),
        "forwards": forwards(),
        "libraries": [name for name in HEAVY_LIBRARIES if name in sys.modules],
        "pid": os.getpid(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def load_floor_model(model_dir: str | os.PathLike[str]) -> Any:
    """The Hugging Face causal LM in ``model_dir`` (float32, eval mode) whose body
    :func:`bare_forward_cpu_s` times."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir).eval()


def bare_forward_cpu_s(model: Any, batch: int, n_tokens: int, generator: Any = None, lm_head: bool = False) -> float:
    """CPU seconds (``time.process_time``: this process, all its threads) of one bare forward of
    ``model.transformer`` — a GPT-2 body, no LM head, ``use_cache=False``, under
    ``torch.inference_mode`` — over ``batch`` random sequences of ``n_tokens`` token ids
    (``[batch, n_tokens]``), with whatever thread count torch has.  The floor of
    ``bench/study.py`` and of :func:`probe`.  ``lm_head``: the whole ``model(x)`` with its
    logits instead (the floor issue 15 was written against)."""
    import torch

    x = torch.randint(0, int(model.config.vocab_size), (int(batch), max(int(n_tokens), 1)), generator=generator)
    c0 = time.process_time()
    with torch.inference_mode():
        (model if lm_head else model.transformer)(x, use_cache=False)
    return time.process_time() - c0


def probe(model_dir: str | os.PathLike[str], rounds: int = PROBE_ROUNDS) -> dict[str, Any]:
    """The per-job floor probe: load ``model_dir`` (:func:`load_floor_model`) and time
    ``rounds`` :func:`bare_forward_cpu_s` passes of shape ``1 x min(1024, n_positions)``.
    Returns ``{"shape", "cpu_s_per_pass" (median), "rounds", "threads", "cpu_s_total"}``
    (``cpu_s_total``: the probe's CPU seconds, load included)."""
    import statistics

    import torch

    if rounds < 1:
        raise ValueError(f"{PROBE_ROUNDS_ENV} must be >= 1, got {rounds}")
    c0 = _cpu_s()
    model = load_floor_model(model_dir)
    n_tokens = min(PROBE_TOKENS, int(model.config.n_positions))
    g = torch.Generator().manual_seed(0)
    passes = [bare_forward_cpu_s(model, 1, n_tokens, g) for _ in range(rounds)]
    return {"shape": f"1x{n_tokens}", "cpu_s_per_pass": round(statistics.median(passes), 6), "rounds": rounds,
            "threads": torch.get_num_threads(), "cpu_s_total": round(_cpu_s() - c0, 3)}


def probe_from_env() -> dict[str, Any] | None:
    """:func:`probe` of the model named by ``POSMECH_PERF_PROBE`` with
    ``POSMECH_PERF_PROBE_ROUNDS`` rounds; ``None`` when the variable is unset or empty.
    Raises what the probe raises (the runner turns it into a warning)."""
    model_dir = os.environ.get(PROBE_ENV)
    if not model_dir:
        return None
    return probe(model_dir, int(os.environ.get(PROBE_ROUNDS_ENV) or PROBE_ROUNDS))


def format_line(record: dict[str, Any]) -> str:
    """``PERF {json}`` on one line."""
    return LINE_PREFIX + json.dumps(record, sort_keys=True)


def parse_line(line: str) -> dict[str, Any] | None:
    """The record in a log line written by :func:`format_line` (any prefix before ``PERF``),
    else ``None``."""
    i = line.find(LINE_PREFIX + "{")
    return json.loads(line[i + len(LINE_PREFIX):]) if i >= 0 else None


def read_log(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The last accounting record in a rule's log file (``None`` when it has none)."""
    found = None
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            rec = parse_line(line.rstrip("\n"))
            if rec is not None:
                found = rec
    return found


def write_json(record: dict[str, Any], log_path: str | os.PathLike[str]) -> str:
    """Write ``record`` to ``<log_path>.perf.json``; returns that path."""
    path = os.fspath(log_path) + JSON_SUFFIX
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)
    return path
