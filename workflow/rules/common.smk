# Helpers shared by every stage: config validation (before any job runs) and paths.
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError

sys.path.insert(0, str(Path(workflow.basedir).parent / "src"))

from posmech.config import load_schema, model_names_by_kind, selected, validate_config
from posmech.errors import PosmechError
from posmech.preflight import jobs_run_locally, preflight

try:
    _schema = load_schema(workflow.source_path("../schemas/config.schema.yaml"))
    validate_config(config, _schema)
    # Duplicate YAML keys, every named file, the model's shape, the device: see
    # src/posmech/preflight.py (one call, before any job is scheduled).
    preflight(
        config,
        _schema,
        repo=Path(workflow.basedir).parent,
        configfiles=workflow.configfiles,
        jobs_run_here=workflow.is_main_process and jobs_run_locally(sys.argv),
    )
except PosmechError as err:
    raise WorkflowError(str(err)) from None


REPO = Path(workflow.basedir).parent
MODELS = list(config["models"])
CORPORA = list(config["corpora"])


def regex(names):
    """A wildcard constraint matching exactly ``names`` (nothing when empty)."""
    return "|".join(names) if names else "(?!x)x"


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


def heavy_resources(wildcards):
    """GPUs of a model-heavy job for ``wildcards.model`` (0 or 1): ``gpu=heavy_resources``."""
    return 1 if on_gpu(wildcards.model) else 0


def model_shape(model):
    """Estimated size of a configured model (config.json when on disk, else from config)."""
    from posmech.cluster import model_shape as estimate

    return estimate(model, config["models"][model], f"resources/models/{model}")


def heavy_corpora(wildcards):
    """The corpus of a job (``wildcards.corpus``), else every configured corpus."""
    return [wildcards.corpus] if "corpus" in wildcards.keys() else CORPORA


