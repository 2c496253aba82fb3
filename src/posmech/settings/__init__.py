"""Typed settings: one frozen object per analysis family, built once from its config section.

The schema (``workflow/schemas/config.schema.yaml``) stays the single source of keys,
defaults and documentation: each key of a section is a typed field **without a default**
of a class written from the schema (:mod:`posmech.settings.schema_fields`, ``make
config-doc``), which the section's settings class inherits, and :meth:`Settings.from_config`
fills it from the validated config (the schema's defaults already applied).
``tests/test_settings.py`` fails when the written fields are not what the schema gives.

What a family's section means beyond its raw keys lives next to it, in
``posmech.settings.<family>``: a corpus left null resolved to the first configured corpus
(:meth:`Settings.resolved`), the models the section selects, the checks the config alone
allows before any job. The workflow builds :class:`StudySettings` once
(``workflow/rules/common.smk``, ``SETTINGS``) and hands each family's settings to its rule
as a param, ``settings=SETTINGS.<family>.as_param()``: a plain dict, which Snakemake
records (a changed section reruns the job); :func:`posmech.pipeline.runner.run` gives the job's
script the typed object (``smk.params.settings``), which it passes on to the library.

A YAML list becomes a tuple, a nested object (``anatomy.taxa``,
``interventions.prev_knockout``, …) its own settings class; mappings keyed by model or
head name (``anatomy.heads``, ``*.pin``) stay dicts, their lists tuples. :meth:`Settings.as_dict` gives the
section back as plain JSON-able data, as artifacts record it (``config_hash``, HDF5
attributes): the same values the config holds.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import typing
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from posmech.core.errors import PosmechError

S = TypeVar("S", bound="Settings")


def _freeze(value: Any) -> Any:
    """A YAML value with its lists made tuples, recursively (a mapping's values too)."""
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, Mapping):
        return {k: _freeze(v) for k, v in value.items()}
    return value


