# Contextual neurons in layer 0 (C1-C3, seed post 004). Reads the layer-0 decomposition
# (layer0.h5) and the K7 head classes of contextual.smk; never recomputes them.
# Library: posmech.analyses.neurons; artifact layout: docs/artifacts.md.


rule neurons:
    """The neurons family (docs/workflow.md, "Families"), one job per model. Its analyses,
    in the order the job runs them, and what each does, needs of a model, reads and
    writes: workflow/analyses/neurons.yaml."""
    input:
        unpack(contextual_tokens),
        **declared_inputs("neurons"),
        manifest=rules.fetch_model.output.manifest,
    output:
        **declared_outputs("neurons"),
    log:
        "logs/neurons/{model}.log",
    benchmark:
        "benchmarks/neurons/{model}.tsv"
    wildcard_constraints:
        model=regex(JOB_MODELS),  # a checkpoint, a twin: its sweep point (dynamics.smk)
    conda:
        "../envs/posmech.yaml"
    threads: model_threads
    resources:
        gpu=heavy_resources,  # bag_of_tokens_fit runs the model
        mem_mb=heavy_mem_mb,
        runtime=heavy_runtime_for(3),  # each analysis had one pass's budget
    params:
        settings=SETTINGS.neurons.as_param(),
        contextual=SETTINGS.contextual.as_param(),
        entry=model_entry,
    script:
        "../../scripts/neurons_family.py"


collect(rules.neurons, model=neurons_models())
