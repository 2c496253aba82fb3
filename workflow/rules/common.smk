# Helpers shared by every stage: config validation (before any job runs) and paths.
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.io import apply_wildcards, strip_wildcard_constraints

sys.path.insert(0, str(Path(workflow.basedir).parent / "src"))

from posmech.config import (
    load_schema,
    model_kind,
    model_names_by_kind,
    selected,
    validate_config,
)
import posmech.config as posmech_config
from posmech.errors import PosmechError
from posmech.preflight import jobs_run_locally, preflight

# workflow/rules/ -> the repository (also when another Snakefile includes this file)
_REPO_OF_THIS_FILE = Path(
    workflow.current_basedir.get_path_or_uri(secret_free=True)
).parents[1]
try:
    _schema = load_schema(workflow.source_path("../schemas/config.schema.yaml"))
    # semantic problems (missing paths, unknown names): preflight reports them with the rest
    validate_config(config, _schema, semantic=False)
    # Duplicate YAML keys, every named file, the model's shape, the device: see
    # src/posmech/preflight.py (one call, before any job is scheduled).
    preflight(
        config,
        _schema,
        repo=_REPO_OF_THIS_FILE,
        configfiles=workflow.configfiles,
        jobs_run_here=workflow.is_main_process and jobs_run_locally(sys.argv),
        check_weights=workflow.is_main_process,
        # a dry run fetches nothing: a Hub model's reachability is checked for real runs only
        fetches_here=workflow.is_main_process and not workflow.output_settings.dryrun,
    )
except PosmechError as err:
    raise WorkflowError(str(err)) from None

# A live run in this working directory (posmech.runs): `--unlock` is refused while one
# is, and a left-over lock is explained (before Snakemake's LockException).
if workflow.is_main_process:
    from posmech.runs import lock_report

    _lock_msg, _refuse = lock_report(unlocking="--unlock" in sys.argv)
    if _refuse:
        raise WorkflowError(_lock_msg)
    if _lock_msg:
        print(_lock_msg, file=sys.stderr)


# Random-init twins (config section `twins`; posmech.models.twin): a model `<m>-twin` of
# the same architecture with seeded random weights, added after the checks above (it is
# built from its model's config.json by rule build_twin, and listed wherever its model is).
from posmech.models.twin import add_twins, twins_of

TWINS = add_twins(config)
TWIN_OF = twins_of(config)

# Checkpoints (`train.checkpoints`, `revisions`; posmech.models.checkpoints): the model
# `<m>@<revision>` of each, with its own manifest, outputs and jobs; it runs only the
# analysis families the `dynamics` section follows (SCHEDULE, posmech.dynamics) and
# its findings go to results/report/dynamics.csv, not to the findings grid.
from posmech.models.checkpoints import add_checkpoints, checkpoints_of, sweep_points
from posmech.sweep import point_outputs, swept_models
from posmech.sweep import rule_name as sweep_rule_name

try:
    CHECKPOINTS = add_checkpoints(config)
except PosmechError as err:
    raise WorkflowError(str(err)) from None
CHECKPOINT_OF = checkpoints_of(config)
SWEEP_POINTS = sweep_points(config)

# Each family's settings (posmech.settings): a typed, frozen object built once from its
# validated section (twins and checkpoints added); a rule hands it to its script as
# `params: settings=SETTINGS.<section>`.
from posmech.settings import build as build_settings

SETTINGS = build_settings(config)

REPO = Path(workflow.basedir).parent
MODELS = list(config["models"])
# the models of the findings grid and the report: every model but the checkpoints
FINAL_MODELS = [m for m in MODELS if m not in CHECKPOINT_OF]
CORPORA = list(config["corpora"])


# ---------------------------------------------------------------- applicability
# Each model's position scheme and layout, read once from its config before any job
# (posmech.models.architecture; None: a Hub model neither fetched nor in the local cache),
# and the analysis rules that cannot run on it with the reason in words
# (posmech.applicability.RULES, the table): `collect` does not schedule them for it, and
# the findings of their claims are `not measurable` with that reason.
from posmech.applicability import Schedule, not_applicable
from posmech.dynamics import sweep_rules
from posmech.families import FAMILIES
from posmech.preflight import architectures

