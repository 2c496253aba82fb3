# The framework every stage file uses (docs/workflow.md): the prepared study, resources,
# what a job depends on, collecting outputs, sweep points, and the few stage helpers that
# need a `def`.
import shutil
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.io import apply_wildcards

sys.path.insert(0, str(Path(workflow.basedir).parent / "src"))

import posmech.core.config as posmech_config
from posmech.pipeline.cluster import Resources as ResourceEstimates
from posmech.core.config import load_schema, model_names_by_kind, selected
from posmech.core.errors import PosmechError
from posmech.core.families import FAMILIES
from posmech.pipeline.preflight import jobs_run_locally
from posmech.pipeline.sweep import (
    omitted_rules,
    point_outputs,
    swept_models,
    twin_reads,
)
from posmech.pipeline.sweep import rule_name as sweep_rule_name
from posmech.pipeline.sweep import IN_OWN_POINTS, IN_TWIN_POINTS

# The study the config describes, prepared first of all (posmech.pipeline.study):
# the config validated (defaults filled) and checked in one round (posmech.pipeline.preflight), a
# lock of this directory explained, the random-init twins (`<m>-twin`, config section
# `twins`) and the checkpoints (`<m>@<revision>`, `train.checkpoints`, `revisions`) added
# as models, each family's settings built (posmech.settings: a rule hands its script
# `settings=SETTINGS.<section>.as_param()`), each model's architecture read and the
# analysis rules that cannot run on it decided (posmech.pipeline.applicability: not scheduled, their
# claims `not measurable` with the reason). A checkpoint runs only what the `dynamics`
# section follows; its findings go to results/report/dynamics.csv.
from posmech.pipeline.study import prepare

# workflow/rules/ (also when another Snakefile includes this file)
_RULES_DIR = Path(workflow.current_basedir.get_path_or_uri(secret_free=True))
try:
    STUDY = prepare(
        config,
        load_schema(workflow.source_path("../schemas/config.schema.yaml")),
        repo=_RULES_DIR.parents[1],
        findings_path=str(_RULES_DIR.parents[1] / "resources" / "findings.yaml"),
        configfiles=workflow.configfiles,
        main_process=workflow.is_main_process,
        runs_jobs_here=jobs_run_locally(sys.argv),
        dry_run=workflow.output_settings.dryrun,
        unlocking="--unlock" in sys.argv,
    )
except PosmechError as err:
    raise WorkflowError(str(err)) from None
for _note in STUDY.notes:
    print(_note, file=sys.stderr)
TWINS, TWIN_OF = STUDY.twins, STUDY.twin_of
CHECKPOINT_OF = STUDY.checkpoint_of
SWEEP_POINTS = STUDY.sweep_points
SETTINGS = STUDY.settings
ARCHITECTURES, NOT_APPLICABLE = STUDY.architectures, STUDY.not_applicable
runs_on = STUDY.schedule.runs_on
REPO = Path(workflow.basedir).parent
MODELS, FINAL_MODELS = STUDY.models, STUDY.final_models
# The models whose analyses run as one job each, without figures: the random-init twins
# (config `twins.figures: false`, the default; the job builds the twin's weights first) and
# the models configured with `figures: false`. Each is a point of its own, like a
# checkpoint's (dynamics.smk, posmech.pipeline.sweep); the analysis rules run on JOB_MODELS.
OWN_POINTS = {m: m for m in STUDY.figureless}
TWIN_POINTS = {t: t for t in TWINS if t in OWN_POINTS}
# What each twin's analyses read (findings.meta.json `twin_reads`): one job without figures
# reads `twins.documents_fraction` of the documents and only what its claims need
# (`twins.claims_only`); with figures, every document, as its model
TWIN_READS = twin_reads(TWINS, TWIN_POINTS, config["twins"])
# What a point of its own runs first (posmech.pipeline.sweep): a twin builds its weights; a
# figureless model tokenizes its corpora and, when local, validates its directory (a Hub model
# is downloaded by fetch_model of its own: the login node reaches the Hub)
_LOCAL = set(model_names_by_kind(config, "local"))
POINT_BUILDS = {
    m: (
        IN_TWIN_POINTS
        if m in TWIN_POINTS
        else IN_OWN_POINTS if m in _LOCAL else IN_OWN_POINTS - {"fetch_model"}
    )
    for m in OWN_POINTS
}
BUILT_IN_POINTS = {
    name: [m for m, built in POINT_BUILDS.items() if name in built]
    for name in IN_OWN_POINTS
}
POINT_OF = {**CHECKPOINT_OF, **OWN_POINTS}
JOB_MODELS = [m for m in FINAL_MODELS if m not in OWN_POINTS]
CORPORA = list(config["corpora"])


