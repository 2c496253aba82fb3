# The posembed rules (docs/workflow.md, "Families": rules of their own, one config section
# each, posembed_averaging and posembed_attention): W_pos averaged in groups of k (P2-P4).
# Library posmech.analyses.posembed, figures posmech.plots.posembed.


rule posembed_averaging:
    """A rule of its own: analysis posembed_averaging, one job per model. What it does,
    needs of a model, reads and writes: workflow/analyses/posembed_averaging.yaml."""
    input:
        manifest=rules.fetch_model.output.manifest,
        tokens=lambda wc: tokens_file(wc, SETTINGS.posembed_averaging.corpus),
        corpus=lambda wc: output_of(
            rules.prepare_corpus.output.jsonl,
            corpus=SETTINGS.posembed_averaging.corpus,
        ),
        prompts=static(SETTINGS.posembed_averaging.prompts),
    output:
        **declared_outputs("posembed_averaging"),
    log:
        "logs/posembed_averaging/{model}.log",
    benchmark:
        "benchmarks/posembed_averaging/{model}.tsv"
    wildcard_constraints:
        model=regex(JOB_MODELS),  # a checkpoint, a twin: its sweep point (dynamics.smk)
    conda:
        "../envs/posmech.yaml"
    threads: model_threads
    resources:
        gpu=heavy_resources,
        mem_mb=heavy_mem_mb,
        runtime=heavy_runtime_for(4, config["posembed_averaging"]["n_documents"]),
    params:
        entry=model_entry,
        settings=SETTINGS.posembed_averaging.as_param(),
    script:
        "../../scripts/posembed_averaging.py"


rule posembed_attention:
    """A rule of its own: analysis posembed_attention, one job per model. What it does,
    needs of a model, reads and writes: workflow/analyses/posembed_attention.yaml."""
    input:
        **declared_inputs("posembed_attention"),
        manifest=rules.fetch_model.output.manifest,
        tokens=lambda wc: tokens_file(wc, SETTINGS.posembed_attention.corpus),
    output:
        **declared_outputs("posembed_attention"),
    log:
        "logs/posembed_attention/{model}.log",
    benchmark:
        "benchmarks/posembed_attention/{model}.tsv"
    wildcard_constraints:
        model=regex(JOB_MODELS),  # a checkpoint, a twin: its sweep point (dynamics.smk)
    conda:
        "../envs/posmech.yaml"
    threads: model_threads
    resources:
        gpu=heavy_resources,
        mem_mb=heavy_mem_mb,
        runtime=heavy_runtime_for(4, 1),
    params:
        entry=model_entry,
        settings=SETTINGS.posembed_attention.as_param(),
    script:
        "../../scripts/posembed_attention.py"


collect(
    rules.posembed_averaging, model=selected(config, "posembed_averaging", "models")
)
collect(
    rules.posembed_attention, model=selected(config, "posembed_attention", "models")
)
