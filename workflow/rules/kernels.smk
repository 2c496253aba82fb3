# Cheap (read HDF5/CSV, plot): run locally also with profiles/slurm (docs/cluster.md).
localrules:
    etc_table,
    kernel_heatmaps,
    etc_heatmap,


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
    conda:
        "../envs/posmech.yaml"
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
    conda:
        "../envs/posmech.yaml"
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
    conda:
        "../envs/posmech.yaml"
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
    conda:
        "../envs/posmech.yaml"
    params:
        kernels=kernels_params,
        models=kernels_models(),
    script:
        "../../scripts/etc_heatmap.py"