ARCHITECTURES = architectures(config, TWIN_OF, CHECKPOINT_OF)
NOT_APPLICABLE = {m: not_applicable(ARCHITECTURES[m]) for m in MODELS}
try:
    # what runs on a checkpoint: the followed analyses' families, its weights, its head table
    SCHEDULE = Schedule(
        NOT_APPLICABLE,
        CHECKPOINT_OF,
        sweep_rules(
            config["dynamics"],
            workflow.source_path("../../resources/findings.yaml"),
            bool(CHECKPOINTS),
        ),
    )
except PosmechError as err:
    raise WorkflowError(str(err)) from None
runs_on = SCHEDULE.runs_on
if workflow.is_main_process:
    for _line in SCHEDULE.notes(ARCHITECTURES):
        print(_line, file=sys.stderr)


def regex(names):
    """A wildcard constraint matching exactly ``names`` (nothing when empty)."""
    import re

    return "|".join(re.escape(n) for n in names) if names else "(?!x)x"


def static(path):
    """A static input shipped in the repository (e.g. ``resources/prompts/...``), relative
    to the working directory: the workflow runs with ``--directory`` elsewhere, and a
    copied or moved project records the same input paths (no rerun)."""
    import os

    return os.path.relpath(REPO / path)


# Resources of the rules (posmech.cluster.Resources; docs/cluster.md)
def model_shape(model):
    """Estimated size of a configured model (config.json when on disk, else from config)."""
    from posmech.cluster import model_shape as estimate

    model = TWIN_OF.get(model, model)  # a twin has its model's shape
    model = CHECKPOINT_OF.get(model, model)  # and a checkpoint its model's
    manifest = output_of(rules.fetch_model.output.manifest, model=model)
    return estimate(model, config["models"][model], str(Path(manifest).parent))


def _resources():
    import shutil

    from posmech.cluster import Resources

    return Resources(
        config,
        model_shape,
        host_has_gpu=shutil.which("nvidia-smi") is not None,
        # asked at the first GPU request (a dry run or a cluster submission warns)
        warn_gpu_plan=lambda: workflow.is_main_process
        and (workflow.dryrun or workflow.non_local_exec),
    )


RESOURCES = _resources()
on_gpu = RESOURCES.on_gpu
heavy_resources = RESOURCES.gpus
heavy_mem_mb_for = RESOURCES.mem_mb_for
heavy_mem_mb = heavy_mem_mb_for(1)
heavy_runtime_for = RESOURCES.runtime_for
heavy_runtime = heavy_runtime_for(1)
train_runtime = RESOURCES.train_runtime
train_priority = RESOURCES.train_priority


# What a job depends on (posmech.config), as params of the rules
def model_entry(wildcards):
    return config["models"][wildcards.model]


def model_threads(wildcards):
    """A model analysis job's threads: its model's `threads` (the schema's default filled in,
    and copied to its twin and checkpoints)."""
    return model_entry(wildcards)["threads"]


def tokens_entry(wildcards):
    return posmech_config.tokens_entry(model_entry(wildcards))


def cache_model_entry(wildcards):
    return posmech_config.cache_model_entry(model_entry(wildcards))


def weights_entry(wildcards):
    return posmech_config.weights_entry(model_entry(wildcards))


def tokens_of(model):
    return posmech_config.tokens_model(config, model)


def tokens_file(wildcards, corpus):
    """The tokens file of ``corpus`` that the job's model reads (``tokens_of``)."""
    return output_of(
        rules.tokenize.output.h5, model=tokens_of(wildcards.model), corpus=corpus
    )


def tokenized_models():
    """The models of the `tokenize` section that have tokens of their own (``tokens_of``)."""
    return [m for m in selected(config, "tokenize", "models") if tokens_of(m) == m]


def corpus_entry(wildcards):
    return config["corpora"][wildcards.corpus]


# ---------------------------------------------------------------- collecting outputs
# A path is named once: in its rule's `output:`. Every stage file ends with one
# `collect(rules.<rule>, <wildcard>=[values], ...)` line per rule whose outputs the run
# wants; `rule all`, the report's inputs and the scorecard collection all derive from
# those rules' outputs (posmech.collect says which output goes where).
from posmech.collect import Collector

