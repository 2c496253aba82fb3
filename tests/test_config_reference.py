"""The schema is the one source of keys, defaults and their documentation (issues 12, 48):
config/README.md's key tables are written from it (``make config-doc``,
:mod:`posmech.settings.reference`), and the shipped configs state only what differs from
its defaults."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

from posmech.core.config import apply_defaults, load_schema, redundant_keys, schema_keys
from posmech.core.errors import PosmechError
from posmech.settings.reference import COMMAND, all_keys, entries, readme

REPO = Path(__file__).resolve().parents[1]
SCHEMA = load_schema(REPO / "workflow" / "schemas" / "config.schema.yaml")
README = REPO / "config" / "README.md"
CONFIGS = ["config.yaml", "demo.yaml", "ci.yaml"]


def test_the_readme_tables_are_written_from_the_schema():
    """config/README.md's key tables are what `make config-doc` writes from the schema (each
    key's type, default and description), and they show every key of the schema."""
    keys = all_keys(SCHEMA)
    assert len(keys) >= 120 and "interventions.prev_knockout.period" in keys
    assert set(keys) == {k for k in schema_keys(SCHEMA) if "." in k}  # every key below a section
    assert readme(README.read_text(encoding="utf-8"), SCHEMA) == README.read_text(encoding="utf-8"), (
        f"config/README.md is stale: its key tables differ from the schema's keys; run {COMMAND}"
    )


def test_the_reference_check_fails_on_a_drifted_readme_or_schema():
    text = README.read_text(encoding="utf-8")
    assert "| `k0` | int ≥ 0 | `2` |" in text
    drifted = text.replace("| `k0` | int ≥ 0 | `2` |", "| `k0` | int ≥ 0 | `3` |")
    assert readme(drifted, SCHEMA) == text  # a hand edit of a row is overwritten
    schema = copy.deepcopy(SCHEMA)
    schema["properties"]["kernels"]["properties"]["k0"]["default"] = 3
    assert "| `k0` | int ≥ 0 | `3` |" in readme(text, schema)  # a changed default shows
    del schema["properties"]["kernels"]["properties"]["k0"]["description"]
    with pytest.raises(PosmechError, match=r"\['kernels.k0'\] have no description"):
        readme(text, schema)
    untabled = text.replace("<!-- generated: twins -->", "<!-- twins -->")
    keys = ", ".join(f"'twins.{k}'" for k in SCHEMA["properties"]["twins"]["properties"])
    with pytest.raises(PosmechError, match=re.escape(f"no table shows [{keys}]")):
        readme(untabled, SCHEMA)
    with pytest.raises(PosmechError, match="no config section `nope`"):
        readme(text.replace("<!-- generated: twins -->", "<!-- generated: nope -->"), SCHEMA)


def test_a_key_described_beside_its_ref_keeps_its_own_description():
    keys = dict(((k, sub) for k, _, sub, _ in entries(SCHEMA["properties"]["kernels"], SCHEMA)))
    assert keys["models"]["default"] == [] and "kernels are computed" in keys["models"]["description"]


@pytest.mark.parametrize("name", CONFIGS)
def test_shipped_configs_state_only_what_differs_from_the_schema(name):
    config = yaml.safe_load((REPO / "config" / name).read_text(encoding="utf-8"))
    assert redundant_keys(config, SCHEMA) == [], (
        f"config/{name} restates schema defaults: delete these keys (the schema is the one source of defaults)"
    )


def test_redundant_keys_finds_restated_defaults_at_any_depth():
    config = {
        "models": {"m": {"source": "gpt2", "revision": "main"}},
        "corpora": {"c": {"source": "x.jsonl", "seed": 0, "n_documents": 5}},
        "cache": {"batch_size": 8, "hooks": ["resid_pre"]},
        "interventions": {"prev_knockout": {"period": 5, "phase": 1}, "models": []},
        "taxonomy": {"pin": {}},
    }
    assert sorted(redundant_keys(config, SCHEMA)) == [
        "cache.batch_size", "corpora.c.seed", "interventions.models",
        "interventions.prev_knockout.period", "models.m.revision", "taxonomy.pin",
    ]
    # the result of filling defaults into a minimal config is what a full config said
    minimal = {"models": {"m": {"source": "gpt2"}}, "corpora": {"c": {"source": "x.jsonl"}}}
    full = apply_defaults(copy.deepcopy(minimal), SCHEMA)
    assert full["models"]["m"]["revision"] == "main" and full["cache"]["batch_size"] == 8
    assert redundant_keys(minimal, SCHEMA) == []
