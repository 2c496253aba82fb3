# Cheap (read HDF5/CSV, plot): run locally also with profiles/slurm (docs/cluster.md).
localrules:
    etc_heatmap,


rule kernels:
    """The kernels family (docs/workflow.md, "Families"), one job per model: every head's
    positional kernel pi(i | x_n) at the configured query positions (positional_kernels:
    K1, K5); ETC of every (layer, head, n), its spread over query texts and kernel types
    (etc_table: K3-K5); query x key kernel heatmaps (K2) and kernels at n with their spread
    over texts (kernel_heatmaps: K5)."""
    input:
        manifest=rules.fetch_model.output.manifest,
        means=lambda wc: output_of(
            rules.cache_activations.output.h5,
            wc,
            corpus=SETTINGS.kernels.means_corpus,
        ),
        tokens=lambda wc: tokens_file(wc, SETTINGS.kernels.query_corpus),
    output:
        positional_kernels__h5="results/{model}/kernels/kernels.h5",
        etc_table__table=report(
            "results/{model}/kernels/etc.csv",
            caption="../report/etc_table.rst",
            category="K",
            subcategory="Positional kernels and ETC (K1-K5)",
        ),
        etc_table__scorecard="results/{model}/scorecard/etc_table.csv",
        kernel_heatmaps__layer0=report(
            "results/{model}/kernels/kernels_layer0.png",
            caption="../report/kernel_heatmaps.rst",
            category="K",
            subcategory="Positional kernels and ETC (K1-K5)",
        ),
        kernel_heatmaps__selected=report(
            "results/{model}/kernels/kernels_selected.png",
            caption="../report/kernel_heatmaps.rst",
            category="K",
            subcategory="Positional kernels and ETC (K1-K5)",
        ),
        kernel_heatmaps__profiles=report(
            "results/{model}/kernels/kernel_profiles.png",
            caption="../report/kernel_profiles.rst",
            category="K",
            subcategory="Positional kernels and ETC (K1-K5)",
        ),
    log:
        "logs/kernels/{model}.log",
    benchmark:
        "benchmarks/kernels/{model}.tsv"
    wildcard_constraints:
        model=regex(FINAL_MODELS),  # a checkpoint: its sweep point (dynamics.smk)
    conda:
        "../envs/posmech.yaml"
    threads: model_threads
    resources:
        gpu=heavy_resources,
        mem_mb=heavy_mem_mb,
        runtime=heavy_runtime_for(1, config["kernels"]["n_chapters"]),
    params:
        entry=model_entry,
        settings=SETTINGS.kernels.as_param(),
        # the figures etc_table's scorecard rows point to
        kernels_figure=lambda wc: output_of(
            rules.kernels.output.kernel_heatmaps__selected, wc
        ),
        heatmap=lambda wc: str(rules.etc_heatmap.output.figure),
        profiles=lambda wc: output_of(
            rules.kernels.output.kernel_heatmaps__profiles, wc
        ),
    script:
        "../../scripts/kernels_family.py"


rule etc_heatmap:
    """log ETC over layers x heads, every kernels model side by side (K4)."""
    input:
        tables=expand(rules.kernels.output.etc_table__table, model=etc_models()),
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
        settings=SETTINGS.kernels.as_param(),
        models=etc_models(),
    script:
        "../../scripts/etc_heatmap.py"


collect(rules.etc_heatmap, when=bool(etc_models()))
collect(rules.kernels, model=models_of("kernels"))