COLLECTOR = Collector(FAMILIES, runs_on, CHECKPOINT_OF)


def collect(proxy, when=True, report_tables=True, **values):
    """Register ``proxy`` (``rules.<name>``) for the run (posmech.collect.Collector.add)."""
    try:
        COLLECTOR.add(proxy, when, report_tables, **values)
    except PosmechError as err:
        raise WorkflowError(str(err)) from None


collected = COLLECTOR.collected


def output_of(pattern, wildcards=None, **values):
    """Another rule's output (``rules.<name>.output.<key>``) for this job: its wildcards
    from the job's ``wildcards`` (or explicit ``values``, which win)."""
    given = dict(wildcards.items()) if wildcards is not None else {}
    return apply_wildcards(str(pattern), {**given, **values})


def report_flags(wildcards):
    """The report's figures and tables with their rule, wildcards, caption and category."""
    return COLLECTOR.report_flags()


def sweep_models():
    """The models of the dynamics sweep's points: each swept model's checkpoints, then it."""
    return list(dict.fromkeys(p["checkpoint"] for p in SWEEP_POINTS))


def sweep_scorecards(wildcards):
    """The scorecards of the dynamics sweep's points (rule dynamics)."""
    return collected("scorecard", models=sweep_models())


# ---------------------------------------------------------------- sweep points
# A checkpoint's followed rules run as one job, rule sweep_<model> (dynamics.smk,
# posmech.sweep): the analysis rules' `model` wildcard is constrained to FINAL_MODELS.
def sweep_point_parts():
    """``{checkpoint: [(rule, wildcards), ...]}`` (posmech.sweep.parts_by_checkpoint);
    called after every analysis rule's `collect`."""
    from posmech.sweep import parts_by_checkpoint

    try:
        return parts_by_checkpoint(
            list(workflow.rules), COLLECTOR.entries, CHECKPOINT_OF, CORPORA
        )
    except PosmechError as err:
        raise WorkflowError(str(err)) from None


def sweep_point_inputs(wildcards):
    from posmech.sweep import point_inputs

    return point_inputs(SWEEP_POINT_PARTS[wildcards.model])


def sweep_point_params(wildcards):
    from posmech.sweep import point_parts

    return point_parts(SWEEP_POINT_PARTS[wildcards.model])


def sweep_point_resource(name, combine):
    """Resource ``name`` of a sweep point's job: ``combine`` (max, sum) of its parts'."""
    from posmech.sweep import part_resource

    return lambda wildcards, attempt: part_resource(
        SWEEP_POINT_PARTS[wildcards.model], name, combine, attempt
    )


# ---------------------------------------------------------------- stage helpers
# (parameters and inputs of the rules; Snakemake's linter wants functions out of the
# rule files)
def trained_models():
    return model_names_by_kind(config, "train")


def geometry_models():
    return selected(config, "geometry", "models")


def kernels_models():
    return selected(config, "kernels", "models")


def etc_models():
    """The kernels models whose ETC table is computed (etc_heatmap sets them side by side;
    not the checkpoints: the dynamics sweep follows them)."""
    return [m for m in runs_on("etc_table", kernels_models()) if m not in CHECKPOINT_OF]


def kernels_params(wildcards=None):
    """The `kernels` config section with the corpora resolved (null: the first corpus)."""
    p = dict(config["kernels"])
    first = list(config["corpora"])[0]
    p["means_corpus"] = p.get("means_corpus") or first
    p["query_corpus"] = p.get("query_corpus") or first
    return p


def taxonomy_models():
    return selected(config, "taxonomy", "models")


def anatomy_pass_params(wildcards):
    """The `anatomy` settings for `attention_statistics` when the job's model is one of the
    anatomy models, else None (its P13 rows are not computed, and changing `anatomy` does
    not rerun the pass for it)."""
    found = SETTINGS.anatomy.for_pass(config, wildcards.model)
    return found.as_param() if found is not None else None


def attention_statistics_inputs(wildcards):
    """The manifest and the tokens of `taxonomy` (and of `anatomy` for its models)."""
    out = {
        "manifest": output_of(rules.fetch_model.output.manifest, wildcards),
        "tokens": tokens_file(wildcards, SETTINGS.taxonomy.corpus),
    }
    if anatomy_pass_params(wildcards) is not None:
        out["anatomy_tokens"] = tokens_file(wildcards, SETTINGS.anatomy.corpus)
    return out