def _thaw(value: Any) -> Any:
    """:func:`_freeze` undone, and a nested settings object as its dict."""
    if isinstance(value, Settings):
        return value.as_dict()
    if isinstance(value, tuple | list):
        return [_thaw(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class Settings:
    """A config section as a frozen, typed object (subclasses, written from the schema in
    :mod:`posmech.settings.schema_fields`, declare ``section`` and one field per key of that
    section, no defaults: the schema's apply)."""

    #: the config key of the section (``kernels``), or the dotted path of a nested object
    #: (``interventions.prev_knockout``) for a class used as a field of another
    section: ClassVar[str] = ""

    @classmethod
    def from_section(cls: type[S], raw: Mapping[str, Any]) -> S:
        """The settings of section values ``raw`` (validated, defaults filled). A key the
        class lacks, or a field the section lacks, is a workflow error naming both."""
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(raw) - set(names))
        missing = [n for n in names if n not in raw]
        if unknown or missing:
            raise PosmechError(
                f"config section `{cls.section}`: keys {unknown} are not fields of {cls.__name__} and fields "
                f"{missing} have no value (the schema's default missing?): the schema "
                "(workflow/schemas/config.schema.yaml) and posmech.settings disagree (workflow bug)"
            )
        hints = typing.get_type_hints(cls)
        values = {}
        for name in names:
            nested = _settings_class(hints[name])
            values[name] = nested.from_section(raw[name]) if nested else _freeze(raw[name])
        return cls(**values)

    @classmethod
    def from_config(cls: type[S], config: Mapping[str, Any]) -> S:
        """The settings of ``config[cls.section]``, then :meth:`resolved` against ``config``."""
        return cls.from_section(config[cls.section]).resolved(config)

    def resolved(self: S, config: Mapping[str, Any]) -> S:
        """A copy with what the section leaves to the rest of the config filled in (a null
        corpus: the first configured one); this base class changes nothing."""
        return self

    def chosen(self, names: Any, key: str = "models") -> list[str]:
        """The names of ``names`` (in their order) that the section's list ``key`` names, or
        all of them when that list is empty (what an empty `models`/`corpora` means)."""
        listed = getattr(self, key)
        return [n for n in names if n in listed] if listed else list(names)

    def replace(self: S, **changes: Any) -> S:
        """A copy with ``changes`` (lists become tuples)."""
        return dataclasses.replace(self, **{k: _freeze(v) for k, v in changes.items()})

    def as_dict(self) -> dict[str, Any]:
        """The section as plain JSON-able data (lists, dicts), as artifacts record it."""
        return {f.name: _thaw(getattr(self, f.name)) for f in fields(self)}

    def as_param(self) -> dict[str, Any]:
        """These settings as a rule's param: a plain dict (:meth:`as_dict` and the section's
        name under :data:`PARAM_KEY`), which Snakemake records, so that a changed section
        reruns the job (it records only built-in values: a settings object itself would be
        dropped, and the job never rerun). :func:`posmech.pipeline.runner.run` hands the job's script
        the typed object again (:func:`from_param`)."""
        return {PARAM_KEY: self.section, **self.as_dict()}

    def scaled(self: S, n_ctx: int) -> S:
        """A copy for a model whose documents have ``n_ctx`` tokens: every position-valued
        key left null gets the value its rule gives (:func:`posmech.core.config.scale_to_context`);
        a key given a value keeps it."""
        from posmech.core.config import scale_to_context

        return type(self).from_section(scale_to_context(self.section, self.as_dict(), n_ctx))


#: the key of a settings param (:meth:`Settings.as_param`) that names its section
PARAM_KEY = "__settings__"


def is_param(value: Any) -> bool:
    """Whether ``value`` is a settings param (:meth:`Settings.as_param`)."""
    return isinstance(value, Mapping) and PARAM_KEY in value


def from_param(value: Mapping[str, Any]) -> Settings:
    """The typed settings of a settings param (:meth:`Settings.as_param`): the values as
    the workflow resolved them, nothing resolved again."""
    values = {k: v for k, v in value.items() if k != PARAM_KEY}
    return settings_class(str(value[PARAM_KEY])).from_section(values)


def _settings_class(hint: Any) -> type[Settings] | None:
    """The settings class a field's type names (``X`` or ``X | None``), else None."""
    for t in (hint, *typing.get_args(hint)):
        if isinstance(t, type) and issubclass(t, Settings):
            return t
    return None


def first_corpus(config: Mapping[str, Any], name: str | None) -> str:
    """``name``, or (null) the first corpus under ``corpora``: what a section's corpus key
    left null means."""
    return name or next(iter(config["corpora"]))


#: the analysis families and shared helpers with a settings class: ``{section: module}``
#: (``posmech.settings.<module>``, class ``<Section>Settings``); posembed's two sections
#: share a module
MODULES: dict[str, str] = {
    "cache": "cache",
    "taxonomy": "taxonomy",
    "anatomy": "anatomy",
    "geometry": "geometry",
    "interventions": "interventions",
    "kernels": "kernels",
    "contextual": "contextual",
    "neurons": "neurons",
    "attn_only": "attn_only",
    "posembed_averaging": "posembed",
    "posembed_attention": "posembed",
}


def settings_class(section: str) -> type[Settings]:
    """The settings class of config section ``section``."""
    module = importlib.import_module(f"posmech.settings.{MODULES[section]}")
    name = "".join(part.capitalize() for part in section.split("_")) + "Settings"
    cls: type[Settings] = getattr(module, name)
    return cls


class StudySettings:
    """Every family's settings of one config, by section name as attributes
    (``SETTINGS.kernels``), each built once (:func:`build`)."""

    def __init__(self, by_section: dict[str, Settings]) -> None:
        self._by_section = by_section

    def __getattr__(self, section: str) -> Settings:
        try:
            return self.__dict__["_by_section"][section]
        except KeyError:
            raise AttributeError(f"no settings for config section {section!r}") from None

    def __getitem__(self, section: str) -> Settings:
        return self._by_section[section]

    def __iter__(self) -> typing.Iterator[str]:
        return iter(self._by_section)


#: the config schema, beside the package in a checkout (``workflow/schemas``)
SCHEMA_PATH = Path(__file__).resolve().parents[3] / "workflow" / "schemas" / "config.schema.yaml"


def defaults(section: str, config: Mapping[str, Any] | None = None, **values: Any) -> Settings:
    """The settings of ``section`` with the schema's defaults, ``values`` given (nested
    objects as dicts, validated against the schema): what a test, a notebook or a user
    calling the library directly hands it. ``config`` (default: one corpus ``bible``)
    resolves what the section leaves to the rest of the config."""
    from posmech.core.config import apply_defaults, load_schema

    schema = load_schema(SCHEMA_PATH)
    sub = schema["properties"][section]
    raw = apply_defaults(copy.deepcopy(dict(values)), sub, schema)
    import jsonschema

    errors = list(jsonschema.Draft202012Validator({**sub, "$defs": schema.get("$defs", {})}).iter_errors(raw))
    if errors:
        raise PosmechError(f"settings of `{section}`: " + "; ".join(
            f"{'.'.join(map(str, e.absolute_path)) or '(section)'}: {e.message}" for e in errors))
    cls = settings_class(section)
    return cls.from_section(raw).resolved(config if config is not None else {"corpora": {"bible": {}}})


def build(config: Mapping[str, Any]) -> StudySettings:
    """The settings of every section of :data:`MODULES` in ``config`` (validated, defaults
    filled in)."""
    return StudySettings({s: settings_class(s).from_config(config) for s in MODULES})
