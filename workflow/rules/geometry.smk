rule geometry:
    """The geometry family (docs/workflow.md, "Families"), one job per model. Its analyses,
    in the order the job runs them, and what each does, needs of a model, reads and
    writes: workflow/analyses/geometry.yaml."""
    input:
        manifest=rules.fetch_model.output.manifest,
    output:
        **declared_outputs("geometry"),
    log:
        "logs/geometry/{model}.log",
    benchmark:
        "benchmarks/geometry/{model}.tsv"
    wildcard_constraints:
        model=regex(JOB_MODELS),  # a checkpoint, a twin: its sweep point (dynamics.smk)
    conda:
        "../envs/posmech.yaml"
    threads: model_threads
    resources:
        gpu=heavy_resources,
        # running sums over positions inside the hooks: no activation is kept per context
        mem_mb=heavy_mem_mb_for(config["geometry"]["batch_size"], keeps=()),
        runtime=heavy_runtime_for(1, config["geometry"]["n_tokens"]),
    params:
        entry=model_entry,
        settings=SETTINGS.geometry.as_param(),
    script:
        "../../scripts/geometry_family.py"


collect(rules.geometry, model=models_of("geometry"))
