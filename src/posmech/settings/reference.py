"""What is written from the config schema: config/README.md's key tables, the settings fields.

The schema (``workflow/schemas/config.schema.yaml``) is the one place a config key is
written: its type, default and description. From it this module writes the key tables of
``config/README.md``: each table sits between the marker lines ``<!-- generated: SECTION -->``
and ``<!-- end generated -->`` (``SECTION`` the dotted section: ``kernels``,
``models.<name>``, ``models.<name>.train``), one row per key of the section (a nested
object's keys dotted, ``prev_knockout.period``; a map of user-named entries,
``pin.<name>.sharp``) with its type, default and description. The prose around the tables
is the README's own. And it writes :mod:`posmech.settings.schema_fields`: per section with a
settings class (:data:`posmech.settings.MODULES`), a frozen dataclass with one typed field
per key, which the hand-written settings class inherits, adding only what the schema
cannot say.

``python -m posmech.settings.reference --write`` (``make config-doc``) rewrites both;
``--check`` exits 1 naming the files that differ from what the schema gives
(``tests/test_config_reference.py`` and ``tests/test_settings.py`` fail the same way).
"""

from __future__ import annotations

import json
import re
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from posmech.core.errors import PosmechError
from posmech.core.generated import END, block_names, changed, fill_blocks
from posmech.core.generated import main as generator_main
from posmech.settings import MODULES, SCHEMA_PATH

REPO = SCHEMA_PATH.parents[2]
README_PATH = REPO / "config" / "README.md"
FIELDS_PATH = Path(__file__).with_name("schema_fields.py")
#: the command that writes both files (named by every staleness message)
COMMAND = "make config-doc  (python -m posmech.settings.reference --write)"

NAME = "<name>"
#: the extension keyword marking a position-valued key whose null scales with the model's
#: context: its rule in words (the rule itself: :data:`posmech.core.config.CONTEXT_SCALED`)
SCALES = "x-scales-with-context"
#: the marker of the table of those keys (config/README.md, "Positions scale with the context")
SCALED_TABLE = "context-scaled"
#: the contexts whose values that table shows: GPT-2's (the posts' values) and the demo's
SCALED_CONTEXTS = {"gpt2 (1024)": 1024, "context 32": 32}

#: how a string pattern of the schema reads in the type column
PATTERNS = {"^L[0-9]+H[0-9]+$": "`L{l}H{h}`", "^L0H[0-9]+$": "`L0H{h}`", "^[PLKCS][0-9]+$": "claim ID"}
#: how a ``$ref`` to a definition reads in the type column (others: the definition's own type)
REFS = {"#/$defs/name": "name", "#/$defs/model_names": "list of model names"}
#: the same (a ``$ref`` or a pattern), as the items of a list
ITEM_REFS = {"#/$defs/name": "names", "^[PLKCS][0-9]+$": "claim IDs"}


def load_schema(path: Path = SCHEMA_PATH) -> dict[str, Any]:
    """The config schema with the keys the analyses declare of their own
    (:func:`posmech.core.config.load_schema`): what a run validates."""
    from posmech.core.config import load_schema as composed

    return dict(composed(path))


