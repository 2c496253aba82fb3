# Cheap (read HDF5/CSV, plot): run locally also with profiles/slurm (docs/cluster.md).
localrules:
    etc_heatmap,


rule kernels:
    """The kernels family (docs/workflow.md, "Families"), one job per model. Its analyses,
    in the order the job runs them, and what each does, needs of a model, reads and
    writes: workflow/analyses/kernels.yaml."""
    input:
        manifest=rules.fetch_model.output.manifest,
        means=lambda wc: output_of(
            rules.cache_activations.output.h5,
            wc,
            corpus=SETTINGS.kernels.means_corpus,
        ),
        tokens=lambda wc: tokens_file(wc, SETTINGS.kernels.query_corpus),
    output:
        **declared_outputs("kernels"),
    log:
        "logs/kernels/{model}.log",
    benchmark:
        "benchmarks/kernels/{model}.tsv"
    wildcard_constraints:
        model=regex(JOB_MODELS),  # a checkpoint, a twin: its sweep point (dynamics.smk)
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
