# Positional kernels and Effective Token Count (seed 003; claims K1-K5). Only
# positional_kernels runs the model (a few Bible chapters, for the queries x_n); the means
# p_i come from the activation cache, everything else reads kernels.h5 or etc.csv.


# Cheap (read HDF5/CSV, plot): run locally also with profiles/slurm (docs/cluster.md).
localrules:
    etc_table,
    kernel_heatmaps,
    etc_heatmap,


def kernels_models():
    return selected(config, "kernels", "models")


def kernels_params(wildcards=None):
    """The `kernels` config section with the corpora resolved (null: the first corpus)."""
    p = dict(config["kernels"])
    first = list(config["corpora"])[0]
    p["means_corpus"] = p.get("means_corpus") or first
    p["query_corpus"] = p.get("query_corpus") or first
    return p


rule positional_kernels:
    """Every head's positional kernel pi(i | x_n) at the configured query positions (K1, K5)."""
    input:
        manifest="resources/models/{model}/manifest.json",
        means=lambda wc: f"results/{wc.model}/activations/{kernels_params()['means_corpus']}.h5",
        tokens=lambda wc: f"results/{wc.model}/tokens/{kernels_params()['query_corpus']}.h5",
    output:
        h5="results/{model}/kernels/kernels.h5",
    log:
        "logs/positional_kernels/{model}.log",
    benchmark:
        "benchmarks/positional_kernels/{model}.tsv"
    wildcard_constraints:
        model=regex(MODELS),
    threads: 2
    resources:
        gpu=heavy_resources,
        mem_mb=heavy_mem_mb,
        runtime=heavy_runtime_for(1, config["kernels"]["n_chapters"]),
    params:
        entry=model_entry,
        kernels=kernels_params,
    script:
        "../../scripts/positional_kernels.py"


rule etc_table:
    """ETC of every (layer, head, n), its spread over query texts, kernel types (K3-K5)."""
    input:
        h5="results/{model}/kernels/kernels.h5",
    output:
        table=report(
            "results/{model}/kernels/etc.csv",
            caption="../report/etc_table.rst",
            category="K",
            subcategory="Positional kernels and ETC (K1-K5)",
        ),
        scorecard="results/{model}/scorecard/etc_table.csv",
    log:
        "logs/etc_table/{model}.log",
    wildcard_constraints:
        model=regex(MODELS),
    params:
        kernels=kernels_params,
        kernels_figure="results/{model}/kernels/kernels_selected.png",
        heatmap="results/kernels/etc_heatmap.png",
        profiles="results/{model}/kernels/kernel_profiles.png",
    script:
        "../../scripts/etc_table.py"


rule kernel_heatmaps:
    """Query x key kernel heatmaps (K2) and kernels at n with their spread over texts (K5)."""
    input:
        h5="results/{model}/kernels/kernels.h5",
        table="results/{model}/kernels/etc.csv",
    output:
        layer0=report(
            "results/{model}/kernels/kernels_layer0.png",
            caption="../report/kernel_heatmaps.rst",
            category="K",
            subcategory="Positional kernels and ETC (K1-K5)",
        ),
        selected=report(
            "results/{model}/kernels/kernels_selected.png",
            caption="../report/kernel_heatmaps.rst",
            category="K",
            subcategory="Positional kernels and ETC (K1-K5)",
        ),
        profiles=report(
            "results/{model}/kernels/kernel_profiles.png",
            caption="../report/kernel_profiles.rst",
            category="K",
            subcategory="Positional kernels and ETC (K1-K5)",
        ),
    log:
        "logs/kernel_heatmaps/{model}.log",
    wildcard_constraints:
        model=regex(MODELS),
    params:
        kernels=kernels_params,
    script:
        "../../scripts/kernel_heatmaps.py"


rule etc_heatmap:
    """log ETC over layers x heads, every kernels model side by side (K4)."""
    input:
        tables=expand("results/{model}/kernels/etc.csv", model=kernels_models()),
    output:
        figure=report(
            "results/kernels/etc_heatmap.png",
            caption="../report/etc_heatmap.rst",
            category="K",
            subcategory="Positional kernels and ETC (K1-K5)",
        ),
    log:
        "logs/etc_heatmap/etc_heatmap.log",
    params:
        kernels=kernels_params,
        models=kernels_models(),
    script:
        "../../scripts/etc_heatmap.py"


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
