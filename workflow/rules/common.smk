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
# analysis families the `dynamics` section follows (SWEEP_RULES, posmech.dynamics) and
# its findings go to results/report/dynamics.csv, not to the findings grid.
from posmech.models.checkpoints import add_checkpoints, checkpoints_of, sweep_points
from posmech.sweep import FIGURE_SUFFIXES, point_outputs

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
def _known_architecture(m):
    from posmech.preflight import known_architecture

    m = TWIN_OF.get(m, m)  # a twin has its model's architecture
    m = CHECKPOINT_OF.get(m, m)  # and a checkpoint its model's
    found = known_architecture(m, config["models"][m])
    return found[0] if found else None


ARCHITECTURES = {m: _known_architecture(m) for m in MODELS}


def _not_applicable():
    from posmech.applicability import not_applicable

    return {m: not_applicable(ARCHITECTURES[m]) for m in MODELS}


NOT_APPLICABLE = _not_applicable()


def _families():
    from posmech.families import FAMILIES

    return FAMILIES


FAMILIES = _families()


def _sweep_analyses():
    from posmech.dynamics import sweep_analyses
    from posmech.findings import load_findings

    d = config["dynamics"]
    try:
        found = load_findings(workflow.source_path("../../resources/findings.yaml"))
        return sweep_analyses(d["claims"], d["heads"], found)
    except PosmechError as err:
        raise WorkflowError(str(err)) from None


# what runs on a checkpoint: the followed analyses' families, its weights and its head table
SWEEP_RULES = (
    set(_sweep_analyses()) | {"fetch_model", "checkpoint_model", "head_table"}
    if CHECKPOINTS
    else set()
)


def runs_on(rule, models):
    """The models of ``models`` that analysis ``rule`` can run on (posmech.applicability),
    and on a checkpoint only if the dynamics sweep follows it (SWEEP_RULES)."""
    return [
        m
        for m in models
        if rule not in NOT_APPLICABLE.get(m, {})
        and (m not in CHECKPOINT_OF or rule in SWEEP_RULES)
    ]


if workflow.is_main_process:
    for _m, _skipped in NOT_APPLICABLE.items():
        if _skipped and _m not in CHECKPOINT_OF:
            print(
                f"posmech: model {_m} ({ARCHITECTURES[_m].scheme_words}, {ARCHITECTURES[_m].model_type}): "
                f"{len(_skipped)} analysis rules do not apply and are not scheduled; their claims are "
                "`not measurable` with the reason (results/report/findings.csv, docs/workflow.md)",
                file=sys.stderr,
            )


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


def on_gpu(model):
    """True when ``model``'s heavy jobs request a GPU: ``cluster.gpu: auto`` follows the
    model's device (``cuda``; ``auto`` when the submitting host has ``nvidia-smi``),
    ``always``/``never`` override it (see docs/cluster.md)."""
    import shutil

    from posmech.cluster import requests_gpu

    policy = config.get("cluster", {}).get("gpu", "auto")
    return requests_gpu(
        config["models"][model], policy, shutil.which("nvidia-smi") is not None
    )


_GPU_PLAN_CHECKED = []


def heavy_resources(wildcards):
    """GPUs of a model-heavy job for ``wildcards.model`` (0 or 1): ``gpu=heavy_resources``.
    The first call of a dry run or a cluster submission warns when no heavy job gets a GPU
    although models could (posmech.cluster.gpu_plan_warning)."""
    if not _GPU_PLAN_CHECKED and workflow.is_main_process:
        _GPU_PLAN_CHECKED.append(True)
        if workflow.dryrun or workflow.non_local_exec:
            import shutil

            from posmech.cluster import gpu_plan_warning

            note = gpu_plan_warning(
                config["models"],
                config.get("cluster", {}).get("gpu", "auto"),
                shutil.which("nvidia-smi") is not None,
            )
            if note:
                print(f"WARNING (posmech): {note}", file=sys.stderr)
    return 1 if on_gpu(wildcards.model) else 0


def model_shape(model):
    """Estimated size of a configured model (config.json when on disk, else from config)."""
    from posmech.cluster import model_shape as estimate

    model = TWIN_OF.get(model, model)  # a twin has its model's shape
    model = CHECKPOINT_OF.get(model, model)  # and a checkpoint its model's
    manifest = output_of(rules.fetch_model.output.manifest, model=model)
    return estimate(model, config["models"][model], str(Path(manifest).parent))


