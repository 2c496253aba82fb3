"""bench/study.py's accounting: a family or sweep job's fixed cost belongs to its first analysis,
and a twin's rows are told from its model's (the twin's extrapolation scales them by the twin's
own sizes)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _study():
    spec = importlib.util.spec_from_file_location("bench_study", REPO / "bench/study.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_jobs_fixed_cost_is_its_first_analysiss_and_twin_rows_are_told_apart():
    study = _study()
    rec = {"log": "sweep/gpt2-twin.log.perf.json", "cpu_s": 20.0, "cpu_s_first_forward": 6.0, "peak_rss_mb": 1,
           "analyses": [{"analysis": "build_twin", "cpu_s": 4.0, "wall_s": 4.0, "forwards": {}},
                        {"analysis": "attention_statistics", "cpu_s": 3.0, "wall_s": 3.0, "forwards": {"1x1024": 2}},
                        {"analysis": "cache_activations", "cpu_s": 13.0, "wall_s": 13.0, "forwards": {"1x1024": 5}}]}
    rows = study.per_analysis(rec)
    # the job's 6 CPU s before its first pass: the first analysis's (at most its own CPU), none of the others'
    assert [r["cpu_s_first_forward"] for r in rows] == [4.0, 0.0, 0.0]
    assert [r["job_cpu_s"] for r in rows] == [20.0] * 3
    assert all(study.is_twin(r) for r in rows)
    model = study.per_analysis({**rec, "log": "taxonomy/gpt2.log.perf.json"})
    assert not any(study.is_twin(r) for r in model)
    assert not study.is_twin({"log": "tokenize/gpt2/webtext.log.perf.json"})
