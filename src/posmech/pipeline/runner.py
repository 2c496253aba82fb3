"""Glue for the thin scripts in ``scripts/``: logging to the rule's log, clean errors.

Usage in a script::

    from posmech.pipeline.runner import run

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

from posmech.core.errors import PosmechError, exhaustion, failed_write_file
from posmech.core.families import SEP  # an analysis's name from its own key in a family rule's names
from posmech.core.progress import PROGRESS_LOG

LOG = logging.getLogger("posmech")


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


def _job_files(smk: Any) -> list[str]:
    """The job's input and output paths, and its string params that name existing files."""
    out: list[str] = []
    for attr in ("input", "output"):
        for v in getattr(smk, attr, []) or []:
            out.append(str(v))
    return out


def _path_like(v: Any) -> str | None:
    if isinstance(v, (str, os.PathLike)) and not isinstance(v, bytes):
        s = os.fspath(v)
        return s if s and len(s) < 4096 and "\n" not in s else None
    return None


def _file_name(v: Any) -> str | None:
    """A path held by ``v``: a path itself, an open file's ``name``, an h5py object's file."""
    s = _path_like(v)
    if s is not None:
        return s
    try:
        if hasattr(v, "read") or hasattr(v, "write"):
            return _path_like(getattr(v, "name", None))
        import h5py

        # an object of a closed file has an invalid id (asking it for its file can crash
        # HDF5); those of a file whose write failed can crash even with a valid id, so
        # :func:`run` does not look at the frames after a failed write
        if isinstance(v, h5py.HLObject) and v.id.valid:
            return _path_like(v.file.filename)
    except (ValueError, OSError, RuntimeError, ImportError):  # a closed h5py object
        return None
    return None


def involved_file(err: BaseException, job_files: list[str]) -> str | None:
    """The file a failure is about: an ``OSError``'s own ``filename``; else the innermost
    traceback frame holding a path (a local variable or argument) that is one of the job's
    files (or lies below one of the job's directories); else ``None``."""
    for e in (err, err.__cause__, err.__context__):
        name = getattr(e, "filename", None)
        if isinstance(e, OSError) and name:
            return os.fspath(name)
    known = {os.path.abspath(p): p for p in job_files}
    tb = err.__traceback__
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    mark = getattr(err, "problem_mark", None)  # a YAML error knows its file
    values: list[Any] = [getattr(mark, "name", None)]
    for frame in reversed(frames):
        values += list(frame.f_locals.values())
    for v in values:
        s = _file_name(v)
        if s is None:
            continue
        a = os.path.abspath(s)
        if a in known:
            return known[a]
        if any(a.startswith(k.rstrip("/") + "/") for k in known if os.path.isdir(k)):
            return s
    return None