def heavy_corpora(wildcards):
    """The corpus of a job (``wildcards.corpus``), else every configured corpus."""
    return [wildcards.corpus] if "corpus" in wildcards.keys() else CORPORA


def heavy_mem_mb_for(batch, keeps=None, n_tokens=None):
    """``mem_mb`` of a model-heavy job running ``batch`` contexts per forward pass:
    ``mem_mb=heavy_mem_mb_for(config["geometry"]["batch_size"], keeps=())``; ``keeps``:
    what it holds per context (posmech.cluster.mem_mb; default: the largest of all);
    ``n_tokens``: its sequences' length when shorter than the model's context."""

    def mem(wildcards, attempt):
        from posmech.cluster import KEEPS, mem_mb

        entry = config["models"][wildcards.model]
        scale = config.get("cluster", {}).get("mem_scale", 1.0)
        return mem_mb(
            model_shape(wildcards.model),
            entry["dtype"],
            batch,
            scale,
            attempt,
            KEEPS if keeps is None else keeps,
            n_tokens,
        )

    return mem


heavy_mem_mb = heavy_mem_mb_for(1)


def heavy_runtime_for(passes, documents=None):
    """``runtime`` (minutes) of a job doing ``passes`` forward passes over the tokens of
    its corpus (``wildcards.corpus``, else all corpora), or of at most ``documents``
    documents, e.g. ``heavy_runtime_for(4, config["interventions"]["n_documents"])``."""

    def runtime(wildcards, attempt):
        from posmech.cluster import corpus_documents, runtime_min

        shape = model_shape(wildcards.model)
        docs = sum(
            corpus_documents(config["corpora"][c]) for c in heavy_corpora(wildcards)
        )
        if documents is not None:
            docs = min(docs, documents)
        scale = config.get("cluster", {}).get("runtime_scale", 1.0)
        gpu = on_gpu(wildcards.model)
        return runtime_min(shape, docs * shape.n_ctx, passes, gpu, scale, attempt)

    return runtime


heavy_runtime = heavy_runtime_for(1)


def train_runtime(wildcards, attempt):
    """``runtime`` (minutes) of ``train_demo_model``: steps × batch × context tokens,
    forward and backward (3 passes), on the CPU."""
    from posmech.cluster import runtime_min

    t = config["models"][wildcards.model]["train"]
    tokens = t["steps"] * t["batch_size"] * t["n_ctx"]
    scale = config.get("cluster", {}).get("runtime_scale", 1.0)
    return runtime_min(model_shape(wildcards.model), tokens, 3, False, scale, attempt)


def train_priority(wildcards):
    """A training job's priority: 10, above every analysis job (each waits for a model),
    plus its share of the largest training's work (posmech.models.training.train_work:
    tokens × block parameters), so that the longest training starts first: on 2 cores the
    demo trains two models at a time, and the longest one, with its checkpoints and twin
    after it, is the run's critical path."""
    from posmech.models.training import train_work

    works = {m: train_work(config["models"][m]["train"]) for m in trained_models()}
    return 10 + works[wildcards.model] / max(works.values())


def model_entry(wildcards):
    return config["models"][wildcards.model]


def model_threads(wildcards):
    """A model analysis job's threads: its model's `threads` (the schema's default filled in,
    and copied to its twin and checkpoints)."""
    return model_entry(wildcards)["threads"]


def tokens_entry(wildcards):
    """What tokenization depends on, and only that (changing the device, the dtype or the
    engine never re-tokenizes, nor reruns what reads the tokens)."""
    entry = config["models"][wildcards.model]
    return {k: entry[k] for k in ("n_ctx", "prepend_bos")}


def cache_model_entry(wildcards):
    """The model entry without `engine` (the cache has its own, `cache.engine`)."""
    return {k: v for k, v in config["models"][wildcards.model].items() if k != "engine"}


def weights_entry(wildcards):
    """What determines a model's weights, and only that: the params of fetch_model and
    train_demo_model (analysis keys such as n_ctx, device, dtype never refetch/retrain).
    """
    entry = config["models"][wildcards.model]
    if "twin_of" in entry:
        return {"twin_of": entry["twin_of"], "seed": entry["seed"]}
    if model_kind(entry) == "checkpoint":  # saved by its model's training
        return {k: entry[k] for k in ("checkpoint_of", "step", "train")}
    if "train" in entry:
        return {"train": entry["train"]}
    return {"source": entry["source"], "revision": entry["revision"]}


