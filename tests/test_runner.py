"""The runner names every failure in the rule's log (issue 13, case 13): the error, the
file involved, a likely fix, and the traceback for debugging; never an empty log."""

from __future__ import annotations

import errno
from pathlib import Path
from types import SimpleNamespace

import h5py
import numpy as np
import pytest
import yaml

from posmech.core.errors import PosmechError
from posmech.pipeline.runner import run


class Files(list):
    """Snakemake's named file lists: a list with attribute access."""

    def __init__(self, **named):
        super().__init__(named.values())
        self.__dict__.update(named)


def job(tmp_path: Path, **inputs) -> SimpleNamespace:
    return SimpleNamespace(input=Files(**{k: str(v) for k, v in inputs.items()}),
                           output=Files(out=str(tmp_path / "out.csv")), log=[str(tmp_path / "rule.log")],
                           rule="some_rule", threads=1)


def failing(tmp_path: Path, main, **inputs) -> str:
    smk = job(tmp_path, **inputs)
    with pytest.raises(SystemExit) as info:
        run(smk, main)
    assert info.value.code == 1
    text = Path(smk.log[0]).read_text()
    assert text.strip(), "the rule's log must not be empty"
    return text


def test_missing_hdf5_dataset_names_file_and_fix(tmp_path):
    stats = tmp_path / "acts.h5"
    with h5py.File(stats, "w") as f:
        f["position_stats/ln1_out/count"] = np.ones(3)

    def main(smk, log):
        path = smk.input.acts
        with h5py.File(path, "r") as f:
            f["position_stats/ln1_out/mean"][()]

    text = failing(tmp_path, main, acts=stats)
    assert "rule some_rule failed: KeyError" in text
    assert f"file involved: {stats}" in text
    assert "rerun the rule that writes it" in text
    assert "Traceback (for debugging)" in text and 'f["position_stats/ln1_out/mean"]' in text


def test_disk_full_names_directory(tmp_path):
    target = tmp_path / "out.csv"

    def main(smk, log):
        raise OSError(errno.ENOSPC, "No space left on device", str(target))

    text = failing(tmp_path, main)
    assert f"file involved: {target}" in text and "disk holding" in text and "is full" in text


def test_file_size_limit(tmp_path):
    def main(smk, log):
        raise OSError(errno.EFBIG, "File too large", smk.output.out)

    assert "ulimit -f" in failing(tmp_path, main)


def test_malformed_yaml_input(tmp_path):
    prompt = tmp_path / "prompt.yaml"
    prompt.write_text("prompt: [unclosed\n")

    def main(smk, log):
        with open(smk.input.prompt) as f:
            yaml.safe_load(f)

    text = failing(tmp_path, main, prompt=prompt)
    assert f"file involved: {prompt}" in text and "not valid YAML" in text