def heavy_mem_mb_for(batch):
    """``mem_mb`` of a model-heavy job running ``batch`` contexts per forward pass:
    ``mem_mb=heavy_mem_mb_for(config["geometry"]["batch_size"])``."""

    def mem(wildcards, attempt):
        from posmech.cluster import mem_mb

        entry = config["models"][wildcards.model]
        scale = config.get("cluster", {}).get("mem_scale", 1.0)
        return mem_mb(
            model_shape(wildcards.model), entry["dtype"], batch, scale, attempt
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


def model_entry(wildcards):
    return config["models"][wildcards.model]


def weights_entry(wildcards):
    """What determines a model's weights, and only that: the params of fetch_model and
    train_demo_model (analysis keys such as n_ctx, device, dtype never refetch/retrain).
    """
    entry = config["models"][wildcards.model]
    if "train" in entry:
        return {"train": entry["train"]}
    return {"source": entry["source"], "revision": entry["revision"]}


def corpus_entry(wildcards):
    return config["corpora"][wildcards.corpus]


def manifest(model):
    return f"resources/models/{model}/manifest.json"


def tokens_targets():
    models = selected(config, "tokenize", "models")
    corpora = selected(config, "tokenize", "corpora")
    return [f"results/{m}/tokens/{c}.h5" for m in models for c in corpora]


def training_targets():
    return [
        f"results/{m}/training/{f}"
        for m in model_names_by_kind(config, "train")
        for f in ("curve.csv", "curve.png", "summary.json")
    ]


# Each stage's rule file appends a function returning its final targets; `rule all`
# asks for all of them (nothing reads results/ by globbing).
TARGETS = [tokens_targets, training_targets]


def all_targets():
    return [t for targets in TARGETS for t in targets()]


# What the final `report` rule (rules/report.smk) reads, as named inputs. Each stage
# appends, at the end of its .smk, a function returning paths (one line each):
#   SCORECARDS.append(<stage>_scorecards)  -> results/{model}/scorecard/<rule>.csv files
#   REPORT_FIGURES.append(<stage>_figures)  -> PNGs shown in the HTML report (their rule's
#                                              report(caption=, category=) is reused)
#   REPORT_TABLES.append(<stage>_tables)    -> tidy CSVs shown (head) and linked
SCORECARDS = []
REPORT_FIGURES = []
REPORT_TABLES = []


# ---------------------------------------------------------------- cache stage (cache.smk)
def cache_targets():
    models = selected(config, "cache", "models")
    corpora = selected(config, "cache", "corpora")
    return [f"results/{m}/activations/{c}.h5" for m in models for c in corpora]


TARGETS.append(cache_targets)


# ---------------------------------------------------------------- geometry stage (geometry.smk)
def geometry_models():
    return selected(config, "geometry", "models")


GEOMETRY_RULES = [
    "extended_positional_embeddings",
    "positional_pca",
    "canonical_angles",
    "positional_sparsity",
]
GEOMETRY_RULES = [
    "extended_positional_embeddings",
    "positional_pca",
    "canonical_angles",
    "positional_sparsity",
]
GEOMETRY_FIGURES = [
    "extended_agreement.png",
    "pca_wpos_helix.png",
    "pca_helices.png",
    "pca_comparison.png",
    "pca_explained.png",
    "canonical_angles.png",
    "sparsity.png",
]
GEOMETRY_FIGURES = [
    "extended_agreement.png",
    "pca_wpos_helix.png",
    "pca_helices.png",
    "pca_comparison.png",
    "pca_explained.png",
    "canonical_angles.png",
    "sparsity.png",
]
GEOMETRY_TABLES = [
    "extended_agreement.csv",
    "pca.csv",
    "canonical_angles.csv",
    "sparsity.csv",
]


GEOMETRY_TABLES = [
    "extended_agreement.csv",
    "pca.csv",
    "canonical_angles.csv",
    "sparsity.csv",
]


def geometry_scorecards():
    return [
        f"results/{m}/scorecard/{r}.csv"
        for m in geometry_models()
        for r in GEOMETRY_RULES
    ]


def geometry_figures():
    return [
        f"results/{m}/geometry/{f}" for m in geometry_models() for f in GEOMETRY_FIGURES
    ]


def geometry_tables():
    return [
        f"results/{m}/geometry/{f}" for m in geometry_models() for f in GEOMETRY_TABLES
    ]


def geometry_targets():
    return (
        [f"results/{m}/geometry/extended.h5" for m in geometry_models()]
        + geometry_scorecards()
        + geometry_figures()
        + geometry_tables()
    )


TARGETS.append(geometry_targets)
SCORECARDS.append(geometry_scorecards)
REPORT_FIGURES.append(geometry_figures)
REPORT_TABLES.append(geometry_tables)


# ---------------------------------------------------------------- kernels stage (kernels.smk)
def kernels_models():
    return selected(config, "kernels", "models")


def kernels_params(wildcards=None):
    """The `kernels` config section with the corpora resolved (null: the first corpus)."""
    p = dict(config["kernels"])
    first = list(config["corpora"])[0]
    p["means_corpus"] = p.get("means_corpus") or first
    p["query_corpus"] = p.get("query_corpus") or first
    return p


def kernels_scorecards():
    return [f"results/{m}/scorecard/etc_table.csv" for m in kernels_models()]


def kernels_figures():
    figs = ["results/kernels/etc_heatmap.png"] if kernels_models() else []
    for m in kernels_models():
        figs += [
            f"results/{m}/kernels/{f}.png"
            for f in ("kernels_layer0", "kernels_selected", "kernel_profiles")
        ]
    return figs


def kernels_tables():
    return [f"results/{m}/kernels/etc.csv" for m in kernels_models()]


def kernels_targets():
    return (
        [f"results/{m}/kernels/kernels.h5" for m in kernels_models()]
        + kernels_scorecards()
        + kernels_figures()
        + kernels_tables()
    )


TARGETS.append(kernels_targets)
SCORECARDS.append(kernels_scorecards)
REPORT_FIGURES.append(kernels_figures)
REPORT_TABLES.append(kernels_tables)


# ---------------------------------------------------------------- taxonomy stage (taxonomy.smk)
def taxonomy_models(section="taxonomy"):
    return selected(config, section, "models")


def section_params(section):
    """A config section with its corpus resolved (null: the first corpus)."""

    def params(wildcards=None):
        p = dict(config[section])
        p["corpus"] = p.get("corpus") or list(config["corpora"])[0]
        return p

    return params


def section_tokens(section):
    return (
        lambda wc: f"results/{wc.model}/tokens/{section_params(section)()['corpus']}.h5"
    )


def repo_file(path):
    """A repository file named in the config (absolute paths, and ``~``, are kept)."""
    import os

    p = os.path.expanduser(path)
    return p if os.path.isabs(p) else static(path)


def taxonomy_scorecards():
    return (
        [f"results/{m}/scorecard/diagonal_taxonomy.csv" for m in taxonomy_models()]
        + [
            f"results/{m}/scorecard/posembed_averaging.csv"
            for m in taxonomy_models("posembed_averaging")
        ]
        + [
            f"results/{m}/scorecard/posembed_attention.csv"
            for m in taxonomy_models("posembed_attention")
        ]
    )


def taxonomy_figures():
    return (
        [f"results/{m}/taxonomy/taxonomy.png" for m in taxonomy_models()]
        + [
            f"results/{m}/posembed/averaging.png"
            for m in taxonomy_models("posembed_averaging")
        ]
        + [
            f"results/{m}/posembed/attention.png"
            for m in taxonomy_models("posembed_attention")
        ]
    )


def taxonomy_tables():
    return (
        [f"results/{m}/taxonomy/taxonomy.csv" for m in taxonomy_models()]
        + [
            f"results/{m}/posembed/averaging.csv"
            for m in taxonomy_models("posembed_averaging")
        ]
        + [
            f"results/{m}/posembed/attention.csv"
            for m in taxonomy_models("posembed_attention")
        ]
    )


def taxonomy_targets():
    return (
        [f"results/{m}/taxonomy/heads.csv" for m in taxonomy_models()]
        + taxonomy_scorecards()
        + taxonomy_figures()
        + taxonomy_tables()
    )


TARGETS.append(taxonomy_targets)
SCORECARDS.append(taxonomy_scorecards)
REPORT_FIGURES.append(taxonomy_figures)
REPORT_TABLES.append(taxonomy_tables)


# ---------------------------------------------------------------- interventions stage (interventions.smk)
def interventions_models():
    return selected(config, "interventions", "models")


def interventions_params(wildcards):
    return config["interventions"]


def interventions_corpus(wildcards=None):
    """The web-text corpus of P5, P14, P15 (null: the first corpus under `corpora`)."""
    return config["interventions"]["corpus"] or CORPORA[0]


def interventions_tokens(wildcards):
    return f"results/{wildcards.model}/tokens/{interventions_corpus()}.h5"


def induction_prompt(wildcards):
    return repo_file(config["interventions"]["induction_intervention"]["prompt"])


INTERVENTION_RULES = [
    "prev_knockout",
    "extended_averaging",
    "repeated_tokens",
    "induction_intervention",
]


INTERVENTION_RULES = [
    "prev_knockout",
    "extended_averaging",
    "repeated_tokens",
    "induction_intervention",
]


def interventions_targets():
    return [
        f"results/{m}/{d}/{r}.{ext}"
        for m in interventions_models()
        for r in INTERVENTION_RULES
        for d, ext in (
            ("interventions", "csv"),
            ("interventions", "png"),
            ("scorecard", "csv"),
        )
    ]


def interventions_scorecards():
    return [
        f"results/{m}/scorecard/{r}.csv"
        for m in interventions_models()
        for r in INTERVENTION_RULES
    ]


def interventions_figures():
    return [
        f"results/{m}/interventions/{r}.png"
        for m in interventions_models()
        for r in INTERVENTION_RULES
    ]


def interventions_tables():
    return [
        f"results/{m}/interventions/{r}.csv"
        for m in interventions_models()
        for r in INTERVENTION_RULES
    ]


TARGETS.append(interventions_targets)
SCORECARDS.append(interventions_scorecards)
REPORT_FIGURES.append(interventions_figures)
REPORT_TABLES.append(interventions_tables)


# ---------------------------------------------------------------- report stage (report.smk)
def report_registered(registry):
    return list(dict.fromkeys(p for paths in registry for p in paths()))


def report_figures():
    """Registered figures, then each trained model's training curve."""
    curves = [
        f"results/{m}/training/curve.png" for m in model_names_by_kind(config, "train")
    ]
    return list(dict.fromkeys(report_registered(REPORT_FIGURES) + curves))


def report_upstream_targets():
    """Every other stage's final targets: the report runs after all of them."""
    return [
        t for targets in TARGETS if targets is not report_targets for t in targets()
    ]


def report_flags(wildcards):
    """Per figure/table: the producing rule, its wildcards and its report() caption and
    category (so the HTML report reuses the captions of Snakemake's native report)."""
    out = {}
    for path in report_figures() + report_registered(REPORT_TABLES):
        for r in workflow.rules:
            for o in r.output:
                flag = o.flags.get("report")
                match = o.match(path) if flag is not None else None
                if match:
                    caption = flag.caption
                    out[path] = {
                        "rule": r.name,
                        "wildcards": match.groupdict(),
                        "caption": (
                            caption.get_path_or_uri(secret_free=True)
                            if caption
                            else None
                        ),
                        "category": flag.category,
                    }
                    break
            if path in out:
                break
    return out


def report_targets():
    return ["results/report/index.html", "results/report/scorecard.csv"]


TARGETS.append(report_targets)