def tokens_of(model):
    """The model whose tokens `model`'s jobs read: a random-init twin's tokenizer is copied
    from its model (posmech.models.twin) and a trained checkpoint's is the one its model's
    training saves with every checkpoint, and they share their model's `n_ctx` and
    `prepend_bos`, so they read their model's tokens (one tokenize job less each). A Hub
    checkpoint has its own (a revision may change the tokenizer)."""
    entry = config["models"][model]
    if "twin_of" in entry:
        return entry["twin_of"]
    if model_kind(entry) == "checkpoint":
        return entry["checkpoint_of"]
    return model


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
# those rules' outputs (see the Snakefile's header and docs/workflow.md):
#   every output                      -> a target of `rule all` (and runs before the report)
#   the output named `scorecard`      -> a scorecard the report reads
#                                        (must be results/{model}/scorecard/<rule>.csv)
#   report(...) outputs, .png         -> figures of the HTML report (caption, category reused)
#   report(...) outputs, .csv / .tsv  -> tables of the HTML report (unless report_tables=False)
COLLECTED = []

TABLE_SUFFIXES = (".csv", ".tsv")


def collect(proxy, when=True, report_tables=True, **values):
    """Register ``proxy`` (``rules.<name>``) for the run, once for every combination
    of the wildcard values given (``model=[...]``, ``corpus=[...]``; one list per wildcard
    of its outputs), or once for a rule without wildcards; nothing when ``when`` is false.
    Models the rule cannot run on (``runs_on``, posmech.applicability) are left out.
    """
    import itertools

    step = getattr(proxy, "rule", proxy)
    wildcards = set(step.wildcard_names or ())
    if set(values) != wildcards:
        raise WorkflowError(
            f"collect(rules.{step.name}): give one list of values per wildcard of its "
            f"outputs ({', '.join(sorted(wildcards)) or 'none'}), got {', '.join(sorted(values)) or 'none'}"
        )
    named = sum(len(v) if isinstance(v, list) else 1 for _, v in step.output.items())
    if named != len(step.output):
        raise WorkflowError(
            f"name every output of rule {step.name} (key=path) so that it can be collected"
        )
    family = list(analyses_of(step)) != [step.name]
    if family and tuple(analyses_of(step)) != FAMILIES.get(step.name):
        raise WorkflowError(
            f"the outputs of rule {step.name} name the analyses {', '.join(analyses_of(step))}; "
            "posmech.families.FAMILIES must list the same, in the same order "
            f"(it lists {', '.join(FAMILIES.get(step.name, ())) or 'none'})"
        )
    for analysis, key in analyses_of(step).items():
        scorecard = step.output.get(f"{key}scorecard")
        expected = f"results/{{model}}/scorecard/{analysis}.csv"
        if (
            scorecard is not None
            and strip_wildcard_constraints(str(scorecard)) != expected
        ):
            raise WorkflowError(
                f"the scorecard output of analysis {analysis} (rule {step.name}) must be "
                f"{expected!r} (the report finds the analysis of a scorecard row by the file name)"
            )
    if "model" in values:  # a rule that cannot run on a model is not scheduled for it
        values = {**values, "model": family_runs_on(step, list(values["model"]))}
    jobs = [dict(zip(values, combo)) for combo in itertools.product(*values.values())]
    COLLECTED.append((step, jobs if when else [], report_tables))


def analyses_of(step):
    """``{analysis: output key prefix}`` of a rule: a family rule (docs/workflow.md,
    "Families") names each output ``<analysis>__<key>``; any other rule is one analysis,
    its own name, with unprefixed keys."""
    found = {
        analysis_of(step, key): f"{analysis_of(step, key)}__"
        for key in step.output.keys()
        if "__" in key
    }
    return found or {step.name: ""}


def analysis_of(step, key):
    """The analysis an output key of rule ``step`` belongs to."""
    return key.split("__", 1)[0] if "__" in key else step.name