def likely_fix(err: BaseException, path: str | None, rule: str) -> str:
    """A one-line suggestion for an error that is not a :class:`PosmechError`."""
    where = repr(path) if path else "the job's files"
    found = exhaustion(err)
    errno_ = found[0] if found else getattr(err, "errno", None)
    text = f"{type(err).__name__}: {err}"
    if errno_ == 28:
        d = os.path.dirname(os.path.abspath(path)) if path else "."
        return (f"the disk holding {d!r} is full (errno 28): free space (`df -h {d}`) and rerun; "
                "nothing finished was overwritten")
    if errno_ == 27:
        return (f"the file-size limit was reached writing {where} (errno 27): raise the limit (`ulimit -f unlimited`) "
                "and rerun; nothing finished was overwritten")
    if errno_ == 122:
        return f"the disk quota was reached writing {where} (errno 122): free space in your quota and rerun"
    if errno_ in (13, 30):
        return f"no permission to write {where} (read-only file system or directory): fix the permissions and rerun"
    if errno_ == 2:
        return f"{where} does not exist: run the workflow target that makes it, or fix the path in the config"
    if isinstance(err, MemoryError):
        return "out of memory: lower the section's `batch_size` / `n_documents`, or give the job more memory (mem_mb)"
    if "safetensor" in text.lower() or (path or "").endswith(".safetensors"):
        return (f"the model weights {where} are corrupt or truncated: delete the model directory and rerun "
                "(`snakemake --forcerun fetch_model` or `train_demo_model`), or replace the local copy")
    if isinstance(err, KeyError) and ("object" in text or "doesn't exist" in text or "Unable to" in text):
        return (f"{where} lacks a dataset or attribute this rule reads (written by another version, or "
                f"edited): rerun the rule that writes it (`snakemake --forcerun <that rule>`)")
    if type(err).__module__.startswith("yaml"):
        return f"{where} is not valid YAML: fix the line named above"
    if "checksum" in text or "filter returned failure" in text:
        return (f"{where} fails its checksum: its bytes changed after it was written (disk or copy error); "
                "delete it and rerun the rule that writes it (`snakemake --forcerun <that rule>`)")
    if (path or "").endswith(".h5") or "h5py" in type(err).__module__:
        return (f"{where} is not a readable HDF5 file (corrupt or truncated): rerun the rule that writes it "
                "(`snakemake --forcerun <that rule>`)")
    return (f"unexpected error in rule `{rule}` (an input the checks did not catch, or a bug): look at "
            f"{where} and the traceback below; report it with this log if the input looks right")


def _traceback_only_to_file(log_path: str | None, text: str) -> None:
    """The traceback goes into the log file (for debugging), not to the terminal."""
    if not log_path:
        return
    try:
        with open(log_path, "a", encoding="utf-8") as f:
            f.write(text)
    except OSError:  # disk full: the one-line error above is what survives
        pass


def _account(rule: str, log_path: str | None, wall_s: float, probe: bool = False,
             analyses: list[dict[str, Any]] | None = None) -> None:
    """Log the job's :func:`posmech.core.perf.job_record` (and write it beside the log).  With
    ``probe`` (the job finished) and ``POSMECH_PERF_PROBE`` set, a job that made forward
    passes adds its floor probe (:func:`posmech.core.perf.probe_from_env`), timed after the
    record was taken so that the record's CPU, wall and peak RSS exclude it; a failing
    probe is a warning, never the job's failure."""
    from posmech.core import perf

    record = perf.job_record(rule, wall_s)
    if analyses is not None:
        record["analyses"] = analyses
    if probe and record["forwards"] and os.environ.get(perf.PROBE_ENV):
        try:
            found = perf.probe_from_env()
        except Exception as err:  # noqa: BLE001 - a benchmark's extra must not fail the job
            LOG.warning("floor probe (%s=%s) failed, no probe recorded: %s: %s",
                        perf.PROBE_ENV, os.environ.get(perf.PROBE_ENV), type(err).__name__, err)
        else:
            if found is not None:
                record["probe"] = found
    LOG.info("%s", perf.format_line(record))
    if log_path:
        try:
            perf.write_json(record, log_path)
        except OSError as err:  # disk full: the log line is what survives
            LOG.warning("could not write %s: %s", log_path + perf.JSON_SUFFIX, err)


def set_threads(threads: int) -> None:
    """Make PyTorch use the rule's ``threads``. Without importing it: a job that never runs a
    model (most light rules) would pay ~3 CPU s for ``import torch`` alone. When torch is not
    loaded yet, ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` are set, which it reads when it is;
    when it is, :func:`torch.set_num_threads` is called."""
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)
    else:
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(threads)


def typed_params(params: Any) -> Names:
    """A job's params, each settings param (:meth:`posmech.settings.Settings.as_param`: a
    plain dict, which Snakemake records) as its typed settings object. A settings object
    in the params is a workflow bug: Snakemake does not record it, so a changed section
    would not rerun the job."""
    from posmech.settings import Settings, from_param, is_param

    named = _named(params)
    for key, value in named.items():
        if isinstance(value, Settings):
            raise PosmechError(f"param {key!r} is a {type(value).__name__} object, which Snakemake does not record "
                               "(a changed config section would not rerun the job): pass `.as_param()` (workflow bug)")
    return Names({k: from_param(v) if is_param(v) else v for k, v in named.items()})