def test_unexpected_error_lists_inputs(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": null}\n')

    def main(smk, log):
        text = None
        return text.strip()

    text = failing(tmp_path, main, corpus=corpus)
    assert "AttributeError" in text and str(corpus) in text and "Traceback" in text


def test_posmech_error_has_no_traceback(tmp_path):
    def main(smk, log):
        raise PosmechError("config key `x`: bad")

    text = failing(tmp_path, main)
    assert "config key `x`: bad" in text and "Traceback" not in text


def test_stop_explanation_only_for_a_stop_by_signal_without_failed_jobs(tmp_path):
    from posmech.core.errors import stop_explanation

    stopped = tmp_path / "a.log"
    stopped.write_text("rule x:\nWill exit after finishing currently running jobs (scheduler).\nFinished jobid: 1\n")
    failed = tmp_path / "b.log"
    failed.write_text(stopped.read_text() + "Error in rule y:\n    jobid: 2\n")
    plain = tmp_path / "c.log"
    plain.write_text("Error in rule y:\n")
    assert "No job failed" in stop_explanation([str(stopped)])
    assert stop_explanation([str(failed)]) is None
    assert stop_explanation([str(plain)]) is None
    assert stop_explanation([str(tmp_path / "missing.log")]) is None


LIGHT_JOB = """
import sys
from types import SimpleNamespace
from posmech.pipeline.runner import run

def main(smk, log):
    print("torch loaded by the runner:", "torch" in sys.modules)
    import torch
    print("torch threads:", torch.get_num_threads())

run(SimpleNamespace(input=[], output=[], log=[sys.argv[1]], rule="light", threads=int(sys.argv[2])), main)
"""


@pytest.mark.parametrize("threads", [1, 2])
def test_a_job_does_not_import_torch_and_a_model_job_gets_the_rules_threads(tmp_path, threads):
    """Most rules never run a model: the runner must not make them import torch (~3 CPU s per
    job, most of a light job's cost); a job that does import it gets the rule's ``threads``,
    whatever OMP_NUM_THREADS the environment had."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "7"}
    out = subprocess.run([sys.executable, "-c", LIGHT_JOB, str(tmp_path / "rule.log"), str(threads)], env=env,
                         capture_output=True, text=True, check=True).stdout
    assert "torch loaded by the runner: False" in out
    assert f"torch threads: {threads}" in out
    import json

    record = json.loads((tmp_path / "rule.log.perf.json").read_text())
    assert "torch" in record["libraries"] and "matplotlib" not in record["libraries"], record


FINISHED_JOB = """
import atexit, sys
from posmech.pipeline.runner import run

class Snakemake:  # the shape and the name of the object Snakemake hands a rule's script
    def __init__(self, log, out):
        self.input, self.output, self.log, self.rule, self.threads = [], [out], [log], "finished", 1

Snakemake.__module__ = sys.argv[3]

def main(smk, log):
    atexit.register(lambda: open(smk.output[0] + ".atexit", "w").close())
    with open(smk.output[0], "w") as f:
        f.write("written")
    log.info("main finished")
    print("printed by main", end="")  # a line left in stdout's buffer

run(Snakemake(sys.argv[1], sys.argv[2]), main)
print("after run")
"""


@pytest.mark.parametrize("module, clean", [("snakemake.iocontainers", ""), ("snakemake.iocontainers", "1"), ("tests", "")])
def test_a_finished_snakemake_job_leaves_at_once_with_its_logs_and_outputs(tmp_path, module, clean):
    """runner.leave: a finished job of a rule's script (Snakemake's object) ends through
    ``os._exit(0)`` after the logs and streams are flushed: the interpreter's shutdown (the
    atexit handlers, freeing every module) is skipped, exit status 0, the output, the log's last
    line, the PERF record and what main printed all there. POSMECH_CLEAN_EXIT=1, or an object
    that is not Snakemake's (a test's), goes on to the normal shutdown."""
    import os
    import subprocess
    import sys

    log, out = tmp_path / "rule.log", tmp_path / "out.txt"
    env = {**os.environ, "POSMECH_CLEAN_EXIT": clean}
    done = subprocess.run([sys.executable, "-c", FINISHED_JOB, str(log), str(out), module], env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert out.read_text() == "written"
    assert "main finished" in log.read_text() and "rule finished done in" in log.read_text()
    assert (tmp_path / "rule.log.perf.json").exists()
    assert done.stdout.startswith("printed by main")
    leaves = module.startswith("snakemake.") and not clean
    assert (tmp_path / "out.txt.atexit").exists() is not leaves
    assert ("after run" in done.stdout) is not leaves


def test_a_jobs_settings_param_reaches_its_script_typed():
    """A rule passes ``SETTINGS.<section>.as_param()`` (a plain dict, recorded by Snakemake);
    the script sees the typed settings; a settings object itself is refused (unrecorded)."""
    from types import SimpleNamespace

    from posmech.pipeline.runner import Names, typed_params, typed_view
    from posmech.settings import defaults
    from posmech.settings.kernels import KernelsSettings

    k = defaults("kernels", k0=3, etc_positions=[5, 9])
    param = k.as_param()
    assert type(param) is dict and param["k0"] == 3 and param["etc_positions"] == [5, 9]
    smk = SimpleNamespace(params=Names({"settings": param, "entry": {"device": "cpu"}}), rule="kernels")
    view = typed_view(smk)
    assert isinstance(view.params.settings, KernelsSettings) and view.params.settings == k
    assert view.params["entry"] == {"device": "cpu"} and view.rule == "kernels"
    plain = SimpleNamespace(params=Names({"n": 3}))
    assert typed_view(plain) is plain  # a job without settings is left as it is
    with pytest.raises(PosmechError, match="'settings' is a KernelsSettings object, which Snakemake does not record"):
        typed_params(Names({"settings": k}))


def test_a_sweep_point_loads_each_script_from_its_path_not_a_same_named_module(monkeypatch):
    """A figureless model's point runs rule `tokenize`'s script; `importlib.import_module` would
    return the standard library's `tokenize` (imported already, its `main` takes no arguments).
    posmech.pipeline.runner.script_modules loads scripts/<name>.py by its path, from the
    directory of sys.path (appended, as Snakemake does) that holds it beside sweep_point.py."""
    import sys
    import tokenize as stdlib_tokenize
    from pathlib import Path

    from posmech.pipeline.runner import script_modules

    scripts = Path(__file__).resolve().parents[1] / "scripts"
    monkeypatch.setattr(sys, "path", [*sys.path, str(scripts)])
    load = script_modules()
    mod = load("tokenize")
    assert Path(mod.__file__) == scripts / "tokenize.py" and mod is not stdlib_tokenize
    assert mod.main.__code__.co_argcount == 2 and load("tokenize") is mod
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(scripts)])
    with pytest.raises(PosmechError, match="fetch_model.py beside sweep_point.py"):
        script_modules()("fetch_model")