def family_runs_on(step, models):
    """The models of ``models`` that every analysis of rule ``step`` can run on; a family
    runs on a model all or not at all (posmech.applicability.family_problems: its
    analyses' requirements must agree; tested on every architecture)."""
    names = list(analyses_of(step))
    out = []
    for m in models:
        runs = [
            a for a in names if runs_on(a, [m])
        ]  # an analysis not in the table runs
        if len(runs) == len(names):
            out.append(m)
        elif runs:
            raise WorkflowError(
                f"on model {m}, of the analyses of rule {step.name}, {', '.join(runs)} can run and "
                f"{', '.join(a for a in names if a not in runs)} cannot: a family runs all its "
                "analyses or none (posmech.applicability: give them the same requirements)"
            )
    return out


def collected_outputs():
    """``(path, rule object, wildcards, key, iofile, report_tables)`` of every collected output, in
    the order of the `collect` lines (stage files in include order); a checkpoint's figures
    are not made (its sweep point draws none, posmech.sweep)."""
    from posmech.sweep import is_figure

    for step, jobs, report_tables in COLLECTED:
        for wc in jobs:
            for key, files in step.output.items():
                for f in files if isinstance(files, list) else [files]:
                    path = apply_wildcards(str(f), wc)
                    if wc.get("model") in CHECKPOINT_OF and is_figure(path):
                        continue
                    yield path, step, wc, key, f, report_tables


def report_kind(path, key, f, report_tables):
    """``scorecard``, ``figure``, ``table`` or None for one collected output."""
    if key == "scorecard" or key.endswith("__scorecard"):
        return "scorecard"
    if f.flags.get("report") is None:
        return None
    if path.endswith(FIGURE_SUFFIXES):
        return "figure"
    if path.endswith(TABLE_SUFFIXES) and report_tables:
        return "table"
    return None


def collected(kind=None, of=None, checkpoints=True, models=None):
    """Collected paths (no duplicates, in order): every one, or those of ``kind``
    (``scorecard``, ``figure``, ``table``), or those of the rule named ``of``;
    ``checkpoints=False``: not those of checkpoints (the findings grid and the report show
    the models; the dynamics sweep's points are shown by the dynamics rule); and with
    ``models``, only those of jobs of these models."""
    out = [
        path
        for path, r, wc, key, f, tables in collected_outputs()
        if (kind is None or report_kind(path, key, f, tables) == kind)
        and (of is None or r.name == of)
        and (checkpoints or wc.get("model") not in CHECKPOINT_OF)
        and (models is None or wc.get("model") in models)
    ]
    return list(dict.fromkeys(out))


def output_of(pattern, wildcards=None, **values):
    """Another rule's output (``rules.<name>.output.<key>``) for this job: its wildcards
    from the job's ``wildcards`` (or explicit ``values``, which win)."""
    given = dict(wildcards.items()) if wildcards is not None else {}
    return apply_wildcards(str(pattern), {**given, **values})


def report_flags(wildcards):
    """Per figure/table of the report: the producing rule, its wildcards and its
    report() caption and category (so the HTML report reuses the captions of Snakemake's
    native report)."""
    out = {}
    for path, step, wc, key, f, tables in collected_outputs():
        if report_kind(path, key, f, tables) not in ("figure", "table") or path in out:
            continue
        flag = f.flags["report"]
        caption = flag.caption
        analysis = analysis_of(step, key)
        out[path] = {
            # what the report prints after "rule": a family's analysis says both names
            "rule": (
                step.name
                if analysis == step.name
                else f"{step.name} (analysis {analysis})"
            ),
            "wildcards": dict(wc),
            "caption": caption.get_path_or_uri(secret_free=True) if caption else None,
            "category": flag.category,
        }
    return out


def sweep_models():
    """The models of the dynamics sweep's points: each swept model's checkpoints, then it."""
    return list(dict.fromkeys(p["checkpoint"] for p in SWEEP_POINTS))


def sweep_scorecards(wildcards):
    """The scorecards of the dynamics sweep's points (rule dynamics)."""
    return collected("scorecard", models=sweep_models())


# ---------------------------------------------------------------- sweep points
# A checkpoint's followed rules run as one job, rule sweep_<model> (dynamics.smk,
# posmech.sweep): the analysis rules' `model` wildcard is constrained to FINAL_MODELS.
#: the rules that make a model's weights, tokens and head table (a sweep point runs none)
_NOT_IN_SWEEP_POINTS = {
    "fetch_model",
    "train_demo_model",
    "build_twin",
    "checkpoint_model",
    "tokenize",
    "head_table",
}


