"""Context-scaled positions are resolved once (issue 48, item 2): posmech.settings.positions_for
scales a section's null positions to a model's context and checks them; preflight collects its
messages, a job calls it once and records the result, a reader takes the recorded values."""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from posmech.core.config import load_schema, schema_keys, validate_config
from posmech.settings import PositionError, defaults, from_param, null_gives, positions_for

REPO = Path(__file__).resolve().parents[1]
SCHEMA = load_schema(REPO / "workflow" / "schemas" / "config.schema.yaml")


def test_a_null_key_is_resolved_for_the_context_and_a_given_one_kept():
    k = defaults("kernels")  # every query position null
    at32, at1024 = positions_for(k, 32, "m"), positions_for(k, 1024, "m")
    assert (at32.heatmap_max_position, at32.etc_positions, at32.etc_heatmap_position) == (31, (3, 6, 12, 19, 25, 31), 31)
    assert (at1024.heatmap_max_position, at1024.etc_positions, at1024.etc_heatmap_position) == (
        100, (100, 200, 400, 600, 800, 1000), 1000)  # the post's, at GPT-2's context
    given = k.replace(etc_positions=[8, 16], etc_heatmap_position=16)
    assert positions_for(given, 1024, "m").etc_positions == (8, 16)
    # a resolved section resolves to itself: what a job records is what a reader gets back
    assert positions_for(at32, 32, "m") == at32
    n = defaults("neurons")
    assert (positions_for(n, 32, "m").from_position, positions_for(n, 1024, "m").from_position) == (3, 100)


def test_an_impossible_position_names_the_key_and_what_fits():
    k = defaults("kernels", etc_positions=[16, 40], etc_heatmap_position=16)
    with pytest.raises(PositionError) as info:
        positions_for(k, 32, "demo", "models.demo.n_ctx")
    assert len(info.value.problems) == 1
    msg = info.value.problems[0]
    assert msg.startswith("config key `kernels.etc_positions`: model 'demo' has a context of 32 tokens "
                          "(from models.demo.n_ctx): positions [40] are beyond it")
    assert "set kernels.etc_positions to values <= 31, e.g. [3, 6, 12, 19, 25, 31]" in msg
    # the rule in the hint is the schema's words, not a restatement
    rule = schema_keys(SCHEMA)["kernels.etc_positions"]["x-scales-with-context"]
    assert f"(null gives {' '.join(rule.split())})" in msg and null_gives("kernels", "etc_positions") in msg
    with pytest.raises(PositionError, match=r"`neurons.from_position`.*set it to at most 29, e.g. 3 \(null gives "
                                            r"round\(100 / 1024 · n_ctx\)"):
        positions_for(defaults("neurons", from_position=30), 32, "demo")
    with pytest.raises(PositionError, match=r"`interventions.min_tokens`.*none has 40; set it to at most 32, e.g. 32 "
                                            r"\(null gives min\(64, n_ctx\)\)"):
        positions_for(defaults("interventions", min_tokens=40), 32, "demo")
    with pytest.raises(PositionError, match=r"`contextual.positions` \(model demo\): \[31\] beyond .*values that fit "
                                            r"it: positions \[12, 22, 30\]"):
        positions_for(defaults("contextual", positions=[24, 31]), 32, "demo")


def test_every_null_gives_hint_is_the_schemas_rule():
    from posmech.core.config import CONTEXT_SCALED

    keys = schema_keys(SCHEMA)
    for section, rules in CONTEXT_SCALED.items():
        for key in rules:
            assert null_gives(section, key) == "null gives " + " ".join(
                keys[f"{section}.{key}"]["x-scales-with-context"].split())