def repo_file(path):
    """A repository file named in the config (absolute paths, and ``~``, are kept)."""
    import os

    p = os.path.expanduser(path)
    return p if os.path.isabs(p) else static(path)


def interventions_models():
    return selected(config, "interventions", "models")


def contextual_models():
    return selected(config, "contextual", "models")


def contextual_params(wildcards=None):
    """The `contextual` section with its corpora resolved: `corpora` (empty: all), the
    pattern corpus first; `scale_corpus` (null: the first corpus)."""
    p = dict(config["contextual"])
    chosen = selected(config, "contextual", "corpora")
    p["pattern_corpus"] = p.get("pattern_corpus") or chosen[0]
    p["corpora"] = [p["pattern_corpus"]] + [
        c for c in chosen if c != p["pattern_corpus"]
    ]
    p["scale_corpus"] = p.get("scale_corpus") or CORPORA[0]
    return p


def contextual_check():
    """The `contextual` positions against each model's context, before any job (the
    rule checks again with the model's own config)."""
    from posmech.analyses.contextual import resolved_positions

    for m in runs_on("layer0_decomposition", contextual_models()):
        try:
            resolved_positions(contextual_params(), model_shape(m).n_ctx, m)
        except PosmechError as err:
            raise WorkflowError(str(err)) from None


def contextual_tokens(wildcards):
    """Tokens files of the contextual texts' corpora and of the LN-scale corpus."""
    p = contextual_params()
    names = list(dict.fromkeys(p["corpora"] + [p["scale_corpus"]]))
    return {c: tokens_file(wildcards, c) for c in names}


from posmech.settings.attn_only import check as attn_only_check


def attn_only_models(bos=None):
    """Models of the `attn_only` section; ``bos=True``: only those run with BOS."""
    from posmech.settings.attn_only import models

    return models(SETTINGS.attn_only, config, bos)


def attn_only_tokens(*keys):
    return SETTINGS.attn_only.longest_sequence(*keys)


def attn_only_runtime(*counts):
    """``runtime`` of an L rule doing forward passes of ``sum(counts)`` short sequences
    (32 tokens each: an upper bound)."""
    return RESOURCES.short_runtime(sum(counts))


def model_has_mlp(m):
    """False for an attention-only model, known from its config before any job (its
    architecture: a trained `attn_only` model, a config.json with `attn_only`), or an
    attention-only Hub id not fetched yet."""
    if ARCHITECTURES[m] is not None:
        return ARCHITECTURES[m].has_mlp
    return "attn_only" not in str(config["models"][m].get("source", "")).lower()


def neurons_models():
    """`neurons.models` (empty: every model with an MLP in layer 0); an attention-only
    model named there is an error before any job."""
    chosen = selected(config, "neurons", "models")
    if config["neurons"].get("models"):
        bad = [m for m in chosen if not model_has_mlp(m)]
        if bad:
            raise WorkflowError(
                f"config key `neurons.models`: {bad} have no MLP in layer 0 (attention-only): "
                "contextual neurons need one; remove them"
            )
        return chosen
    return [m for m in chosen if model_has_mlp(m)]


def head_table_sources():
    """``{key: (rule output, models)}`` of the per-head tables the head-roles table (rule
    head_table) gathers (posmech.families.HEAD_TABLE_SOURCES), each for the models its
    family runs on."""
    from posmech.families import HEAD_TABLE_SOURCES, rule_of

    out = {}
    for key, output in HEAD_TABLE_SOURCES.items():
        analysis = output.split("__", 1)[0]
        family = rule_of(analysis)
        models = runs_on(analysis, selected(config, family, "models"))
        out[key] = (getattr(rules, family).output[output], models)
    return out


def head_table_models():
    """Models that at least one per-head analysis runs on."""
    models = {m for _, ms in head_table_sources().values() for m in ms}
    return [m for m in MODELS if m in models]


def head_table_inputs(wildcards):
    """The per-head tables of this model (only those of the analyses it is in)."""
    return {
        key: output_of(out, wildcards)
        for key, (out, models) in head_table_sources().items()
        if wildcards.model in models
    }
