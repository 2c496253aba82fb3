# The taxonomy family (docs/workflow.md, "Families"): the shared pass and the diagonal
# taxonomy with the chosen heads (P6, P7). The posembed rules, which read the chosen heads,
# are in posembed.smk.


rule taxonomy:
    """The taxonomy family (docs/workflow.md, "Families"), one job per model:
    - attention_statistics: One forward pass over the web-text documents for the diagonal
      taxonomy (P6, P7) and,
    - for the anatomy models, the score taxa (P13): diagonal sums and P13 row windows of
      every
    - head; a document both sections use runs once (analyses/taxonomy/statistics.py);
    - diagonal_taxonomy: Mean attention per diagonal offset for every head; previous-token
      heads (P6), their
    - ranking (P7), TransformerLens's head_detector score; the chosen sharp / early heads.
    """
    input:
        unpack(attention_statistics_inputs),  # the manifest, the tokens
    output:
        attention_statistics__h5="results/{model}/taxonomy/attention_statistics.h5",
        diagonal_taxonomy__table=report(
            "results/{model}/taxonomy/taxonomy.csv",
            caption="../report/diagonal_taxonomy.rst",
            category="P",
            subcategory="Previous-token heads (P2-P7)",
        ),
        diagonal_taxonomy__diagonals="results/{model}/taxonomy/diagonals.csv",
        diagonal_taxonomy__heads="results/{model}/taxonomy/heads.csv",
        diagonal_taxonomy__figure=report(
            "results/{model}/taxonomy/taxonomy.png",
            caption="../report/diagonal_taxonomy.rst",
            category="P",
            subcategory="Previous-token heads (P2-P7)",
        ),
        diagonal_taxonomy__scorecard="results/{model}/scorecard/diagonal_taxonomy.csv",
    log:
        "logs/taxonomy/{model}.log",
    benchmark:
        "benchmarks/taxonomy/{model}.tsv"
    wildcard_constraints:
        model=regex(FINAL_MODELS),  # a checkpoint: its sweep point (dynamics.smk)
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
