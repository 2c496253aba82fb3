# The sinks family (docs/workflow.md, "Families"): attention sinks and massive activations
# (S1-S4, beyond the seed posts). Library: posmech.analyses.sinks; settings and checks:
# posmech.settings.sinks.
try:
    SETTINGS.sinks.check()
except PosmechError as err:
    raise WorkflowError(str(err)) from None


rule sinks:
    """The sinks family (docs/workflow.md, "Families"), one job per model. Its analyses,
    in the order the job runs them, and what each does, needs of a model, reads and
    writes: workflow/analyses/sinks.yaml."""
    input:
        unpack(sinks_inputs),
    output:
        **declared_outputs("sinks"),
    log:
        "logs/sinks/{model}.log",
    benchmark:
        "benchmarks/sinks/{model}.tsv"
    wildcard_constraints:
        model=regex(JOB_MODELS),  # a checkpoint, a twin: its sweep point (dynamics.smk)
    conda:
        "../envs/posmech.yaml"
    threads: model_threads
    resources:
        gpu=heavy_resources,
        mem_mb=heavy_mem_mb_for(
            config["sinks"]["batch_size"],
            keeps=("patterns", "residuals"),
            n_tokens=config["sinks"]["n_tokens"],
        ),
        runtime=RESOURCES.short_runtime(
            config["sinks"]["n_samples"], config["sinks"]["n_tokens"]
        ),
    params:
        entry=model_entry,
        settings=SETTINGS.sinks.as_param(),
    script:
        "../../scripts/sinks_family.py"


collect(rules.sinks, model=models_of("sinks"))