def sweep_point_parts():
    """``{checkpoint: [(rule, wildcards), ...]}``, the parts of each sweep point
    (posmech.sweep.find_parts): the analysis rules collected on the checkpoint (the followed
    families its model's config sections run, `collect`) and what they read; every
    checkpoint of a model runs the same rules. Called after every analysis rule's `collect`.
    """
    from posmech.sweep import find_parts, signature

    producers = [
        r
        for r in workflow.rules
        if "model" in (r.wildcard_names or ()) and r.name not in _NOT_IN_SWEEP_POINTS
    ]
    # the analysis rules collected on each checkpoint (runs_on, the sections' models)
    followed = {}
    for step, jobs, _ in COLLECTED:
        for wc in jobs:
            c = wc.get("model")
            if c in CHECKPOINT_OF and step.name not in _NOT_IN_SWEEP_POINTS:
                followed.setdefault(c, [])
                if step not in followed[c]:
                    followed[c].append(step)
    out, first = {}, {}
    for c, m in CHECKPOINT_OF.items():
        out[c] = find_parts(c, followed.get(c, []), producers, {"corpus": CORPORA})
        first.setdefault(m, c)
        if signature(out[c]) != signature(out[first[m]]):
            raise WorkflowError(
                f"checkpoints {first[m]} and {c} of model {m} would run different rules in the "
                "dynamics sweep (posmech.sweep); give them the same analyses"
            )
    return out


def sweep_point_models():
    """``{swept model: its first checkpoint}`` (the rule of its sweep points is declared
    from that checkpoint's parts; the others' are the same); a model whose checkpoints
    follow no analysis rule (only head quantities, say) has no sweep point."""
    out = {}
    for c, m in CHECKPOINT_OF.items():
        if SWEEP_POINT_PARTS[c]:
            out.setdefault(m, c)
    return out


def sweep_point_rule_name(model):
    """The name of the rule of ``model``'s sweep points, ``sweep_<model>`` (``-``, ``.`` as ``_``)."""
    import re

    safe = re.sub(r"\W", "_", model)
    return f"sweep_{safe}"


def sweep_point_inputs(wildcards):
    from posmech.sweep import point_inputs

    return point_inputs(SWEEP_POINT_PARTS[wildcards.model])


def sweep_point_params(wildcards):
    from posmech.sweep import point_parts

    return point_parts(SWEEP_POINT_PARTS[wildcards.model])


def sweep_point_resource(name, combine):
    """Resource ``name`` of a sweep point's job: ``combine`` (max, sum) of its parts'
    (each part rule's own value for its wildcards and the attempt)."""
    from snakemake.iocontainers import Wildcards

    def value(wildcards, attempt):
        found = []
        for rule, wc in SWEEP_POINT_PARTS[wildcards.model]:
            res = rule.resources.get(name)
            if res is None:
                continue
            v = res.evaluate(Wildcards(fromdict=wc), attempt=attempt).value
            if isinstance(v, (int, float)):
                found.append(v)
        return combine(found) if found else 0

    return value


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


def section_params(section):
    """A config section with its corpus resolved (null: the first corpus)."""

    def params(wildcards=None):
        p = dict(config[section])
        p["corpus"] = p.get("corpus") or list(config["corpora"])[0]
        return p

    return params


def anatomy_pass_params(wildcards):
    """The `anatomy` section for `attention_statistics` when the job's model is one of the
    anatomy models, else None (its P13 rows are not computed, and changing `anatomy` does
    not rerun the pass for it)."""
    if wildcards.model in selected(config, "anatomy", "models"):
        return section_params("anatomy")()
    return None


def attention_statistics_inputs(wildcards):
    """The manifest and the tokens of `taxonomy` (and of `anatomy` for its models)."""
    out = {
        "manifest": output_of(rules.fetch_model.output.manifest, wildcards),
        "tokens": section_tokens("taxonomy")(wildcards),
    }
    if anatomy_pass_params(wildcards) is not None:
        out["anatomy_tokens"] = section_tokens("anatomy")(wildcards)
    return out


def section_tokens(section):
    """The tokens file of ``section``'s corpus for the job's model."""
    return lambda wc: tokens_file(wc, section_params(section)()["corpus"])