class _TypedView:
    """A Snakemake job object with its params typed (:func:`typed_params`); every other
    attribute is the job's own."""

    def __init__(self, smk: Any, params: Names) -> None:
        self._smk, self.params = smk, params

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_smk"], name)


def typed_view(smk: Any) -> Any:
    """``smk`` with its settings params typed (:func:`typed_params`); ``smk`` itself when it
    has none."""
    from posmech.settings import Settings, is_param

    values = list(_named(getattr(smk, "params", None)).values())
    if not any(is_param(v) or isinstance(v, Settings) for v in values):
        return smk
    return _TypedView(smk, typed_params(smk.params))


def run(smk: Any, main: Callable[[Any, logging.Logger], None]) -> None:
    """Run ``main(snakemake, logger)``.  A :class:`PosmechError` ends the job with its
    message only (written to the log and stderr), exit status 1.  Any other exception
    is logged too, never left to a bare traceback on stderr with an empty log: the
    rule, the error, the file involved (:func:`involved_file`) and a likely fix
    (:func:`likely_fix`), then the full traceback (in the log file only); exit status 1.
    A declared analysis (:func:`_isolated`) is the exception: its failure is written as
    failure records in place of its outputs and the job ends normally
    (:func:`_run_analyses`, :mod:`posmech.core.failures`), so the other models' findings
    and the report are still made.

    At the end of every job, failed or not, one line ``PERF {json}`` goes to the log with
    the job's CPU seconds, peak RSS and forward passes by shape, and the same JSON to
    ``<log>.perf.json`` (:mod:`posmech.core.perf`; docs/performance.md); with
    ``POSMECH_PERF_PROBE`` set, a finished job that made forward passes adds its own floor
    probe to that record (:func:`posmech.core.perf.probe`)."""
    log_path = str(smk.log[0]) if len(smk.log) else None
    log = setup_logging(log_path)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    set_threads(max(1, int(getattr(smk, "threads", 1) or 1)))
    t0 = time.perf_counter()
    rule = getattr(smk, "rule", "?")
    _CURRENT.clear()  # a family's analysis that failed stays named until the next job
    finished = False
    analyses: list[dict[str, Any]] | None = getattr(main, "analyses", None)
    if analyses is None and _isolated(rule):  # an analysis with a job of its own: isolated as in a family
        one = main

        def main(smk: Any, log: logging.Logger) -> None:
            _run_analyses(smk, [(one, {})], log, [], family=False)
    try:
        try:
            main(typed_view(smk), log)
            finished = True
        finally:
            _account(rule, log_path, time.perf_counter() - t0, probe=finished, analyses=analyses)
    except PosmechError as err:
        rule = _CURRENT[-1] if _CURRENT else rule
        log.error("rule %s failed: %s", rule, err)
        sys.exit(1)
    except Exception as err:  # noqa: BLE001 - every failure is named in the log
        import traceback

        rule = _CURRENT[-1] if _CURRENT else rule
        found = exhaustion(err)
        cause = found[1] if found else err  # a full disk: its own error, not what closing the file said
        # after a failed write, HDF5 objects left in the traceback's frames can crash (SIGSEGV) when
        # asked for their file: the failed write names its file itself
        path = ((getattr(cause, "filename", None) or failed_write_file(cause)) if found
                else involved_file(err, _job_files(smk)))
        log.error(
            "rule %s failed: %s: %s\n  file involved: %s\n  likely fix: %s\n  (traceback in %s)",
            rule, type(cause).__name__, cause, path or "(none identified; inputs: "
            + ", ".join(map(str, getattr(smk, "input", []) or [])) + ")",
            likely_fix(err, path, rule), log_path or "stderr",
        )
        tb = "Traceback (for debugging):\n" + "".join(traceback.format_exception(err))
        if log_path:
            _traceback_only_to_file(log_path, tb)
        else:
            sys.stderr.write(tb)
        sys.exit(1)
    log.info("rule %s done in %.1f s", rule, time.perf_counter() - t0)
    leave(smk)


