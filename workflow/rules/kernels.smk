# Cheap (read HDF5/CSV, plot): run locally also with profiles/slurm (docs/cluster.md).
localrules:
    etc_table,
    kernel_heatmaps,
    etc_heatmap,


rule positional_kernels:
    """Every head's positional kernel pi(i | x_n) at the configured query positions (K1, K5)."""
    input:
        manifest=rules.fetch_model.output.manifest,
        means=lambda wc: output_of(
            rules.cache_activations.output.h5,
            wc,
            corpus=kernels_params()["means_corpus"],
        ),
        tokens=lambda wc: output_of(
            rules.tokenize.output.h5, wc, corpus=kernels_params()["query_corpus"]
        ),
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
        h5=rules.positional_kernels.output.h5,
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
        # the figures its scorecard rows point to (rules defined below: lambdas)
        kernels_figure=lambda wc: output_of(rules.kernel_heatmaps.output.selected, wc),
        heatmap=lambda wc: str(rules.etc_heatmap.output.figure),
        profiles=lambda wc: output_of(rules.kernel_heatmaps.output.profiles, wc),
    script:
        "../../scripts/etc_table.py"


rule kernel_heatmaps:
    """Query x key kernel heatmaps (K2) and kernels at n with their spread over texts (K5)."""
    input:
        h5=rules.positional_kernels.output.h5,
        table=rules.etc_table.output.table,
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
        tables=expand(rules.etc_table.output.table, model=etc_models()),
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
        models=etc_models(),
    script:
        "../../scripts/etc_heatmap.py"


collect(rules.etc_heatmap, when=bool(etc_models()))
collect(rules.positional_kernels, model=kernels_models())
collect(rules.etc_table, model=kernels_models())
collect(rules.kernel_heatmaps, model=kernels_models())
