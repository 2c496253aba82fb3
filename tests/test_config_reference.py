"""The schema is the one source of keys and defaults (issue 12): config/README.md documents
exactly the schema's keys with the schema's defaults, and the shipped configs state only
what differs from them."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

from posmech.core.config import apply_defaults, load_schema, redundant_keys, schema_keys

REPO = Path(__file__).resolve().parents[1]
SCHEMA = load_schema(REPO / "workflow" / "schemas" / "config.schema.yaml")
README = REPO / "config" / "README.md"
CONFIGS = ["config.yaml", "demo.yaml", "ci.yaml"]

HEADING = re.compile(r"^#{2,3} `([^`]+)`")
CELL_SPLIT = re.compile(r"(?<!\\)\|")


def documented_keys(text: str) -> dict[str, str | None]:
    """Dotted key → the README's default cell (None for a section heading). Sections are
    the headings ``## `cache` …`` / ``### `models.<name>.train```; a row's first cell
    names one or more keys (``| `n_layer`, `n_head` | int | 2, 4 | …``)."""
    out: dict[str, str | None] = {}
    section = None
    for line in text.splitlines():
        m = HEADING.match(line)
        if m:
            section = m.group(1)
            out[re.sub(r"\.<name>$", "", section)] = None
            continue
        if section and line.startswith("| `"):
            cells = [c.strip() for c in CELL_SPLIT.split(line.strip().strip("|"))]
            names = re.findall(r"`([^`]+)`", cells[0])
            parts = [p.strip() for p in cells[2].split(",")] if len(names) > 1 else [cells[2]]
            for i, name in enumerate(names):
                out[f"{section}.{name}"] = parts[i] if len(parts) == len(names) else cells[2]
    return out


def render(value: object) -> str:
    """A default as the README writes it (YAML flow style)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ", ".join(render(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {render(v)}" for k, v in value.items()) + "}"
    return str(value)


def test_every_schema_key_is_documented_and_every_documented_key_exists():
    keys = schema_keys(SCHEMA)
    assert len(keys) >= 120 and "interventions.prev_knockout.period" in keys
    doc = documented_keys(README.read_text(encoding="utf-8"))
    undocumented = [k for k, sub in keys.items()
                    if k not in doc and not (sub.get("properties") and any(d.startswith(k + ".") for d in doc))]
    unknown = [k for k in doc if k not in keys]
    assert not undocumented, f"config/README.md lacks {undocumented}: add a row to its section's table"
    assert not unknown, f"config/README.md documents {unknown}, which the schema does not have"


def test_documented_defaults_are_the_schema_defaults():
    keys = schema_keys(SCHEMA)
    wrong = []
    for key, cell in documented_keys(README.read_text(encoding="utf-8")).items():
        if cell is None or "default" not in keys[key]:
            continue
        want, got = render(keys[key]["default"]), cell.replace("`", "")
        if want in got or (want == "[]" and got == "all"):  # an empty name list selects all
            continue
        wrong.append(f"{key}: schema {want!r}, README {cell!r}")
    assert not wrong, "\n".join(wrong)


def test_the_reference_check_fails_on_a_drifted_readme():
    text = README.read_text(encoding="utf-8")
    doc = documented_keys(text.replace("| `k0` | int | 2 |", "| `k0` | int | 3 |"))
    assert doc["kernels.k0"] == "3" and render(schema_keys(SCHEMA)["kernels.k0"]["default"]) == "2"
    dropped = documented_keys(text.replace("| `engine` |", "| engine |"))
    assert "cache.engine" not in dropped and "cache.engine" in schema_keys(SCHEMA)


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