def resolve(sub: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    """``sub`` with its ``$ref`` followed; keys written beside the ``$ref`` (a key's own
    ``description``) win over the definition's."""
    ref = sub.get("$ref")
    if not ref:
        return sub
    node: Any = root
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    return {**resolve(node, root), **{k: v for k, v in sub.items() if k != "$ref"}}


# --------------------------------------------------------------------------- the schema's keys
def section_schema(schema: dict[str, Any], section: str) -> dict[str, Any]:
    """The resolved sub-schema of dotted ``section`` (``<name>``: a map's entries)."""
    node = schema
    for part in section.split("."):
        node = resolve(node, schema)
        node = node["additionalProperties"] if part == NAME else node.get("properties", {}).get(part)
        if not isinstance(node, dict):
            raise PosmechError(f"config/README.md: no config section `{section}` in the schema (marker "
                               f"`<!-- generated: {section} -->`)")
    return resolve(node, schema)


Entry = tuple[str, dict[str, Any], dict[str, Any], bool]


def entries(node: dict[str, Any], schema: dict[str, Any], prefix: str = "",
            stop: frozenset[str] = frozenset(), where: str = "") -> Iterator[Entry]:
    """``(dotted key relative to the section, the key's schema as written, resolved, required)``
    of every key under ``node``, depth first: an object's keys follow it, a map of
    user-named entries (``additionalProperties`` with keys) gives ``key.<name>.sub``. Keys
    whose full path (``where`` + key) is in ``stop`` are listed but not entered (a section
    of their own)."""
    required = set(node.get("required", []))
    for name, raw in node.get("properties", {}).items():
        sub = resolve(raw, schema)
        key = prefix + name
        yield key, raw, sub, name in required
        if f"{where}{key}" in stop:
            continue
        if sub.get("properties"):
            yield from entries(sub, schema, key + ".", stop, where)
        extra = sub.get("additionalProperties")
        if isinstance(extra, dict) and not sub.get("properties") and resolve(extra, schema).get("properties"):
            yield from entries(resolve(extra, schema), schema, f"{key}.{NAME}.", stop, where)


def all_keys(schema: dict[str, Any]) -> list[str]:
    """Every key of the schema below the top-level sections, dotted (``kernels.k0``,
    ``models.<name>.train.steps``): what the README's tables must show."""
    out = []
    for section, raw in schema["properties"].items():
        sub = resolve(raw, schema)
        node = sub
        if not sub.get("properties") and isinstance(sub.get("additionalProperties"), dict):
            node, section = resolve(sub["additionalProperties"], schema), f"{section}.{NAME}"
        out += [f"{section}.{key}" for key, *_ in entries(node, schema)]
    return out


# --------------------------------------------------------------------------- README tables
def render(value: Any) -> str:
    """A value as YAML writes it in flow style (a default in the tables)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ", ".join(render(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {render(v)}" for k, v in value.items()) + "}"
    if isinstance(value, str) and (value != value.strip() or not value):
        return json.dumps(value)
    return str(value)


def _bounds(sub: dict[str, Any]) -> str:
    """`` ≥ 1``, `` > 0``, `` in [0, 1]``, `` in (0, 1]``: a number's bounds."""
    lo, open_lo, hi = sub.get("minimum"), sub.get("exclusiveMinimum"), sub.get("maximum")
    if hi is not None and (lo is not None or open_lo is not None):
        return f" in [{lo}, {hi}]" if lo is not None else f" in ({open_lo}, {hi}]"
    if hi is not None:
        return f" ≤ {hi}"
    if open_lo is not None:
        return f" > {open_lo}"
    return f" ≥ {lo}" if lo is not None else ""


def type_text(raw: dict[str, Any], schema: dict[str, Any]) -> str:
    """The type column: ``int ≥ 1 | null``, `` `a` | `b` ``, ``list of int``, ``map``."""
    if raw.get("$ref") in REFS:
        return REFS[raw["$ref"]]
    sub = resolve(raw, schema)
    if "enum" in sub:
        return " | ".join(f"`{render(v)}`" if v is not None else "null" for v in sub["enum"])
    types = sub.get("type", "object")
    parts = []
    for t in types if isinstance(types, list) else [types]:
        if t in ("integer", "number"):
            parts.append(("int" if t == "integer" else "number") + _bounds(sub))
        elif t == "string":
            parts.append("path" if sub.get("format") == "repo-file" else PATTERNS.get(sub.get("pattern", ""), "str"))
        elif t == "boolean":
            parts.append("bool")
        elif t == "null":
            parts.append("null")
        elif t == "array":
            items = sub.get("items", {})
            inner = resolve(items, schema)
            if "enum" in inner:
                parts.append("list of " + ", ".join(f"`{render(v)}`" for v in inner["enum"]))
            else:
                plural = ITEM_REFS.get(items.get("$ref", inner.get("pattern", "")))
                parts.append("list of " + (plural or type_text(items, schema)))
        else:
            parts.append("map")
    return " | ".join(parts)


def scaled_values(schema: dict[str, Any], section: str, n_ctx: int) -> dict[str, Any]:
    """The section's defaults with every context-scaled key resolved for ``n_ctx``
    (:func:`posmech.core.config.scale_to_context`)."""
    from posmech.core.config import apply_defaults, scale_to_context

    return scale_to_context(section, apply_defaults({}, schema["properties"][section], schema), n_ctx)


def description(schema: dict[str, Any], sub: dict[str, Any], section: str, key: str) -> str:
    """A key's description; a context-scaled key's adds its rule (the schema's
    ``x-scales-with-context``) and the value at GPT-2's context."""
    from posmech.core.config import REFERENCE_CONTEXT

    text = " ".join(sub.get("description", "").split())
    if SCALES in sub:
        value = scaled_values(schema, section, REFERENCE_CONTEXT)[key]
        shown = f"`{render(value)}`" if isinstance(value, list) else render(value)
        text += (f" Left null, it scales with each model's context n_ctx: {sub[SCALES]} "
                 f"(gpt2, {REFERENCE_CONTEXT} tokens: {shown}).")
    return text


def scaled_table(schema: dict[str, Any]) -> list[str]:
    """The table of the context-scaled keys: the rule, the values at each of
    :data:`SCALED_CONTEXTS`."""
    rows = ["| key | `null` gives, for context `n_ctx` | " + " | ".join(SCALED_CONTEXTS) + " |",
            "|---|---|" + "---|" * len(SCALED_CONTEXTS)]
    for section, raw in schema["properties"].items():
        for key, sub in resolve(raw, schema).get("properties", {}).items():
            if SCALES in sub:
                values = [render(scaled_values(schema, section, n)[key]) for n in SCALED_CONTEXTS.values()]
                rows.append(f"| `{section}.{key}` | {_cell(sub[SCALES])} | " + " | ".join(values) + " |")
    return rows


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def table(schema: dict[str, Any], section: str, sections: frozenset[str]) -> list[str]:
    """The key table of ``section`` (markdown lines)."""
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    missing = []
    for key, raw, sub, required in entries(section_schema(schema, section), schema, "", sections, section + "."):
        default = f"`{render(sub['default'])}`" if "default" in sub else ("required" if required else "—")
        if not sub.get("description"):
            missing.append(f"{section}.{key}")
        rows.append(f"| `{key}` | {_cell(type_text(raw, schema))} | {_cell(default)} | "
                    f"{_cell(description(schema, sub, section, key))} |")
    if missing:
        raise PosmechError(f"workflow/schemas/config.schema.yaml: keys {missing} have no description: "
                           "a key is documented where it is defined")
    return rows


def readme(text: str, schema: dict[str, Any]) -> str:
    """``text`` (config/README.md) with every marked table written from ``schema``. Every key
    of the schema must be in one table (else an error naming the keys)."""
    sections = frozenset(block_names(text)) - {SCALED_TABLE}
    shown: list[str] = []

    def block(section: str) -> list[str]:
        if section == SCALED_TABLE:
            return scaled_table(schema)
        shown.extend(f"{section}.{key}" for key, *_ in entries(section_schema(schema, section), schema, "",
                                                                sections, section + "."))
        return table(schema, section, sections)

    out = fill_blocks(text, "config/README.md", block)
    missing = [k for k in all_keys(schema) if k not in shown]
    if missing:
        raise PosmechError(f"config/README.md: no table shows {missing}: add a `<!-- generated: SECTION -->` "
                           f"... `{END}` block under the section's heading")
    return out


# --------------------------------------------------------------------------- settings fields
def class_name(section: str) -> str:
    """``anatomy.taxa`` -> ``AnatomyTaxaSettings`` (:func:`posmech.settings.settings_class`'s rule)."""
    return "".join(p.capitalize() for p in re.split(r"[._]", section)) + "Settings"


def py_type(raw: dict[str, Any], schema: dict[str, Any], section: str, key: str) -> str:
    """The Python type of a field: a YAML list is a tuple, a nested object its settings class,
    a map of user-named entries a dict."""
    sub = resolve(raw, schema)
    if sub.get("properties"):
        return class_name(f"{section}.{key}")
    names = {int: "int", float: "float", str: "str", bool: "bool"}
    if "enum" in sub:
        parts = list(dict.fromkeys(names[type(v)] for v in sub["enum"] if v is not None))
        return " | ".join(parts + (["None"] if None in sub["enum"] else []))
    types = sub.get("type", "object")
    parts = []
    for t in types if isinstance(types, list) else [types]:
        if t == "array":
            parts.append(f"tuple[{py_type(sub.get('items', {}), schema, section, key)}, ...]")
        elif t == "object":
            extra = sub.get("additionalProperties")
            value = "Any"
            entry = resolve(extra, schema) if isinstance(extra, dict) else {}
            if "type" in entry and not entry.get("properties"):
                value = py_type(extra, schema, section, key)
            parts.append(f"dict[str, {value}]")
        elif t != "null":
            parts.append({"integer": "int", "number": "float", "string": "str", "boolean": "bool"}[t])
    return " | ".join(parts + (["None"] if "null" in types else []))


def _comment(text: str, indent: str) -> list[str]:
    return textwrap.wrap(" ".join(text.split()), width=100, initial_indent=indent + "#: ",
                         subsequent_indent=indent + "#: ", break_long_words=False, break_on_hyphens=False)


def _classes(schema: dict[str, Any], node: dict[str, Any], section: str, name: str, doc: str,
             out: list[str]) -> None:
    """The class ``name`` of ``section`` (``node``), after the classes of its nested objects."""
    body = []
    for key, raw in node.get("properties", {}).items():
        sub = resolve(raw, schema)
        if sub.get("properties"):
            _classes(schema, sub, f"{section}.{key}", class_name(f"{section}.{key}"),
                     f"The ``{section}.{key}`` config section: {sub.get('description', '')}", out)
        body += _comment(description(schema, sub, section, key), "    ")
        body.append(f"    {key}: {py_type(raw, schema, section, key)}")
    doc_lines = textwrap.wrap(" ".join(doc.replace("\\", "\\\\").split()), width=92,
                              break_long_words=False, break_on_hyphens=False)
    out += ["", "", "@dataclass(frozen=True)", f"class {name}(Settings):"]
    out += [f'    """{doc_lines[0]}'] + [f"    {line}" for line in doc_lines[1:]]
    out[-1] += '"""'
    out += ["", f'    section: ClassVar[str] = "{section}"', ""] + body


FIELDS_HEADER = '''"""Generated from workflow/schemas/config.schema.yaml by ``make config-doc``
(``python -m posmech.settings.reference --write``): do not edit, change the schema and
regenerate (``tests/test_settings.py`` fails while this file differs from what the schema gives).

One frozen dataclass per config section with a settings class (:data:`posmech.settings.MODULES`):
``<Section>Fields``, one typed field per key of the section, in the schema's order, with no
defaults (the schema's apply); the section's settings class (``posmech.settings.<family>``)
inherits it and adds only what the schema cannot say. A nested object (``anatomy.taxa``) is a
whole settings class here, ``<Section><Key>Settings``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from posmech.settings import Settings'''


def fields_source(schema: dict[str, Any]) -> str:
    """The source of :mod:`posmech.settings.schema_fields`."""
    out = [FIELDS_HEADER]
    for section in MODULES:
        _classes(schema, section_schema(schema, section), section, class_name(section).removesuffix("Settings")
                 + "Fields", f"The fields of config section ``{section}`` (its settings class: "
                 f"``posmech.settings.{MODULES[section]}.{class_name(section)}``).", out)
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- command line
def written(schema: dict[str, Any] | None = None) -> dict[Path, str]:
    """Each generated file and the text the schema gives it."""
    schema = schema if schema is not None else load_schema()
    return {README_PATH: readme(README_PATH.read_text(encoding="utf-8"), schema),
            FIELDS_PATH: fields_source(schema)}


def stale(schema: dict[str, Any] | None = None) -> list[Path]:
    """The generated files whose text differs from what the schema gives."""
    return changed(written(schema))


def main(argv: list[str] | None = None) -> int:
    return generator_main(argv, "python -m posmech.settings.reference", __doc__, written,
                          "config/README.md's key tables and settings/schema_fields.py", "the schema", COMMAND)


if __name__ == "__main__":
    sys.exit(main())
