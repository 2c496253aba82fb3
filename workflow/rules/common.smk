# Helpers shared by every rule file: config validation (before any job runs) and paths.
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError

sys.path.insert(0, str(Path(workflow.basedir).parent / "src"))

from posmech.config import load_schema, model_names_by_kind, selected, validate_config
from posmech.errors import PosmechError

try:
    validate_config(
        config, load_schema(workflow.source_path("../schemas/config.schema.yaml"))
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
    """A static input shipped in the repository (e.g. ``resources/prompts/...``), as an
    absolute path, so the workflow also runs with ``--directory`` elsewhere."""
    return str(REPO / path)


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
