# The taxonomy family (docs/workflow.md, "Families"): the shared pass and the diagonal
# taxonomy with the chosen heads (P6, P7). The posembed rules, which read the chosen heads,
# are in posembed.smk.


rule taxonomy:
    """The taxonomy family (docs/workflow.md, "Families"), one job per model. Its analyses,
    in the order the job runs them, and what each does, needs of a model, reads and
    writes: workflow/analyses/taxonomy.yaml."""
    input:
        unpack(attention_statistics_inputs),  # the manifest, the tokens
    output:
        **declared_outputs("taxonomy"),
    log:
        "logs/taxonomy/{model}.log",
    benchmark:
        "benchmarks/taxonomy/{model}.tsv"
    wildcard_constraints:
        model=regex(JOB_MODELS),  # a checkpoint, a twin: its sweep point (dynamics.smk)
    conda:
        "../envs/posmech.yaml"
    threads: model_threads
    resources:
        gpu=heavy_resources,
        mem_mb=heavy_mem_mb_for(
            max(config["taxonomy"]["batch_size"], config["anatomy"]["batch_size"])
        ),
        runtime=heavy_runtime_for(
            1, config["taxonomy"]["n_documents"] + config["anatomy"]["n_documents"]
        ),
    params:
        entry=model_entry,
        settings=SETTINGS.taxonomy.as_param(),
        anatomy=anatomy_pass_params,
    script:
        "../../scripts/taxonomy_family.py"


collect(rules.taxonomy, model=models_of("taxonomy"))
