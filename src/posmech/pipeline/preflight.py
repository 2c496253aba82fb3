"""Checks that run once, before Snakemake schedules any job (called from ``common.smk``).

The schema (:func:`posmech.core.config.validate_config`) checks types and names.  This module
checks what needs more than the config's own structure, so that a mistake the config
alone can reveal never gets as far as a job (a job that fails has already had its
outputs deleted by Snakemake, and its neighbours may have run):

* **duplicate keys** in the YAML config files (a second ``cache:`` section silently
  replaced the first): every config file given with ``--configfile`` (or the default)
  is re-read with a loader that refuses them, naming the key and both lines;
* **every file the config names** exists and parses: every key the schema marks with
  ``format: repo-file`` (prompt files, …; repository-relative or absolute), and the
  shipped ``resources/published.yaml``; YAML files are parsed with the same strict loader;
* **what the model's shape decides**: ``models.<m>.n_ctx`` within the model's context;
  ``taxonomy.pin`` naming a defined model and heads it has; ``interventions.prev_knockout``
  (``phase < period``, ``layers`` that exist); ``kernels`` query positions within the
  context.  The shape comes from the model's ``config.json`` when it is on disk (a local
  source, or a fetched/trained model under ``resources/models/<m>/hf``), or from the
  ``train`` section of a model the pipeline trains; a hub model not fetched yet is
  checked again at run time by the rule itself;
* **the content of the prompt files** (the repeat-string prompts' shape and every
  ``prompt_ids`` entry; the induction prompt's keys and its ``words`` in its text), and
  every **model ``config.json`` on disk** parses (file, line and column named);
* **every local model directory agrees with itself** (:func:`local_model_problems`,
  :mod:`posmech.models.model_dir`): its tokenizer files are there (else the token-string
  checks below skip that model, rather than report a string of no tokens), its safetensors
  files are whole, and their shapes, read from the headers only, are those of its
  ``config.json``: the token embedding ``[vocab_size, width]``, the number of layers, layer
  0's attention projections heads x head size wide (the key and both values named);
* **every model's position scheme and context** (:mod:`posmech.models.architecture`): a
  ``config.json`` whose position scheme cannot be told is named; a model whose config
  records no context length (BLOOM) needs ``models.<m>.n_ctx``;
* **keys bounded by the context** (``taxonomy.context``, ``anatomy.context``) within it;
* **every position and length in tokens** the config asks for (:func:`position_problems`:
  the ``kernels`` query positions, the ``contextual`` positions, ``neurons.from_position``,
  ``interventions.min_tokens``, ``geometry.first_position``, the ``attn_only`` sequences, …)
  against the context of each
  model it is used on, the keys left null resolved for that model by the function its job
  resolves them with (:func:`posmech.settings.positions_for`); each message gives values that fit;
* **what the config names in tokens**, with each model's tokenizer when it is on disk
  (:func:`tokenizer_problems`): ``contextual.destination_token`` one token (else its nearest
  single tokens are suggested), the induction and repeat-string prompts within the context;
* the config's **semantic checks** (:func:`posmech.core.config.semantic_problems`: local paths,
  names of models and corpora), so that they come in the same round;
* **the weights of every model of the run already on disk** (configured, random-init twins,
  checkpoints) are the bytes its manifest records, and every checkpoint a training saved the
  bytes the training recorded (full sha256 per file, hashed once and then checked by size,
  mtime, ctime and inode); a damaged one names the rule that writes it again;
* **``device: cuda`` with no GPU visible**, when the jobs run on this machine (not when
  they are submitted to a cluster through an executor plugin);
* **a Hub model that cannot be fetched** (:func:`hub_problems`): not fetched yet, not in the
  local Hugging Face cache, and the Hub unreachable from this machine (where ``fetch_model``,
  a local rule, runs); not in a dry run (``fetches_here`` false), which fetches nothing.

Every problem names its key (or file) and the fix; all of them are reported at once.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from posmech.core.config import is_local, local_path
from posmech.core.errors import PosmechError
from posmech.models.architecture import Architecture

HEAD = re.compile(r"^L(\d+)H(\d+)$")


# --------------------------------------------------------------------------- strict YAML
class _StrictLoader(yaml.SafeLoader):
    """A safe loader that refuses a mapping with the same key twice."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None,
                f"duplicate key {key!r} (first on line {seen[key]}, again on line {line}); "
                "YAML keeps only the last one: merge the two entries into one",
                key_node.start_mark,
            )
        seen[key] = line
    return loader.construct_mapping(node, deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def strict_load(path: str | os.PathLike[str]) -> Any:
    """Parse a YAML file refusing duplicate keys; :class:`PosmechError` names the file."""
    try:
        with open(path, encoding="utf-8") as f:
            return yaml.load(f, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except OSError as err:
        raise PosmechError(f"cannot read {str(path)!r}: {err.strerror}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        ctx, cmark = getattr(err, "context", None), getattr(err, "context_mark", None)
        if ctx and cmark is not None and mark is not None and cmark.line != mark.line:
            ctx += f" begun on line {cmark.line + 1}, column {cmark.column + 1},"
        what = " ".join(x for x in (ctx, getattr(err, "problem", None)) if x) or str(err)
        raise PosmechError(f"{str(path)!r} is not valid YAML{where}: {what}") from None


# --------------------------------------------------------------------------- model shapes
@dataclass(frozen=True)
class KnownShape:
    """What the checks need to know of a model: its context, layers, heads per layer."""

    n_ctx: int
    n_layers: int
    n_heads: int
    where: str  # where the numbers come from (for messages)


def _first(cfg: dict[str, Any], *keys: str) -> int | None:
    for k in keys:
        if isinstance(cfg.get(k), int):
            return int(cfg[k])
    return None


def _hub_cached_config(entry: dict[str, Any]) -> Path | None:
    """A Hub model's config.json in the local Hugging Face cache (no download), else None."""
    try:
        from huggingface_hub import try_to_load_from_cache

        hit = try_to_load_from_cache(str(entry["source"]), "config.json", revision=entry.get("revision") or "main")
    except Exception:  # noqa: BLE001 - an odd id or cache layout: not known before the fetch
        return None
    return Path(hit) if isinstance(hit, str) else None


def known_architecture(name: str, entry: dict[str, Any],
                       base: str | os.PathLike[str] = ".") -> tuple[Architecture, str] | None:
    """The :class:`~posmech.models.architecture.Architecture` of configured model ``name``
    and where it was read, when it can be known without running anything: a ``config.json``
    on disk (a local source; ``resources/models/<name>/hf`` relative to ``base`` once
    fetched; a Hub model's config.json in the Hugging Face cache), else a trained model's
    ``train`` section; ``None`` otherwise (a Hub model neither fetched nor cached). Beside a
    config.json on disk, the names and shapes of its directory's safetensors weights are read
    too (headers only: the position table, the key heads, the MLP's gate). A config.json
    whose sizes cannot be read raises :class:`PosmechError`; a position scheme that cannot
    be told is ``unknown`` with its reason (no analysis rule is scheduled for the model)."""
    from posmech.models.architecture import architecture, train_architecture
    from posmech.models.lens import with_engine_refusal
    from posmech.models.model_dir import weight_shapes

    candidates = []
    if "source" in entry and is_local(entry["source"]):
        candidates.append(local_path(entry["source"], base) / "config.json")
    if "train" not in entry:
        candidates.append(Path(base) / "resources" / "models" / name / "hf" / "config.json")
    for c in candidates:
        try:
            cfg = json.loads(c.read_text())
        except (OSError, ValueError):  # a config.json that does not parse: model_json_problems
            continue
        if isinstance(cfg, dict):
            try:
                shapes = weight_shapes(c.parent)
            except PosmechError:  # a bad header: reported by local_model_problems
                shapes = {}
            return with_engine_refusal(architecture(cfg, f"model {name!r} ({c})", shapes or None), cfg), str(c)
    if "train" in entry:
        return train_architecture(entry["train"], f"model {name!r}"), f"models.{name}.train"
    if "source" in entry and not is_local(entry["source"]):
        cached = _hub_cached_config(entry)
        if cached is not None:
            try:
                cfg = json.loads(cached.read_text())
            except (OSError, ValueError):
                return None
            if isinstance(cfg, dict):
                return with_engine_refusal(architecture(cfg, f"model {name!r} ({entry['source']})"), cfg), str(cached)
    return None


def known_shape(name: str, entry: dict[str, Any], base: str | os.PathLike[str] = ".") -> KnownShape | None:
    """The exact shape of configured model ``name`` when it can be known without running
    anything (:func:`known_architecture`; a context its config does not record is
    ``models.<name>.n_ctx``); ``None`` otherwise."""
    try:
        found = known_architecture(name, entry, base)
    except PosmechError:  # reported by architecture_problems
        return None
    if found is None:
        return None
    arch, where = found
    ctx = arch.context or entry.get("n_ctx")
    if not ctx:
        return None
    return KnownShape(int(ctx), arch.n_layers, arch.n_heads, where)


def effective_context(entry: dict[str, Any], shape: KnownShape) -> int:
    """Tokens per document the pipeline uses: ``models.<m>.n_ctx`` or the model's context."""
    return int(entry.get("n_ctx") or shape.n_ctx)


# --------------------------------------------------------------------------- checks
def duplicate_key_problems(paths: Iterable[str | os.PathLike[str]]) -> list[str]:
    """One message per config file that has a duplicate key (or does not parse)."""
    out = []
    for p in paths:
        try:
            strict_load(p)
        except PosmechError as err:
            out.append(f"config file {err}")
    return out


def _schema_file_keys(schema: dict[str, Any], root: dict[str, Any] | None = None,
                      prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Key paths (within fixed sections) whose schema says ``format: repo-file``."""
    root = root or schema
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        node: Any = root
        for part in ref[2:].split("/"):
            node = node[part]
        schema = node
    if schema.get("format") == "repo-file":
        return [prefix]
    out = []
    for name, sub in (schema.get("properties") or {}).items():
        out += _schema_file_keys(sub, root, (*prefix, name))
    return out


def _get(config: dict[str, Any], keys: tuple[str, ...]) -> Any:
    node: Any = config
    for k in keys:
        if not isinstance(node, dict) or k not in node:
            return None
        node = node[k]
    return node


def repo_path(value: str, repo: str | os.PathLike[str]) -> Path:
    """A repository file named in the config: absolute paths (and ``~``) are kept,
    others are relative to the repository."""
    p = Path(os.path.expanduser(value))
    return p if p.is_absolute() else Path(repo) / p


def file_problems(config: dict[str, Any], schema: dict[str, Any], repo: str | os.PathLike[str]) -> list[str]:
    """Every file the config names (``format: repo-file`` keys) exists, is a file, and,
    when it is YAML, parses without duplicate keys; ``resources/published.yaml`` too."""
    out = []
    for keys in _schema_file_keys(schema):
        value = _get(config, keys)
        if not isinstance(value, str):
            continue
        key = ".".join(keys)
        p = repo_path(value, repo)
        if not p.exists():
            out.append(f"config key `{key}`: file {str(p)!r} does not exist "
                       "(a path relative to the repository, or absolute)")
        elif not p.is_file():
            out.append(f"config key `{key}`: {str(p)!r} is not a file")
        elif p.suffix in (".yaml", ".yml"):
            try:
                strict_load(p)
            except PosmechError as err:
                out.append(f"config key `{key}`: {err}")
    published = Path(repo) / "resources" / "published.yaml"
    if published.exists():
        try:
            from posmech.verdicts.scorecard import load_published

            strict_load(published)
            load_published(published)
        except PosmechError as err:
            out.append(f"published values: {err}")
    return out


def _heads_problems(key: str, heads: Iterable[str], shape: KnownShape | None) -> list[str]:
    out = []
    for h in heads:
        m = HEAD.match(str(h))
        if m is None:
            out.append(f"config key `{key}`: {h!r} is not a head name `L{{layer}}H{{head}}`")
        elif shape is not None and (int(m[1]) >= shape.n_layers or int(m[2]) >= shape.n_heads):
            out.append(
                f"config key `{key}`: the model has no head {h} ({shape.n_layers} layers L0-L{shape.n_layers - 1}, "
                f"{shape.n_heads} heads per layer H0-H{shape.n_heads - 1}; from {shape.where})"
            )
    return out


def _selected(config: dict[str, Any], section: str) -> list[str]:
    from posmech.core.config import selected

    return selected(config, section, "models")


def model_problems(config: dict[str, Any], base: str | os.PathLike[str] = ".") -> list[str]:
    """Checks that need the model's shape (see the module docstring)."""
    out: list[str] = []
    models = config["models"]
    shapes = {n: known_shape(n, e, base) for n, e in models.items()}
    for name, entry in models.items():
        s = shapes[name]
        if s is not None and entry.get("n_ctx") and int(entry["n_ctx"]) > s.n_ctx:
            out.append(
                f"config key `models.{name}.n_ctx`: {entry['n_ctx']} is beyond the model's context of "
                f"{s.n_ctx} tokens (from {s.where}); give at most {s.n_ctx}, or null for the model's context"
            )
    pins = (config.get("taxonomy") or {}).get("pin") or {}
    for name, pin in pins.items():
        if name not in models:
            out.append(f"config key `taxonomy.pin.{name}`: no model {name!r} is defined; "
                       f"defined models are {', '.join(sorted(models))}")
            continue
        heads = ([pin["sharp"]] if pin.get("sharp") else []) + list(pin.get("early") or [])
        out += _heads_problems(f"taxonomy.pin.{name}", heads, shapes[name])
    iv = config.get("interventions") or {}
    ko = iv.get("prev_knockout") or {}
    if "period" in ko and "phase" in ko and int(ko["phase"]) >= int(ko["period"]):
        out.append(f"config key `interventions.prev_knockout.phase`: {ko['phase']} must be below "
                   f"`period` ({ko['period']}); no query position would be knocked out otherwise")
    for name in _selected(config, "interventions") if iv else []:
        s = shapes.get(name)
        if s is None:
            continue
        bad = [x for x in ko.get("layers") or [] if int(x) >= s.n_layers]
        if bad:
            out.append(f"config key `interventions.prev_knockout.layers`: model {name!r} has no layer "
                       f"{', '.join(map(str, bad))} ({s.n_layers} layers, 0-{s.n_layers - 1}; from {s.where})")
    return out


# --------------------------------------------------------------------------- positions and lengths
def _runs(config: dict[str, Any], section: str, rule: str, base: str | os.PathLike[str]) -> list[tuple[str, int, str]]:
    """``(model, context, where)`` of every model of ``section`` whose shape is known
    before any job and that ``rule`` runs on (posmech.pipeline.applicability); ``context``: the
    tokens per document the pipeline uses (``models.<m>.n_ctx`` or the model's)."""
    from posmech.pipeline.applicability import not_applicable

    out = []
    for name in _selected(config, section):
        entry = config["models"][name]
        s = known_shape(name, entry, base)
        if s is None:
            continue
        try:
            found = known_architecture(name, entry, base)
        except PosmechError:
            continue
        if found is not None and rule in not_applicable(found[0]):
            continue
        where = f"models.{name}.n_ctx" if entry.get("n_ctx") else s.where
        out.append((name, effective_context(entry, s), where))
    return out


#: the sections whose positions :func:`posmech.settings.positions_for` resolves, each with the
#: rule whose models it is checked for and the context its jobs resolve it at: ``documents``,
#: the tokens per document (``models.<m>.n_ctx`` or the model's context: positional_kernels'
#: analysis_context, the interventions' tokens), or ``model``, the model's own context (the
#: contextual section's layer-0 weights, and the neurons section's layer0.h5, which records it)
POSITION_SECTIONS: dict[str, tuple[str, str]] = {
    "kernels": ("positional_kernels", "documents"),
    "contextual": ("layer0_decomposition", "model"),
    "neurons": ("extended_token_embeddings", "model"),
    "interventions": ("prev_knockout", "documents"),
}


def section_positions(config: dict[str, Any], section: str, base: str | os.PathLike[str] = ".") -> dict[str, Any]:
    """``{model: resolved settings, or the PositionError}`` of config section ``section`` (one
    of :data:`POSITION_SECTIONS`, defaults filled) for every model it runs on whose context is
    known before any job (:func:`_runs`): :func:`posmech.settings.positions_for` at the context
    its jobs resolve it at, so the values are those the jobs will use."""
    from posmech.settings import PositionError, positions_for, settings_class

    rule, context = POSITION_SECTIONS[section]
    given = settings_class(section).from_section(config[section])
    # neurons.from_position stays below the contextual section's max_position (null: n_ctx - 2)
    mp = (config.get("contextual") or {}).get("max_position") if section == "neurons" else None
    out: dict[str, Any] = {}
    for name, ctx, where in _runs(config, section, rule, base):
        if context == "model":  # the rules use the model's own context
            s = known_shape(name, config["models"][name], base)
            ctx, where = (s.n_ctx if s is not None else ctx), ""
        try:
            out[name] = positions_for(given, ctx, name, where, max_position=None if mp is None else int(mp))
        except PositionError as err:
            out[name] = err
    return out


def position_problems(config: dict[str, Any], base: str | os.PathLike[str] = ".") -> list[str]:
    """Every position or length in tokens the config asks for, against the context of each
    model it is used on (:func:`_runs`): the sections of :data:`POSITION_SECTIONS` resolved
    and checked by :func:`posmech.settings.positions_for` (:func:`section_positions`), as
    their jobs resolve them (its messages name the key, the model and its context, and values
    that fit it: what null would give, in the schema's words), then
    ``geometry.first_position`` and the ``attn_only`` settings and sequence lengths."""
    from posmech.settings import PositionError

    out: list[str] = []
    for section in POSITION_SECTIONS:
        if config.get(section):
            out += [msg for r in section_positions(config, section, base).values()
                    if isinstance(r, PositionError) for msg in r.problems]
    ge = config.get("geometry")
    if ge and ge.get("first_position") is not None:
        for name, ctx, where in _runs(config, "geometry", "extended_positional_embeddings", base):
            s = known_shape(name, config["models"][name], base)
            n_ctx = s.n_ctx if s is not None else ctx  # the repeated-token prompts fill the model's context
            if int(ge["first_position"]) > n_ctx - 4:
                out.append(f"config key `geometry.first_position`: model {name!r} has a context of {n_ctx} tokens: "
                           f"{ge['first_position']} leaves fewer than 4 positions for the PCA; set it to at most "
                           f"{n_ctx - 4}, or null (the first repeated-token position)")
    ao = config.get("attn_only")
    if ao:
        from posmech.settings.attn_only import AttnOnlySettings

        settings = AttnOnlySettings.from_section(ao)
        try:
            settings.check()
        except PosmechError as err:  # "attn_only.<key>: why"
            key, _, why = str(err).partition(": ")
            out.append(f"config key `{key}`: {why}")

        for name, ctx, where in _runs(config, "attn_only", "random_token_patterns", base):
            bos = settings.bos_for(config["models"][name])
            for key, n in settings.sequence_lengths(bos).items():
                if n > ctx:
                    fit = settings.largest_fitting(key, ctx, bos)
                    out.append(f"config key `{key}`: model {name!r} has a context of {ctx} tokens (from {where}) "
                               f"and these sequences are {n} tokens; set it to at most {fit}, which fits")
    return out


class _Encoding(dict):
    """``input_ids`` and ``offset_mapping`` of one text, as keys and as attributes."""

    __getattr__ = dict.__getitem__


class JsonTokenizer:
    """The part of a Hugging Face fast tokenizer the checks before any job use, read from
    its ``tokenizer.json`` with the ``tokenizers`` library: calling it on a text (with
    ``add_special_tokens`` and ``return_offsets_mapping``), ``decode``, ``bos_token_id``,
    ``all_special_ids``, ``len``. It gives what ``AutoTokenizer`` gives for the same
    directory (tests/test_preflight.py), without importing transformers and torch, which
    would add seconds to every Snakemake start."""

    def __init__(self, d: Path):
        from tokenizers import Tokenizer

        self._t = Tokenizer.from_file(str(d / "tokenizer.json"))
        try:
            cfg = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            cfg = {}
        cfg = cfg if isinstance(cfg, dict) else {}
        bos = cfg.get("bos_token")
        bos = bos.get("content") if isinstance(bos, dict) else bos
        self.bos_token_id = self._t.token_to_id(bos) if isinstance(bos, str) else None
        self.all_special_ids = sorted(i for i, t in self._t.get_added_tokens_decoder().items() if t.special)
        self._cleanup = bool(cfg.get("clean_up_tokenization_spaces", False)) and (
            type(self._t.model).__name__ != "BPE"
            or bool(cfg.get("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", False)))

    def __len__(self) -> int:
        return int(self._t.get_vocab_size(with_added_tokens=True))

    def __call__(self, text: str, add_special_tokens: bool = True, return_offsets_mapping: bool = False) -> _Encoding:
        enc = self._t.encode(text, add_special_tokens=add_special_tokens)
        out = _Encoding(input_ids=list(enc.ids))
        if return_offsets_mapping:
            out["offset_mapping"] = [tuple(o) for o in enc.offsets]
        return out

    def decode(self, ids: list[int]) -> str:
        text = self._t.decode(list(ids), skip_special_tokens=False)
        if self._cleanup:  # transformers' clean_up_tokenization
            for a, b in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                         (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
                text = text.replace(a, b)
        return text


def known_tokenizer(name: str, entry: dict[str, Any], base: str | os.PathLike[str] = ".") -> Any | None:
    """The tokenizer of configured model ``name`` when it is on disk before any job (a local
    source; ``resources/models/<name>/hf`` once fetched or trained), else ``None`` (a Hub
    model not fetched, a model not trained yet: its rules check at run time): a
    :class:`JsonTokenizer` where the directory has a ``tokenizer.json``, else
    ``AutoTokenizer``'s."""
    from posmech.models.loading import load_tokenizer
    from posmech.models.model_dir import tokenizer_problem

    dirs = []
    if "source" in entry and is_local(entry["source"]):
        dirs.append(local_path(entry["source"], base))
    dirs.append(Path(base) / "resources" / "models" / name / "hf")
    for d in dirs:
        if not (d / "config.json").is_file() or tokenizer_problem(d) is not None:
            continue  # no tokenizer files: local_model_problems says so, not a token count of 0
        try:
            return JsonTokenizer(d) if (d / "tokenizer.json").is_file() else load_tokenizer(d)
        except Exception:  # noqa: BLE001 - no tokenizer files there: nothing known before the fetch
            continue
    return None


def nearest_tokens(tokenizer: Any, text: str, n: int = 5) -> list[str]:
    """Up to ``n`` single tokens of ``tokenizer`` whose text is closest to ``text``
    (difflib's ratio over every token's decoded text), for suggestions."""
    import difflib

    vocab = {}
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    for i in range(len(tokenizer)):
        if i in special:
            continue
        try:
            vocab.setdefault(tokenizer.decode([i]), i)
        except Exception:  # noqa: BLE001 - an id the tokenizer cannot decode alone
            continue
    return difflib.get_close_matches(text, list(vocab), n=n, cutoff=0.0)


def tokenizer_problems(config: dict[str, Any], repo: str | os.PathLike[str],
                       base: str | os.PathLike[str] = ".") -> list[str]:
    """What the config names in tokens, with the tokenizer of every model it is used on
    that is on disk before any job (:func:`known_tokenizer`): ``contextual.destination_token``
    must be one token (the nearest single tokens are suggested); the induction prompt
    (``interventions.induction_intervention.prompt``: the prompt, BOS included, within the
    context; its words' tokens are checked by the rule) and the repeat-string prompts (``posembed_averaging.prompts``:
    each prompt with BOS and its longest target within the context, else it would be cut)."""
    from posmech.analyses.contextual import single_token
    from posmech.data.prompts import load_prompts, variant_token_ids

    out: list[str] = []
    cache: dict[str, Any] = {}

    def tok(name: str) -> Any:
        if name not in cache:
            cache[name] = known_tokenizer(name, config["models"][name], base)
        return cache[name]

    cx = config.get("contextual") or {}
    if cx.get("destination_token"):
        for name, _, _ in _runs(config, "contextual", "layer0_decomposition", base):
            t = tok(name)
            if t is None:
                continue
            try:
                single_token(t, cx["destination_token"], "contextual.destination_token")
            except PosmechError as err:
                near = ", ".join(repr(x) for x in nearest_tokens(t, cx["destination_token"]))
                out.append(f"{err} (model {name!r}); its nearest single tokens: {near}")
    ind = ((config.get("interventions") or {}).get("induction_intervention") or {}).get("prompt")
    if isinstance(ind, str) and repo_path(ind, repo).is_file():
        try:
            spec = strict_load(repo_path(ind, repo))
        except PosmechError:
            spec = None  # reported by file_problems
        if isinstance(spec, dict):
            for name, _, _ in _runs(config, "interventions", "induction_intervention", base):
                t, s = tok(name), known_shape(name, config["models"][name], base)
                if t is None or s is None:
                    continue
                bos = t.bos_token_id if config["models"][name].get("prepend_bos", True) else None
                n = (bos is not None) + len(t(str(spec.get("prompt", "")), add_special_tokens=False).input_ids)
                if n > s.n_ctx:
                    out.append(f"config key `interventions.induction_intervention.prompt`: the prompt of {ind!r} is "
                               f"{n} tokens for model {name!r} (BOS included) and its context is {s.n_ctx}; choose "
                               "a shorter prompt file (resources/prompts/induction_short.yaml for a BPE tokenizer, "
                               "induction_chars.yaml for a character-level one)")
                    # the words' tokens are checked by the rule itself (a toy tokenizer without
                    # their characters is refused there, for the runs that ask for P16)
    pa = config.get("posembed_averaging") or {}
    if isinstance(pa.get("prompts"), str) and repo_path(pa["prompts"], repo).is_file():
        try:
            prompts = load_prompts(repo_path(pa["prompts"], repo), list(pa.get("prompt_ids") or []) or None)
        except PosmechError:
            prompts = []  # reported by prompt_problems
        for name, _, _ in _runs(config, "posembed_averaging", "posembed_averaging", base) if prompts else []:
            t, s = tok(name), known_shape(name, config["models"][name], base)
            if t is None or s is None:
                continue
            bos = 1 if config["models"][name].get("prepend_bos", True) else 0
            for p in prompts:
                longest = max(len(v) for vs in p.targets.values() for v in variant_token_ids(t, vs) or [[0]])
                n = bos + len(t(p.text, add_special_tokens=False).input_ids) + longest - 1
                if n > s.n_ctx:
                    out.append(f"config key `posembed_averaging.prompts`: prompt {p.id!r} is {n} tokens for model "
                               f"{name!r} (BOS, the prompt, its longest target less one) and its context is "
                               f"{s.n_ctx}: it would be cut; choose a shorter prompt file (e.g. "
                               "resources/prompts/repeat_string_short.yaml) or fewer `prompt_ids`")
    return out


def architecture_problems(config: dict[str, Any], base: str | os.PathLike[str] = ".") -> list[str]:
    """Every model whose configuration is known before any job (:func:`known_architecture`)
    has a position scheme posmech can tell, and a context length: its config.json's, else
    ``models.<m>.n_ctx`` (BLOOM records none); the error names the key to set. A GPT-NeoX
    model needs ``processing: raw`` (TransformerLens 4.3's compatibility mode is wrong on it)."""
    from posmech.models.architecture import context_length

    out = []
    for name, entry in config["models"].items():
        try:
            found = known_architecture(name, entry, base)
            if found is not None:
                context_length(found[0], name, entry.get("n_ctx"))
                if found[0].model_type == "gpt_neox" and entry.get("processing", "compatibility") == "compatibility":
                    out.append(
                        f"config key `models.{name}.processing`: model {name!r} is a GPT-NeoX (Pythia) model, and "
                        "TransformerLens 4.3's compatibility mode computes its MLP wrongly (on a random tiny GPT-NeoX, "
                        "layer 0's hook_mlp_out differs from Hugging Face's by ~12 and layer 1's pattern by ~1, "
                        "tests/analyses/test_anatomy_raw_scores.py); set `processing: raw` (exact against "
                        "Hugging Face) for this model")
        except PosmechError as err:
            out.append(str(err))
    return out


def model_json_problems(config: dict[str, Any], base: str | os.PathLike[str] = ".") -> list[str]:
    """Every model ``config.json`` on disk (a local source's, a fetched or trained model's
    ``resources/models/<m>/hf/``) parses as a JSON object: an error names the file, the
    line and the column."""
    out = []
    for name, entry in config["models"].items():
        cands = []
        if "source" in entry and is_local(entry["source"]):
            cands.append((f"config key `models.{name}.source`: ", local_path(entry["source"], base) / "config.json"))
        cands.append((f"model {name!r}: ", Path(base) / "resources" / "models" / name / "hf" / "config.json"))
        for what, c in cands:
            try:
                text = c.read_text(encoding="utf-8")
            except FileNotFoundError:
                continue
            except (OSError, UnicodeDecodeError) as err:
                out.append(f"{what}{str(c)!r} cannot be read ({err})")
                continue
            try:
                doc = json.loads(text)
            except json.JSONDecodeError as err:
                out.append(f"{what}{str(c)!r} is not valid JSON: line {err.lineno}, column {err.colno}: {err.msg}; "
                           "fix that line (or save the model again with `save_pretrained(dir)`)")
                continue
            if not isinstance(doc, dict):
                out.append(f"{what}{str(c)!r} is a JSON {type(doc).__name__}, not an object of model settings")
    return out


def local_model_problems(config: dict[str, Any], base: str | os.PathLike[str] = ".") -> list[str]:
    """Every local model directory (``models.<m>.source`` a path; each directory read once,
    however many models name it) agrees with itself (:mod:`posmech.models.model_dir`): its
    tokenizer files are there, its safetensors weights are whole and their shapes, read from
    the files' headers (no weight is loaded), are those its ``config.json`` gives (width,
    layers, vocabulary, heads x head size). A legacy TransformerLens ``.pth`` checkpoint
    (converted by ``fetch_model``) has its tokenizer checked, not its shapes. A directory or
    config.json that is missing or does not parse is reported by ``semantic_problems`` and
    :func:`model_json_problems`."""
    from posmech.models.loading import check_safetensors
    from posmech.models.architecture import is_tl_config
    from posmech.models.model_dir import shape_problems, tokenizer_problem, weight_files

    dirs: dict[Path, list[str]] = {}
    for name, entry in config["models"].items():
        src = entry.get("source")
        if "train" in entry or not isinstance(src, str) or not is_local(src):
            continue
        dirs.setdefault(local_path(src, base), []).append(name)
    out = []
    for d, names in dirs.items():
        try:
            cfg = json.loads((d / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(cfg, dict):
            continue
        keys = ", ".join(f"`models.{n}.source`" for n in names)
        key = f"config key{'s' if len(names) > 1 else ''} {keys}"
        found = [p for p in [tokenizer_problem(d, cfg)] if p]
        weights = sorted(d.glob("*.safetensors"))
        if weights:
            try:  # each header read once: whole files (as fetch_model checks them), then the shapes
                model = set(weight_files(d))
                shapes: dict[str, tuple[tuple[int, ...], str]] = {}
                for w in sorted(set(weights) | model):
                    got = check_safetensors(w, key)
                    if w in model:
                        shapes.update({k: (v, w.name) for k, v in got.items()})
                found += shape_problems(d, cfg, shapes)
            except PosmechError as err:
                found.append(str(err).removeprefix(f"{key}: "))
            except ValueError as err:  # an index that does not parse
                found.append(f"{str(d / 'model.safetensors.index.json')!r} cannot be read ({err})")
        elif not is_tl_config(cfg):  # a TransformerLens .pth is converted by fetch_model
            found.append(f"{str(d)!r} has no .safetensors weights; posmech loads safetensors only (re-save with "
                         "`model.save_pretrained(dir, safe_serialization=True)`)")
        out += [f"{key}: {p}" for p in found]
    return out


def context_problems(config: dict[str, Any], base: str | os.PathLike[str] = ".") -> list[str]:
    """Keys bounded by a model's context (documents cut to that many tokens) within the
    context of every model their section runs on: ``taxonomy.context``, ``anatomy.context``
    (the tokens file holds at most ``models.<m>.n_ctx`` or the model's context tokens per
    document, so a longer context would find no document)."""
    out = []
    models = config["models"]
    for section in ("taxonomy", "anatomy"):
        asked = (config.get(section) or {}).get("context")
        if not asked:
            continue
        for name in _selected(config, section):
            s = known_shape(name, models[name], base)
            if s is None:
                continue
            ctx = effective_context(models[name], s)
            if int(asked) > ctx:
                out.append(f"config key `{section}.context`: {asked} tokens is beyond the context of model {name!r}, "
                           f"{ctx} tokens (from {s.where if not models[name].get('n_ctx') else f'models.{name}.n_ctx'}); "
                           f"give at most {ctx}, or null for the whole context")
    return out


def prompt_problems(config: dict[str, Any], repo: str | os.PathLike[str]) -> list[str]:
    """The prompt files' content: the repeat-string file (``posembed_averaging.prompts``)
    has the documented shape and every ``prompt_ids`` entry; the induction prompt file
    (``interventions.induction_intervention.prompt``) is a mapping with its keys, and its
    text contains its ``words`` (:func:`posmech.analyses.interventions.induction_spec_problems`).
    A file that does not exist is reported by :func:`file_problems`."""
    from posmech.analyses.interventions import induction_spec_problems
    from posmech.data.prompts import load_prompts

    out = []
    pa = config.get("posembed_averaging") or {}
    if isinstance(pa.get("prompts"), str):
        p = repo_path(pa["prompts"], repo)
        if p.is_file():
            try:
                load_prompts(p, list(pa.get("prompt_ids") or []) or None)
            except PosmechError as err:
                out.append(f"config key `posembed_averaging.prompts` / `prompt_ids`: {err}")
    ind = ((config.get("interventions") or {}).get("induction_intervention") or {}).get("prompt")
    if isinstance(ind, str):
        p = repo_path(ind, repo)
        if p.is_file():
            try:
                spec = strict_load(p)
            except PosmechError:
                spec = None  # reported by file_problems
            else:
                out += [f"config key `interventions.induction_intervention.prompt`: {str(p)!r}: {msg}"
                        for msg in induction_spec_problems(spec)]
    return out


def run_models(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every model of the run, ``{name: entry}``: the configured ones, their random-init twins
    (:func:`posmech.models.twin.add_twins`) and their checkpoints
    (:func:`posmech.models.checkpoints.add_checkpoints`), added to a copy of ``config`` as
    :func:`posmech.pipeline.study.prepare` adds them after these checks. A config they cannot
    be added to gives the configured models only (``prepare`` names the key)."""
    import copy

    from posmech.models.checkpoints import add_checkpoints
    from posmech.models.twin import add_twins

    cfg = copy.deepcopy(config)
    try:
        add_twins(cfg)
        add_checkpoints(cfg)
    except PosmechError:
        return dict(config["models"])
    return dict(cfg["models"])


def weights_problems(config: dict[str, Any], base: str | os.PathLike[str] = ".") -> list[str]:
    """Every model of the run already on disk (:func:`run_models`: configured, twins,
    checkpoints; a manifest under ``resources/models/<m>/``) has the weights its manifest
    records, and every checkpoint a training saved (``resources/models/<m>/checkpoints/step<N>/``)
    those the training recorded (:func:`posmech.models.training.saved_checkpoint_manifest`),
    which rule ``checkpoint_model`` would copy (:func:`posmech.models.loading.verify_weights`:
    a stat per file once they are hashed). A damaged model is refused here, before Snakemake
    deletes the outputs of a job that reads it, naming the file and the rule that writes it
    again."""
    from posmech.models.loading import read_manifest, verify_weights
    from posmech.models.training import CHECKPOINTS_SUBDIR, saved_checkpoint_manifest

    models = Path(base) / "resources" / "models"
    out = []
    for name, entry in run_models(config).items():
        manifest = models / name / "manifest.json"
        try:
            if "checkpoint_of" in entry and "train" in entry and entry.get("step") is not None:
                # a checkpoint saved without a record (an older training) is refused only when
                # rule checkpoint_model must copy it (no manifest yet): the rule refuses it
                saved = saved_checkpoint_manifest(entry["checkpoint_of"], int(entry["step"]),
                                                  models / entry["checkpoint_of"] / CHECKPOINTS_SUBDIR,
                                                  require_record=not manifest.is_file())
                if saved is not None:
                    verify_weights(saved)
        except PosmechError as err:
            out.append(str(err))
        if not manifest.is_file():
            continue
        try:
            read_manifest(manifest)
        except PosmechError as err:
            out.append(str(err))
    return out


def hub_problems(config: dict[str, Any], base: str | os.PathLike[str] = ".") -> list[str]:
    """A Hub model (``source`` a Hub id) that ``fetch_model`` would have to download while the
    Hub cannot be reached from this machine (``fetch_model`` runs here: a local rule), and
    that is neither fetched yet (``resources/models/<m>/hf``) nor in the local Hugging Face
    cache (which ``fetch_model`` copies offline): one message per model naming its key and
    the fixes. The Hub is tried (one TCP connection, :func:`posmech.core.errors.hub_unreachable`)
    only when such a model is configured."""
    from posmech.core.errors import hub_unreachable
    from posmech.models.loading import TL_LEGACY_PREFIXES, cached_hub_snapshot

    need = []
    for name, entry in config["models"].items():
        src = entry.get("source")
        if "train" in entry or not isinstance(src, str) or is_local(src):
            continue
        # the model's own revision and every checkpoint of its sweep (`revisions`, each the
        # model `<name>@<revision>`, posmech.models.checkpoints)
        revs = [(name, "source", str(entry.get("revision") or "main"))]
        revs += [(f"{name}@{r}", "revisions", str(r)) for r in entry.get("revisions") or []]
        for run_name, key, rev in revs:
            if (Path(base) / "resources" / "models" / run_name / "hf" / "config.json").exists():
                continue
            if cached_hub_snapshot(src, rev) is None:
                need.append((name, key, src, rev, run_name))
    if not need:
        return []
    why = hub_unreachable()
    if why is None:
        return []
    out = []
    for name, key, src, rev, run_name in need:
        cache = ("" if src.startswith(TL_LEGACY_PREFIXES) else
                 f"; or put it in the local Hugging Face cache on a machine that reaches the Hub "
                 f"(`huggingface-cli download {src} --revision {rev}`, the same HF_HOME) and run again: "
                 "`fetch_model` copies a cached model without the Hub (HF_HUB_OFFLINE=1 may stay set)")
        out.append(
            f"config key `models.{name}.{key}`: Hub model {src!r} (revision {rev!r}) is not fetched "
            f"(resources/models/{run_name}/hf) nor in the local Hugging Face cache, and the Hub cannot be reached "
            f"({why}), so `fetch_model` would fail. Fixes: set its `source` to a local copy (a "
            "directory written by `model.save_pretrained(dir)` and `tokenizer.save_pretrained(dir)`, "
            f"safetensors){cache}; or run the offline demo, `--configfile config/demo.yaml`")
    return out


def device_problems(config: dict[str, Any], jobs_run_here: bool = True) -> list[str]:
    """``device: cuda`` for a model whose jobs run on this machine, which has no GPU."""
    cuda = [n for n, e in config["models"].items() if e.get("device") == "cuda"]
    if not cuda or not jobs_run_here:
        return []
    import torch

    if torch.cuda.is_available():
        return []
    return [f"config key `models.{n}.device`: `cuda` but no CUDA device is visible on this machine; "
            "set `device: auto` (GPU when there is one) or `cpu`, or submit the jobs to a GPU "
            "cluster (`--workflow-profile profiles/slurm`)" for n in cuda]


def _profile_executor(profile: str) -> str | None:
    for cand in (Path(profile) / "config.yaml", Path(profile) / "config.v8+.yaml"):
        try:
            doc = yaml.safe_load(cand.read_text())
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(doc, dict) and doc.get("executor"):
            return str(doc["executor"])
    return None


def jobs_run_locally(argv: list[str], environ: dict[str, str] | None = None) -> bool:
    """Whether this Snakemake invocation runs its jobs on this machine: no ``--executor``
    (``-e``) other than ``local``/``dryrun``/``touch``, and no ``--profile`` /
    ``--workflow-profile`` (or ``$SNAKEMAKE_PROFILE``) that names another executor.
    (Snakemake parses the Snakefile before it knows its executor, hence the command line.)"""
    environ = dict(os.environ) if environ is None else environ
    local = {"local", "dryrun", "touch"}
    executor: str | None = None
    profiles = [environ["SNAKEMAKE_PROFILE"]] if environ.get("SNAKEMAKE_PROFILE") else []
    for i, a in enumerate(argv):
        nxt = argv[i + 1] if i + 1 < len(argv) else ""
        if a in ("--executor", "-e"):
            executor = nxt
        elif a.startswith("--executor="):
            executor = a.split("=", 1)[1]
        elif a in ("--profile", "--workflow-profile"):
            profiles.append(nxt)
        elif a.startswith(("--profile=", "--workflow-profile=")):
            profiles.append(a.split("=", 1)[1])
    if executor is None:
        for prof in profiles:
            executor = _profile_executor(prof) or executor
    return executor is None or executor in local


def preflight(config: dict[str, Any], schema: dict[str, Any], repo: str | os.PathLike[str],
              configfiles: Iterable[str | os.PathLike[str]] = (), base: str | os.PathLike[str] = ".",
              jobs_run_here: bool = True, check_weights: bool = True, fetches_here: bool = True) -> None:
    """Run every check above on a config already validated by the schema (defaults
    filled; its semantic checks, :func:`posmech.core.config.semantic_problems`, are made again
    here, so that a caller validating with ``semantic=False`` gets them in the same round);
    raise one :class:`PosmechError` listing every problem."""
    from posmech.core.config import semantic_problems

    problems = duplicate_key_problems(configfiles)
    problems += semantic_problems(config, str(base))
    problems += file_problems(config, schema, repo)
    problems += model_problems(config, base)
    problems += model_json_problems(config, base)
    problems += local_model_problems(config, base)
    problems += architecture_problems(config, base)
    problems += context_problems(config, base)
    problems += position_problems(config, base)
    problems += prompt_problems(config, repo)
    problems += tokenizer_problems(config, repo, base)
    if check_weights:
        problems += weights_problems(config, base)
    problems += device_problems(config, jobs_run_here)
    if fetches_here:
        problems += hub_problems(config, base)
    if problems:
        raise PosmechError("invalid configuration or inputs (checked before any job runs; nothing was run, deleted "
                           "or touched):\n  - "
                           + "\n  - ".join(problems))


# --------------------------------------------------------------------------- without Snakemake
def _merge(into: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Snakemake's ``update_config``: nested mappings merged, other values replaced."""
    for k, v in new.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v
    return into


def check_config(configfiles: list[str | os.PathLike[str]], repo: str | os.PathLike[str],
                 base: str | os.PathLike[str] = ".") -> None:
    """Every check the workflow makes before any job, without Snakemake (``python -m
    posmech check-config``): each config file parses (a YAML syntax error is named with
    its file, line and column, which Snakemake's own "Config file is not valid JSON or
    YAML" does not), the merged config passes the schema and :func:`preflight`.  No
    config file: ``config/config.yaml`` of the repository, as the Snakefile."""
    from posmech.core.config import load_schema, validate_config

    files = [Path(f) for f in configfiles] or [Path(repo) / "config" / "config.yaml"]
    config: dict[str, Any] = {}
    problems = []
    for f in files:
        try:
            doc = strict_load(f)
        except PosmechError as err:
            problems.append(f"config file {err}")
            continue
        if not isinstance(doc, dict):
            problems.append(f"config file {str(f)!r} holds no mapping of keys (empty, or a {type(doc).__name__})")
            continue
        _merge(config, doc)
    if problems:
        raise PosmechError("invalid configuration (checked before any job runs):\n  - " + "\n  - ".join(problems))
    schema = load_schema(Path(repo) / "workflow" / "schemas" / "config.schema.yaml")
    validate_config(config, schema, str(base), semantic=False)  # reported by preflight, with the rest
    preflight(config, schema, repo=repo, configfiles=files, base=base)


def architectures(config: dict[str, Any], twin_of: dict[str, str], checkpoint_of: dict[str, str],
                  base: str | os.PathLike[str] = ".") -> dict[str, Architecture | None]:
    """Every configured model's :class:`~posmech.models.architecture.Architecture`, read once
    before any job (:func:`known_architecture`; None: a Hub model neither fetched nor in the
    local cache); a twin and a checkpoint have their model's."""
    out: dict[str, Architecture | None] = {}
    for m in config["models"]:
        source = checkpoint_of.get(twin_of.get(m, m), twin_of.get(m, m))
        found = known_architecture(source, config["models"][source], base)
        out[m] = found[0] if found else None
    return out