#: set (to anything but empty or 0) to end a finished job through the interpreter's normal shutdown
#: instead of :func:`leave`'s immediate exit (a profiler or coverage tool that writes its data at exit)
CLEAN_EXIT_ENV = "POSMECH_CLEAN_EXIT"


def leave(smk: Any) -> None:
    """End a finished Snakemake job's process now (``os._exit(0)``), after flushing the logs
    and the standard streams: the interpreter's shutdown — freeing every module, torch's
    included — costs ~0.8 CPU s a job here and has nothing left to do; every output is
    written and closed by then (HDF5 files in ``with`` blocks or closed explicitly, figures
    saved and closed, tables written through atomic renames).  Only in a real Snakemake
    job (the ``snakemake.iocontainers.Snakemake`` object a rule's script gets): a test that calls
    :func:`run` goes on, and so does any job with ``POSMECH_CLEAN_EXIT`` set."""
    cls = type(smk)
    if cls.__name__ != "Snakemake" or not cls.__module__.startswith("snakemake."):
        return
    if os.environ.get(CLEAN_EXIT_ENV, "") not in ("", "0"):
        return
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)


#: the analysis of a family job now running (its name in the error line of :func:`run`;
#: left in place when it fails, cleared when the next job starts)
_CURRENT: list[str] = []


class Names(list):  # type: ignore[type-arg]
    """Values in order, each also reachable by its name as an attribute or a key: the
    shape of Snakemake's ``snakemake.input``/``output``/``params`` that scripts read."""

    def __init__(self, named: dict[str, Any]) -> None:
        super().__init__(named.values())
        self._named = dict(named)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_named"][name]
        except KeyError:
            raise AttributeError(name) from None

    def __getitem__(self, key: Any) -> Any:  # type: ignore[override]
        return self._named[key] if isinstance(key, str) else super().__getitem__(key)

    def items(self) -> Any:
        return self._named.items()

    def keys(self) -> Any:
        return self._named.keys()

    def get(self, key: str, default: Any = None) -> Any:
        return self._named.get(key, default)


def _named(values: Any) -> dict[str, Any]:
    return dict(values.items()) if hasattr(values, "items") else {}


def _part(named: dict[str, Any], analysis: str, shared: bool) -> dict[str, Any]:
    """The entries of a family rule's ``named`` that ``analysis`` sees: those named
    ``<analysis>__<key>`` as ``key``, and (``shared``) every unprefixed one."""
    own = {k[len(analysis) + len(SEP):]: v for k, v in named.items() if k.startswith(analysis + SEP)}
    common = {k: v for k, v in named.items() if SEP not in k} if shared else {}
    return {**common, **own}