def regex(names):
    """A wildcard constraint matching exactly ``names`` (nothing when empty)."""
    import re

    return "|".join(re.escape(n) for n in names) if names else "(?!x)x"


def static(path):
    """A file of the repository (``resources/prompts/...``; a config may name one), relative
    to the working directory: the workflow runs with ``--directory`` elsewhere, and a copied
    or moved project records the same input paths (no rerun). Absolute paths (and ``~``)
    are kept."""
    import os

    p = os.path.expanduser(path)
    return p if os.path.isabs(p) else os.path.relpath(REPO / path)


# Resources of the rules (posmech.pipeline.cluster.Resources; docs/cluster.md)
def model_shape(model):
    """Estimated size of a configured model (config.json when on disk, else from config)."""
    from posmech.pipeline.cluster import model_shape as estimate

    model = TWIN_OF.get(model, model)  # a twin has its model's shape
    model = CHECKPOINT_OF.get(model, model)  # and a checkpoint its model's
    manifest = output_of(rules.fetch_model.output.manifest, model=model)
    return estimate(model, config["models"][model], str(Path(manifest).parent))


RESOURCES = ResourceEstimates(
    config,
    model_shape,
    host_has_gpu=shutil.which("nvidia-smi") is not None,
    # asked at the first GPU request (a dry run or a cluster submission warns)
    warn_gpu_plan=lambda: workflow.is_main_process
    and (workflow.dryrun or workflow.non_local_exec),
)
heavy_resources = RESOURCES.gpus
heavy_mem_mb_for = RESOURCES.mem_mb_for
heavy_mem_mb = heavy_mem_mb_for(1)
heavy_runtime_for = RESOURCES.runtime_for
train_runtime = RESOURCES.train_runtime
train_priority = RESOURCES.train_priority


# What a job depends on (posmech.core.config), as params of the rules
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
# those rules' outputs (posmech.pipeline.collect says which output goes where).
from posmech.pipeline.collect import Collector

# The rules this run leaves out (--omit-from): a point of its own (a twin's, a figureless
# model's one job) leaves them out too, and nothing collects or reads their outputs for it
OMITTED = omitted_rules(sys.argv)
COLLECTOR = Collector(
    FAMILIES, runs_on, CHECKPOINT_OF, figureless=OWN_POINTS, omitted=OMITTED
)


def collect(proxy, when=True, report_tables=True, **values):
    """Register ``proxy`` (``rules.<name>``) for the run (posmech.pipeline.collect.Collector.add)."""
    try:
        COLLECTOR.add(proxy, when, report_tables, **values)
    except PosmechError as err:
        raise WorkflowError(str(err)) from None


collected = COLLECTOR.collected


# ---------------------------------------------------------------- declared analyses
# An analysis rule's outputs, and its inputs that are other analysis rules' outputs, are
# what its analyses declare (workflow/analyses/<rule>.yaml, posmech.core.families): the
# rule file writes `output: **declared_outputs("<rule>")` and `**declared_inputs("<rule>")`
# among its inputs. `snakemake --list-rules`/`-n` and docs/artifacts.md show the paths.
from posmech.core.families import rule_inputs, rule_outputs


def declared_outputs(rule):
    """Rule ``rule``'s outputs: each declared path, a report(...) file with its caption
    (workflow/report/<caption>.rst), category and section where the report shows it."""
    return {
        key: (
            o.path
            if o.caption is None
            else report(
                o.path,
                caption=f"../report/{o.caption}.rst",
                category=o.category,
                subcategory=o.section,
            )
        )
        for key, o in rule_outputs(rule).items()
    }


