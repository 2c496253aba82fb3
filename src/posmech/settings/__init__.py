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
import functools
import importlib
import typing
from collections.abc import Callable, Mapping
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
        a key given a value keeps it. The scaling step alone, nothing checked: a job, preflight
        and a test resolve positions with :func:`positions_for`, which calls this."""
        from posmech.core.config import scale_to_context

        return type(self).from_section(scale_to_context(self.section, self.as_dict(), n_ctx))

    # ----------------------------------------------------------------- positions (positions_for)
    #: keys left null in the settings whose resolved values a message suggests as "values that
    #: fit" (:meth:`fitting`); empty: the section's context-scaled keys
    #: (:data:`posmech.core.config.CONTEXT_SCALED`)
    FIT_KEYS: ClassVar[tuple[str, ...]] = ()

    def with_positions(self: S, n_ctx: int) -> S:
        """The section's positions resolved for context ``n_ctx``, unchecked: :meth:`scaled`,
        and what a section derives from them (the contextual section: ``max_position``,
        ``classify_position``). :func:`positions_for` calls it and then checks."""
        return self.scaled(n_ctx)

    def fitting(self: S, n_ctx: int) -> S | None:
        """These settings with the keys of :attr:`FIT_KEYS` left null, resolved for
        ``n_ctx``: what the messages of :meth:`position_problems` suggest; None when even
        that does not fit (another key is the problem)."""
        from posmech.core.config import CONTEXT_SCALED

        keys = self.FIT_KEYS or tuple(CONTEXT_SCALED.get(self.section, {}))
        try:
            return self.replace(**{k: None for k in keys}).with_positions(n_ctx)
        except PosmechError:
            return None

    def position_problems(self, n_ctx: int, at: Context) -> list[str]:
        """One message per position or length of these settings (resolved by
        :meth:`with_positions`) that does not fit context ``n_ctx``, each naming its key, the
        model and values that fit; a section without positions has none."""
        return []

    def recorded(self: S, recorded: Mapping[str, Any], n_ctx: int | None = None, model: str = "") -> S:
        """These settings with the positions an artifact was computed at: the context-scaled
        keys taken from ``recorded``, the section as the job that wrote the artifact recorded
        it (kernels.h5's ``kernels_config``, extended_tokens.h5's ``neurons_config``; a key
        ``recorded`` lacks keeps its value here). An artifact that records its section as
        configured (nulls kept: layer0.h5's ``contextual_config``) gives its context
        ``n_ctx`` (its ``n_ctx`` attribute) instead: the keys it left null are resolved at
        that context by :func:`positions_for`, as its job resolved them."""
        from posmech.core.config import recorded_scaled

        out = type(self).from_section(recorded_scaled(self.section, self.as_dict(), recorded))
        return out if n_ctx is None else positions_for(out, int(n_ctx), model)


#: the key of a settings param (:meth:`Settings.as_param`) that names its section
PARAM_KEY = "__settings__"


# --------------------------------------------------------------------------- positions
@dataclass(frozen=True)
class Context:
    """Where positions are resolved, for the messages of :meth:`Settings.position_problems`:
    the model, where its context comes from (``models.<m>.n_ctx``, a config.json; empty: not
    said), the fitting settings (:meth:`Settings.fitting`), and bounds another section sets
    (``max_position``: the contextual section's, the last destination position of layer0.h5,
    which ``neurons.from_position`` must stay below)."""

    model: str
    where: str
    fit: Callable[[], Any]  # the fitting settings, computed when a message needs them
    max_position: int | None = None

    def has_context(self, n_ctx: int) -> str:
        """``model 'm' has a context of N tokens (from WHERE)``."""
        return (f"model {self.model!r} has a context of {n_ctx} tokens"
                + (f" (from {self.where})" if self.where else ""))


class PositionError(PosmechError):
    """Positions of a config section that do not fit a model's context
    (:func:`positions_for`): ``problems``, one message each, naming the key, the model and
    values that fit."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__(problems[0] if len(problems) == 1 else
                         "positions that do not fit the model's context:\n  - " + "\n  - ".join(problems))