def analysis_view(smk: Any, analysis: str, links: dict[str, str] | None = None) -> Any:
    """One analysis's view of its family's job, shaped like its own Snakemake job.

    A family rule names each output ``<analysis>__<key>`` (the analysis sees ``key``), and
    may name an input or param that way too; unprefixed inputs and params are seen by
    every analysis of the family.  ``links`` maps an input name of the analysis to the
    family rule's output (or input) key it reads: an output of an analysis run before it
    in the same job."""
    inputs, outputs, params = _named(smk.input), _named(smk.output), _named(smk.params)
    seen = _part(inputs, analysis, True)
    for name, key in (links or {}).items():
        if key not in outputs and key not in inputs:
            raise PosmechError(f"analysis {analysis}: its input {name!r} links to {key!r}, which is neither an "
                               f"output nor an input of rule {getattr(smk, 'rule', '?')} (workflow bug)")
        seen[name] = outputs.get(key, inputs.get(key))
    own_outputs = _part(outputs, analysis, False)
    if not own_outputs:
        raise PosmechError(f"rule {getattr(smk, 'rule', '?')} has no output named `{analysis}{SEP}<key>` "
                           f"for its analysis {analysis} (workflow bug)")
    from types import SimpleNamespace

    return SimpleNamespace(
        input=Names(seen), output=Names(own_outputs), params=Names(_part(params, analysis, True)),
        wildcards=smk.wildcards, log=smk.log, threads=getattr(smk, "threads", 1),
        resources=getattr(smk, "resources", None), config=getattr(smk, "config", {}), rule=analysis,
    )


Analysis = tuple[Callable[[Any, logging.Logger], None], dict[str, str]]


def script_modules(anchor: str = "sweep_point.py") -> Callable[[str], Any]:
    """A ``load`` for :func:`run_sweep_point`: ``name`` -> the module of ``scripts/<name>.py``,
    read from its path: the first entry of ``sys.path`` holding both ``<name>.py`` and
    ``anchor`` (Snakemake appends the rule's script's directory; its source cache holds a copy of
    ``anchor`` alone). Not :func:`importlib.import_module`: a script's name can be a
    standard-library module's (``tokenize``), which is imported already and would be returned."""
    import importlib.util

    def load(name: str) -> Any:
        key = f"posmech_scripts.{name}"
        if key not in sys.modules:
            where = next((p for p in sys.path if os.path.isfile(os.path.join(p or ".", anchor))
                          and os.path.isfile(os.path.join(p or ".", f"{name}.py"))), None)
            spec = (importlib.util.spec_from_file_location(key, os.path.join(where or ".", f"{name}.py"))
                    if where is not None else None)
            if spec is None or spec.loader is None:
                raise PosmechError(f"no directory of sys.path holds the script {name}.py beside {anchor}: run the "
                                   "sweep point's script as the workflow does (Snakemake puts the scripts' "
                                   "directory on the path; workflow bug)")
            module = importlib.util.module_from_spec(spec)
            sys.modules[key] = module
            spec.loader.exec_module(module)
        return sys.modules[key]

    return load


def family_analyses(rule: str, load: Callable[[str], Any]) -> list[Analysis]:
    """The analyses ``(main, links)`` of rule ``rule``, in order: a family's
    (:data:`posmech.core.families.FAMILIES`, links :data:`posmech.core.families.LINKS`), each the
    ``main`` of the module ``load(<analysis>)``, or, for any other rule, ``load(<rule>).main``.
    The job's script passes :func:`importlib.import_module`: a rule's script runs with
    ``scripts/`` on its path, so each analysis's script ``scripts/<analysis>.py`` is its
    neighbour (the package never imports a script)."""
    from posmech.core.families import FAMILIES, LINKS

    return [(load(name).main, LINKS.get(name, {})) for name in FAMILIES.get(rule, (rule,))]


def _isolated(rule: str) -> bool:
    """Whether a failure of ``rule``'s analysis is isolated (:mod:`posmech.core.failures`):
    a declared analysis (workflow/analyses/), not a model, corpus or report rule. Set
    ``POSMECH_FAIL_FAST`` (to anything but empty or 0) to end the job at the first error."""
    from posmech.core.families import ANALYSES

    return rule in ANALYSES and os.environ.get(FAIL_FAST_ENV, "") in ("", "0")


#: set to end an analysis's job at its first error instead of writing failure records
FAIL_FAST_ENV = "POSMECH_FAIL_FAST"


def user_error(err: BaseException) -> bool:
    """A :class:`PosmechError` naming a config key (``config key `…```): the user's to fix, so
    it ends the job and the run as before, never recorded as a model's failure."""
    return isinstance(err, PosmechError) and "config key `" in str(err)


