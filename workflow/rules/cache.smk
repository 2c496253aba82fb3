

rule cache_activations:
    """Cache resid_pre / ln1_out of every layer and their position-wise means."""
    input:
        tokens=lambda wc: tokens_file(wc, wc.corpus),
        manifest=rules.fetch_model.output.manifest,
    output:
        h5="results/{model}/activations/{corpus}.h5",
    log:
        "logs/cache_activations/{model}/{corpus}.log",
    benchmark:
        "benchmarks/cache_activations/{model}/{corpus}.tsv"
    wildcard_constraints:
        model=regex(JOB_MODELS),  # a checkpoint, a twin: its sweep point (dynamics.smk)
        corpus=regex(CORPORA),
    conda:
        "../envs/posmech.yaml"
    threads: model_threads
    resources:
        gpu=heavy_resources,
        mem_mb=heavy_mem_mb_for(config["cache"]["batch_size"]),
        runtime=heavy_runtime_for(1, config["cache"]["n_documents"]),
    params:
        model=cache_model_entry,
        corpus=corpus_entry,
        settings=SETTINGS.cache.as_param(),
    script:
        "../../scripts/cache_activations.py"


collect(
    rules.cache_activations,
    model=selected(config, "cache", "models"),
    corpus=selected(config, "cache", "corpora"),
)
