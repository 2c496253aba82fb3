

rule interventions:
    """The interventions family (docs/workflow.md, "Families"), one job per model. Its
    analyses, in the order the job runs them, and what each does, needs of a model,
    reads and writes: workflow/analyses/interventions.yaml."""
    input:
        **declared_inputs("interventions"),
        manifest=rules.fetch_model.output.manifest,
        tokens=lambda wc: tokens_file(
            wc, SETTINGS.interventions.corpus_or_first(config)
        ),
        prompt=lambda wc: static(SETTINGS.interventions.induction_intervention.prompt),
    output:
        **declared_outputs("interventions"),
    log:
        "logs/interventions/{model}.log",
    benchmark:
        "benchmarks/interventions/{model}.tsv"
    wildcard_constraints:
        model=regex(JOB_MODELS),  # a checkpoint, a twin: its sweep point (dynamics.smk)
    conda:
        "../envs/posmech.yaml"
    threads: model_threads
    resources:
        gpu=heavy_resources,
        mem_mb=heavy_mem_mb,
        # prev_knockout 3 passes and repeated_tokens 2 over the documents; the induction
        # intervention's 4 passes over one prompt count as one more
        runtime=heavy_runtime_for(6, config["interventions"]["n_documents"]),
    params:
        entry=model_entry,
        settings=SETTINGS.interventions.as_param(),
        corpus=lambda wc: SETTINGS.interventions.corpus_or_first(config),
    script:
        "../../scripts/interventions_family.py"


rule extended_averaging:
    """A rule of its own: analysis extended_averaging, one job per model. What it does,
    needs of a model, reads and writes: workflow/analyses/extended_averaging.yaml."""
    input:
        **declared_inputs("extended_averaging"),
        manifest=rules.fetch_model.output.manifest,
        tokens=lambda wc: tokens_file(
            wc, SETTINGS.interventions.corpus_or_first(config)
        ),
    output:
        **declared_outputs("extended_averaging"),
    log:
        "logs/extended_averaging/{model}.log",
    benchmark:
        "benchmarks/extended_averaging/{model}.tsv"
    wildcard_constraints:
        model=regex(JOB_MODELS),  # a checkpoint, a twin: its sweep point (dynamics.smk)
    conda:
        "../envs/posmech.yaml"
    threads: model_threads
    resources:
        gpu=heavy_resources,
        mem_mb=heavy_mem_mb,
        runtime=heavy_runtime_for(3, config["interventions"]["n_documents"]),
    params:
        entry=model_entry,
        settings=SETTINGS.interventions.as_param(),
        corpus=lambda wc: SETTINGS.interventions.corpus_or_first(config),
    script:
        "../../scripts/extended_averaging.py"


collect(rules.interventions, model=models_of("interventions"))
collect(rules.extended_averaging, model=models_of("interventions"))