def damaged_input(err: BaseException) -> bool:
    """An input whose bytes changed after it was written (an HDF5 checksum or filter failure):
    the run's data, not the model, is at fault, so it ends the job (its log names the file and
    the rule to rerun, :func:`likely_fix`) rather than being recorded as a model's failure."""
    text = str(err)
    return "checksum" in text or "filter returned failure" in text


def _fail(view: Any, name: str, error: str, log_path: str | None, log: logging.Logger) -> int:
    """Write a failure record (:func:`posmech.core.failures.write_failure`) at each output
    of ``view`` that does not exist; how many."""
    from posmech.core.failures import write_failure

    model = getattr(getattr(view, "wildcards", None), "model", None) if hasattr(view, "wildcards") else None
    rec = {"analysis": name, "model": model, "error": error, "log": log_path}
    n = 0
    for out in view.output:
        if isinstance(out, (str, os.PathLike)) and not os.path.exists(out):
            write_failure(out, rec)
            n += 1
    log.warning("analysis %s: %d output(s) written as failure records (posmech.core.failures): its findings "
                "are not measurable, with this log's path", name, n)
    return n


def _run_analyses(smk: Any, analyses: list[Analysis], log: logging.Logger, record: list[dict[str, Any]],
                  family: bool = True) -> None:
    """Run ``analyses`` in order on their views. An analysis whose input is a failure record
    does not run, and one that raises (a declared analysis, :func:`_isolated`) does not end
    the job: its outputs not written become failure records (:func:`_fail`, the error and
    traceback in the log), what the others wrote stays. Not isolated: an error naming a
    config key (:func:`user_error`), a full disk or exhausted memory."""
    from posmech.core import perf
    from posmech.core.failures import failed_paths, words

    log_path = str(smk.log[0]) if len(getattr(smk, "log", []) or []) else None
    for i, (fn, links) in enumerate(analyses, 1):
        name = fn.__module__.rsplit(".", 1)[-1] if family else str(getattr(smk, "rule", "?"))
        view = analysis_view(smk, name, links) if family else smk
        if not any(v is not None for v in view.output):  # only figures, and none wanted (a sweep point)
            log.info("analysis %s (rule %s, %d/%d): skipped, it makes figures only and this job draws none",
                     name, getattr(smk, "rule", "?"), i, len(analyses))
            continue
        isolate = _isolated(name)
        failed_in = failed_paths(view.input) if isolate else {}
        if failed_in:
            path, rec = next(iter(failed_in.items()))
            log.error("analysis %s not run: its input %s is a failure record (%s)", name, path, words(rec))
            _fail(view, name, f"its input {path} failed ({words(rec)})", rec.get("log") or log_path, log)
            record.append({"analysis": name, "failed": "input"})
            continue
        log.info("analysis %s (rule %s, %d/%d)", name, getattr(smk, "rule", "?"), i, len(analyses))
        c0, t0, f0 = perf._cpu_s(), time.perf_counter(), perf.forwards()
        _CURRENT.append(f"{getattr(smk, 'rule', '?')} (analysis {name})")
        try:
            fn(view, log)
        except Exception as err:  # noqa: BLE001 - isolated: recorded in place of its outputs
            if not isolate or exhaustion(err) or user_error(err) or damaged_input(err):  # ends the job, and the run
                raise
            import traceback

            _CURRENT.pop()
            log.error("analysis %s failed on this model: %s: %s", name, type(err).__name__, err)
            for h in logging.getLogger().handlers:  # the traceback into the log file only, in its place
                if isinstance(h, logging.FileHandler) and h.stream is not None:
                    h.stream.write("Traceback (for debugging):\n" + "".join(traceback.format_exception(err)))
                    h.flush()
            _fail(view, name, f"{type(err).__name__}: {err}", log_path, log)
            record.append({"analysis": name, "failed": f"{type(err).__name__}: {err}"})
            continue
        _CURRENT.pop()
        cpu, wall = perf._cpu_s() - c0, time.perf_counter() - t0
        made = {k: n - f0.get(k, 0) for k, n in perf.forwards().items() if n > f0.get(k, 0)}
        record.append({"analysis": name, "cpu_s": round(cpu, 3), "wall_s": round(wall, 3), "forwards": made})
        log.info("analysis %s done: %.1f CPU s, %.1f s", name, cpu, wall)


