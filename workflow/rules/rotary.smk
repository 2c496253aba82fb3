# The rotary rule (docs/workflow.md, "Families": a rule of its own, config section
# rotary_frequencies): which rotary frequency pairs carry each head's q·k (P17, P18).
# Library posmech.analyses.rotary, figure posmech.plots.rotary.


rule rotary_frequencies:
    """A rule of its own: analysis rotary_frequencies, one job per rotary model. What
    it does, needs, reads and writes: workflow/analyses/rotary_frequencies.yaml."""
    input:
        manifest=rules.fetch_model.output.manifest,
        tokens=lambda wc: tokens_file(wc, SETTINGS.rotary_frequencies.corpus),
    output:
        **declared_outputs("rotary_frequencies"),
    log:
        "logs/rotary_frequencies/{model}.log",
    benchmark:
        "benchmarks/rotary_frequencies/{model}.tsv"
    wildcard_constraints:
        model=regex(FINAL_MODELS),  # a checkpoint: its sweep point (dynamics.smk)
    conda:
        "../envs/posmech.yaml"
    threads: model_threads
    resources:
        gpu=heavy_resources,
        mem_mb=heavy_mem_mb_for(config["rotary_frequencies"]["batch_size"]),
        runtime=heavy_runtime_for(1, config["rotary_frequencies"]["n_documents"]),
    params:
        entry=model_entry,
        settings=SETTINGS.rotary_frequencies.as_param(),
    script:
        "../../scripts/rotary_frequencies.py"


collect(
    rules.rotary_frequencies,
    model=selected(config, "rotary_frequencies", "models"),
)