def declared_inputs(rule):
    """Rule ``rule``'s inputs that its analyses read from other analysis rules."""
    return {
        name: getattr(getattr(rules, up).output, key)
        for name, (up, key) in rule_inputs(rule).items()
    }


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
    """The scorecards of the dynamics sweep's points (rule dynamics); not formation_order's,
    which reads the dynamics table (S5, judged on the whole sweep)."""
    whole = set(collected(of="formation_order"))
    return [p for p in collected("scorecard", models=sweep_models()) if p not in whole]


def swept_final_models():
    """The models the run sweeps (each with checkpoints), not their checkpoints."""
    return list(dict.fromkeys(p["model"] for p in SWEEP_POINTS))


# ---------------------------------------------------------------- sweep points
# A checkpoint's followed rules run as one job, rule sweep_<model> (dynamics.smk,
# posmech.pipeline.sweep), and so do a twin's and a figureless model's analyses (OWN_POINTS):
# the analysis rules' `model` wildcard is constrained to JOB_MODELS.
def sweep_points_of_run():
    """The run's sweep points (posmech.pipeline.sweep.SweepPoints); called after every analysis
    rule's `collect`."""
    from posmech.pipeline.sweep import SweepPoints, parts_by_checkpoint

    try:
        parts = parts_by_checkpoint(
            list(workflow.rules),
            COLLECTOR.entries,
            POINT_OF,
            CORPORA,
            POINT_BUILDS,
            # a rule left out (--omit-from) is left out of every point, a twin's included:
            # a twin runs what its model runs
            OMITTED,
        )
    except PosmechError as err:
        raise WorkflowError(str(err)) from None
    # what each twin's one job reads, as findings.meta.json records it (TWIN_READS)
    reads = {t: TWIN_READS[t] for t in TWIN_POINTS}
    return SweepPoints(
        parts,
        {t: r["documents_fraction"] for t, r in reads.items()},
        [t for t, r in reads.items() if r["claims_only"]],
    )


# ---------------------------------------------------------------- stage helpers
# (inputs and params of the rules that need a `def`: Snakemake's linter wants functions out
# of the rule files; what a section means lives in posmech.settings.<family>)
def models_of(section):
    """The models config section ``section`` selects (its `models`; empty: every model)."""
    return selected(config, section, "models")


def etc_models():
    """The kernels models whose ETC table is computed (etc_heatmap sets them side by side;
    not the checkpoints: the dynamics sweep follows them)."""
    return [m for m in runs_on("etc_table", models_of("kernels")) if m in FINAL_MODELS]


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


def contextual_tokens(wildcards):
    """Tokens files of the contextual texts' corpora and of the LN-scale corpus."""
    return {c: tokens_file(wildcards, c) for c in SETTINGS.contextual.token_corpora}


from posmech.settings.attn_only import check as attn_only_check


def attn_only_models(bos=None):
    """Models of the `attn_only` section; ``bos=True``: only those run with BOS."""
    from posmech.settings.attn_only import models

    return models(SETTINGS.attn_only, config, bos)


def neurons_models():
    """`neurons.models` (empty: every model with an MLP in layer 0; posmech.settings.neurons)."""
    from posmech.settings.neurons import models

    try:
        return models(SETTINGS.neurons, config, ARCHITECTURES)
    except PosmechError as err:
        raise WorkflowError(str(err)) from None


def head_table_sources():
    """``{key: (rule output, models)}`` of the per-head tables the head-roles table (rule
    head_table) gathers (posmech.core.families.HEAD_TABLE_SOURCES), each for the models its
    family runs on (a point of its own not, when the run leaves the family out: OMITTED).
    """
    from posmech.core.families import HEAD_TABLE_SOURCES, rule_of

    out = {}
    for key, output in HEAD_TABLE_SOURCES.items():
        analysis = output.split("__", 1)[0]
        family = rule_of(analysis)
        models = runs_on(analysis, selected(config, family, "models"))
        if family in OMITTED:
            models = [m for m in models if m not in OWN_POINTS]
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


# rule sinks (sinks.smk): a function, so it lives here with the other input functions
def sinks_inputs(wildcards):
    """The manifest and the tokens of the `sinks` corpus."""
    return {
        "manifest": output_of(rules.fetch_model.output.manifest, wildcards),
        "tokens": tokens_file(wildcards, SETTINGS.sinks.corpus),
    }