def repo_file(path):
    """A repository file named in the config (absolute paths, and ``~``, are kept)."""
    import os

    p = os.path.expanduser(path)
    return p if os.path.isabs(p) else static(path)


def interventions_models():
    return selected(config, "interventions", "models")


def interventions_params(wildcards):
    return config["interventions"]


def interventions_corpus(wildcards=None):
    """The web-text corpus of P5, P14, P15 (null: the first corpus under `corpora`)."""
    return config["interventions"]["corpus"] or CORPORA[0]


def interventions_tokens(wildcards):
    return tokens_file(wildcards, interventions_corpus())


def induction_prompt(wildcards):
    return repo_file(config["interventions"]["induction_intervention"]["prompt"])


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


def attn_only_models(bos=None):
    """Models of the `attn_only` section; ``bos=True``: only those run with BOS
    (bos_induction, L4, compares with and without it)."""
    from posmech.analyses.attn_only import resolve_bos

    p = config["attn_only"]
    models = selected(config, "attn_only", "models")
    if bos is None:
        return models
    return [m for m in models if resolve_bos(p["bos"], config["models"][m]) == bos]


def attn_only_params(wildcards=None):
    return config["attn_only"]


def check_attn_only():
    """What the config alone tells about the L rules, before any job: the settings, and
    sequence lengths against the context of trained models (n_ctx in the config)."""
    from posmech.analyses.attn_only import (
        check_settings,
        resolve_bos,
        sequence_lengths,
    )

    p = config["attn_only"]
    check_settings(p)
    for m in attn_only_models():
        entry = config["models"][m]
        if "train" not in entry:
            continue
        for key, n in sequence_lengths(p, resolve_bos(p["bos"], entry)).items():
            if n > entry["train"]["n_ctx"]:
                raise PosmechError(
                    f"{key}: sequences of {n} tokens are longer than model `{m}`'s context "
                    f"(models.{m}.train.n_ctx = {entry['train']['n_ctx']}); lower it"
                )


def attn_only_tokens(*keys):
    """The longest sequence (tokens, BOS counted) an L rule builds from the ``attn_only``
    settings ``keys`` (posmech.analyses.attn_only.sequence_lengths): its memory estimate's
    context, 13–41 tokens with the study's settings instead of the model's 1024."""
    from posmech.analyses.attn_only import sequence_lengths

    lengths = sequence_lengths(config["attn_only"], True)
    return max(lengths[f"attn_only.{k}"] for k in keys)


def attn_only_runtime(*counts):
    """``runtime`` of an L rule doing forward passes of ``sum(counts)`` short sequences
    (32 tokens each: an upper bound)."""

    def runtime(wildcards, attempt):
        from posmech.cluster import runtime_min

        shape = model_shape(wildcards.model)
        scale = config.get("cluster", {}).get("runtime_scale", 1.0)
        tokens = sum(counts) * 32
        return runtime_min(shape, tokens, 1, on_gpu(wildcards.model), scale, attempt)

    return runtime


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


def neurons_params(wildcards=None):
    return dict(config["neurons"])


def head_table_sources():
    """``{key: (rule output, models)}`` of the per-head tables the head-roles table (rule
    head_table) gathers (posmech.heads), each for the models of its config section."""
    anatomy = selected(config, "anatomy", "models")
    # key: (the output, its analysis, the models of its config section)
    sources = {
        "taxonomy": (
            rules.taxonomy.output.diagonal_taxonomy__table,
            "diagonal_taxonomy",
            taxonomy_models(),
        ),
        "chosen": (
            rules.taxonomy.output.diagonal_taxonomy__heads,
            "diagonal_taxonomy",
            taxonomy_models(),
        ),
        "taxa": (rules.anatomy.output.score_taxa__table, "score_taxa", anatomy),
        "etc": (rules.kernels.output.etc_table__table, "etc_table", kernels_models()),
        "classes": (
            rules.contextual.output.layer0_head_classes__table,
            "layer0_head_classes",
            contextual_models(),
        ),
        "roles": (
            rules.attn_only.output.random_token_patterns__heads,
            "random_token_patterns",
            attn_only_models(),
        ),
        "masses": (
            rules.attn_only.output.random_token_patterns__masses,
            "random_token_patterns",
            attn_only_models(),
        ),
    }
    return {
        k: (out, runs_on(analysis, models))
        for k, (out, analysis, models) in sources.items()
    }


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
