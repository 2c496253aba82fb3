# Score anatomy (P12, P13): raw q·k scores of the chosen previous-token heads, and the
# score taxa of every head. Reads the taxonomy's documented tables (heads.csv, taxonomy.csv)
# and the shared pass (attention_statistics.h5).


rule anatomy:
    """The anatomy family (docs/workflow.md, "Families"), one job per model. Its analyses,
    in the order the job runs them, and what each does, needs of a model, reads and
    writes: workflow/analyses/anatomy.yaml."""
    input:
        **declared_inputs("anatomy"),
        manifest=rules.fetch_model.output.manifest,
        tokens=lambda wc: tokens_file(wc, SETTINGS.anatomy.corpus),
    output:
        **declared_outputs("anatomy"),
    log:
        "logs/anatomy/{model}.log",
    benchmark:
        "benchmarks/anatomy/{model}.tsv"
    wildcard_constraints:
        model=regex(JOB_MODELS),  # a checkpoint, a twin: its sweep point (dynamics.smk)
    conda:
        "../envs/posmech.yaml"
    threads: model_threads
    resources:
        gpu=heavy_resources,
        mem_mb=heavy_mem_mb,
        runtime=heavy_runtime_for(1, 1),
    params:
        entry=model_entry,
        settings=SETTINGS.anatomy.as_param(),
    script:
        "../../scripts/anatomy_family.py"


collect(rules.anatomy, model=selected(config, "anatomy", "models"))
