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
    """True when the model's device resolves to CUDA (``cuda``, or ``auto`` on a machine
    that has one); model-heavy rules then request ``gpu=1``."""
    device = config["models"][model]["device"]
    if device == "auto":
        import shutil

        return shutil.which("nvidia-smi") is not None
    return device == "cuda"


def heavy_resources(wildcards):
    """Resources of a model-heavy rule for ``wildcards.model`` (used by the SLURM profile)."""
    return 1 if on_gpu(wildcards.model) else 0


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