def _ci_with_null_kernel_positions() -> dict:
    cfg = yaml.safe_load((REPO / "config/ci.yaml").read_text())
    cfg["kernels"].update(heatmap_max_position=None, etc_positions=None, etc_heatmap_position=None)
    return validate_config(cfg, copy.deepcopy(SCHEMA))


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"script_{name}", REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_preflight_the_job_and_a_reader_get_the_same_kernels_positions(tmp_path, monkeypatch):
    """ci.yaml with the kernels' query positions null (the demo model: 32 tokens): the values
    preflight checks, those rule positional_kernels resolves and records in kernels.h5, and
    those the rules reading kernels.h5 take (etc_table, kernel_heatmaps) are the same."""
    import logging

    from posmech.analyses import kernels as kn
    from posmech.pipeline.preflight import section_positions
    from posmech.pipeline.runner import Names
    from posmech.settings import build
    from posmech.store.hdf5 import artifact_writer, attr_json, open_artifact

    config = _ci_with_null_kernel_positions()
    before = section_positions(config, "kernels")["demo"]  # the trained demo: its train section's 32 tokens

    # the job (scripts/positional_kernels.py) on a model directory of 32 positions, what it
    # computes stubbed: what it resolves and records in kernels.h5 is the real code's
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_positions": 32, "n_embd": 32,
                                                "n_layer": 2, "n_head": 2, "vocab_size": 64}))
    job = _script("positional_kernels")
    monkeypatch.setattr(job, "read_manifest", lambda p: {"hf_dir": str(hf), "source": "demo",
                                                         "resolved_revision": "x", "weights_sha256_16": "y"})
    monkeypatch.setattr(job, "read_position_means", lambda p, hook: (None, None))
    monkeypatch.setattr(job, "open_artifact", lambda p: contextlib.nullcontext(SimpleNamespace(attrs={})))
    monkeypatch.setattr(job, "read_tokens", lambda p: None)
    monkeypatch.setattr(job, "load_model", lambda *a: None)
    monkeypatch.setattr(kn, "check_means", lambda *a: None)
    used = {}

    def build_kernels(bridge, hf_config, means, count, tokens, settings, path, attrs):
        used["settings"] = settings
        with artifact_writer(path, "kernels", "positional_kernels", attrs):
            pass
        return {"n_layers": 2, "n_heads": 2, "n_queries": 0, "texts": []}

    monkeypatch.setattr(kn, "build_kernels", build_kernels)
    param = build(config).kernels.as_param()  # what the rule hands its job (recorded by Snakemake)
    entry = config["models"]["demo"]
    smk = SimpleNamespace(input=Names({"manifest": "m.json", "means": "bible.h5", "tokens": "t.h5"}),
                          output=Names({"h5": str(tmp_path / "kernels.h5")}),
                          params=Names({"settings": from_param(param), "entry": entry}),
                          wildcards=SimpleNamespace(model="demo"))
    job.main(smk, logging.getLogger("test"))

    with open_artifact(tmp_path / "kernels.h5", "kernels") as f:
        recorded = attr_json(f, "kernels_config")
    after = from_param(param).recorded(recorded)  # etc_table's and kernel_heatmaps' read-back
    keys = ("heatmap_max_position", "etc_positions", "etc_heatmap_position")
    want = (31, (3, 6, 12, 19, 25, 31), 31)
    assert tuple(getattr(before, k) for k in keys) == want
    assert tuple(getattr(used["settings"], k) for k in keys) == want
    assert tuple(recorded[k] if k != "etc_positions" else tuple(recorded[k]) for k in keys) == want
    assert after == used["settings"] == before


def test_a_section_recorded_as_configured_reads_back_at_the_recorded_context():
    """layer0.h5 records the contextual section as configured (nulls kept) and the model's
    context: its readers get, from those, what layer0_decomposition resolved."""
    p = defaults("contextual")
    job = positions_for(p, 32, "demo")
    assert (job.max_position, job.positions, job.classify_position, job.denominator_from, job.grid) == (
        30, (12, 22, 30), 30, 3, 5)
    assert p.recorded(p.as_dict(), 32, "demo") == job
    n = defaults("neurons")  # extended_tokens.h5 records the resolved section (neurons_config)
    resolved = positions_for(n, 32, "demo", max_position=30)
    assert n.recorded(resolved.as_dict()) == resolved and n.recorded(resolved.as_dict()).from_position == 3