def positions_for(settings: S, n_ctx: int, model: str = "", where: str = "", *,
                  max_position: int | None = None) -> S:
    """The one place where a config section's positions are resolved for a model: its keys
    left null that scale with the context (the schema's ``x-scales-with-context``, the rules
    :data:`posmech.core.config.CONTEXT_SCALED`) get their values for context ``n_ctx``
    (:meth:`Settings.with_positions`), and every position and length of the section is
    checked against it (:meth:`Settings.position_problems`). Returns the resolved settings;
    raises :class:`PositionError` listing every problem, each naming the key, the model
    (``model``, its context from ``where``) and values that would fit.

    Preflight (:func:`posmech.pipeline.preflight.position_problems`) collects its messages
    before any job; a job calls it once with its model's context and records the result in
    its artifact (kernels.h5's ``kernels_config``, the tables' ``interventions_config``,
    extended_tokens.h5's ``neurons_config``); a rule reading an artifact takes the recorded
    values (:meth:`Settings.recorded`). ``max_position``: the contextual section's, for
    ``neurons.from_position`` (None: ``n_ctx − 2``, that section's default)."""
    n_ctx = int(n_ctx)
    resolved = settings.with_positions(n_ctx)
    at = Context(model, where, lambda: settings.fitting(n_ctx), max_position)
    problems = resolved.position_problems(n_ctx, at)
    if problems:
        raise PositionError(problems)
    return resolved


def example(values: Any) -> str:
    """``[a, b, c]``: positions as a message shows them."""
    return "[" + ", ".join(str(int(v)) for v in values) + "]"


def null_gives(section: str, key: str) -> str:
    """``null gives <rule>``: the rule of context-scaled key ``section.key`` in the schema's
    words (its ``x-scales-with-context``), for messages."""
    return f"null gives {_scaling_rules()[f'{section}.{key}']}"


@functools.lru_cache(maxsize=1)
def _scaling_rules() -> dict[str, str]:
    """``{section.key: rule in words}`` of every key the schema marks ``x-scales-with-context``."""
    from posmech.core.config import load_schema, schema_keys

    return {k: " ".join(str(sub["x-scales-with-context"]).split())
            for k, sub in schema_keys(load_schema(SCHEMA_PATH)).items() if "x-scales-with-context" in sub}


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
    "sinks": "sinks",
    "posembed_averaging": "posembed",
    "posembed_attention": "posembed",
    "rotary_frequencies": "rotary",
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


# A twin's sweep point reads a fraction of the documents (config `twins.documents_fraction`,
# posmech.pipeline.sweep.thinned). The keys are the config sections', some of which share an
# analysis's name (posembed_averaging, rotary_frequencies) without naming that analysis.
#: ``{config section: its key that counts a corpus's documents}`` (the sections' other counts,
#: e.g. ``attn_only``'s random-token sequences or ``geometry.n_tokens``, are not documents)
DOCUMENT_KEYS = {"taxonomy": "n_documents", "anatomy": "n_documents", "interventions": "n_documents",
                 "posembed_averaging": "n_documents", "rotary_frequencies": "n_documents", "cache": "n_documents",
                 "kernels": "n_chapters", "contextual": "n_per_corpus", "sinks": "n_samples"}
#: ``{config section: its key that counts what a claim's quantity is a mean over, not documents}``,
#: which a twin's point cuts by the same fraction (at least 2): ``geometry.n_tokens``, the
#: one-token-repeated prompts whose extended embeddings P8's mean pairwise cosine and P1/P9-P11's
#: mean embeddings average (the definition unchanged, only fewer tokens in the means). Not
#: ``attn_only``'s random-token samples: its head roles' scores are held to thresholds that no twin
#: may pass (heads.csv), which fewer samples would make noisier.
COUNT_KEYS = {"geometry": "n_tokens"}