def run_family(smk: Any, analyses: list[Analysis] | str, load: Callable[[str], Any] | None = None) -> None:
    """Run an analysis family's job: every analysis ``(main, links)`` in order (or those of
    the family named, :func:`family_analyses` with ``load``), each on its :func:`analysis_view` (its name:
    the module of its ``main``, the script ``scripts/<analysis>.py``), in one process, so
    the family pays one interpreter, one set of imports and one Snakemake job per model
    instead of one per analysis.  The log says where each analysis starts and what it
    cost; the job's ``PERF`` record lists each analysis's CPU and wall seconds and forward
    passes by shape (``analyses``)."""
    if isinstance(analyses, str):
        if load is None:
            raise PosmechError(f"run_family({analyses!r}): pass load=importlib.import_module (workflow bug)")
        analyses = family_analyses(analyses, load)

    def main(smk: Any, log: logging.Logger) -> None:
        _run_analyses(smk, analyses, log, record)

    record: list[dict[str, Any]] = []
    main.analyses = record  # type: ignore[attr-defined]
    run(smk, main)


def run_sweep_point(smk: Any, load: Callable[[str], Any]) -> None:
    """Run a dynamics sweep point's job (rule ``sweep_<model>``, workflow/rules/dynamics.smk):
    for one checkpoint, the rules the sweep follows, in data-flow order, in one process:
    each part of ``smk.params.parts`` (``rule``, ``wildcards``, ``input``, ``output``,
    ``params``: that rule's job for the checkpoint as Snakemake would run it, its figures
    ``None``) gets a view shaped like its own job, and its analyses run on it as in
    :func:`run_family`; an analysis whose outputs are all figures is skipped, and the
    others draw nothing (:func:`posmech.plots.save` with no path).  One interpreter and
    one set of imports per checkpoint instead of one per followed rule. A part with a
    ``documents_fraction`` (a random-init twin's, :class:`posmech.pipeline.sweep.SweepPoints`)
    reads that fraction of each tokens file's documents
    (:func:`posmech.data.tokens.documents_fraction`); one marked ``claims_only`` (a twin's,
    config ``twins.claims_only``) computes only what its claims read
    (:func:`posmech.core.null.claims_only`). ``load``: as for :func:`family_analyses`."""
    from types import SimpleNamespace

    from posmech.core.families import FAMILIES
    from posmech.core.null import claims_only
    from posmech.data.tokens import documents_fraction

    def main(smk: Any, log: logging.Logger) -> None:
        for part in smk.params.parts:
            rule = part["rule"]
            view = SimpleNamespace(
                input=Names(part["input"]), output=Names(part["output"]), params=typed_params(part["params"]),
                wildcards=Names(part["wildcards"]), log=smk.log, threads=getattr(smk, "threads", 1),
                resources=getattr(smk, "resources", None), config=getattr(smk, "config", {}), rule=rule,
            )
            fraction = part.get("documents_fraction")
            log.info("rule %s of the sweep point %s%s", rule, dict(part["wildcards"]),
                     "" if fraction is None else f", {fraction:g} of the documents (twins.documents_fraction)")
            with documents_fraction(fraction), claims_only(bool(part.get("claims_only"))):
                _run_analyses(view, family_analyses(rule, load), log, record, family=rule in FAMILIES)

    record: list[dict[str, Any]] = []
    main.analyses = record  # type: ignore[attr-defined]
    run(smk, main)
