# Cheap (read HDF5, classify, plot): run locally also with profiles/slurm (docs/cluster.md).


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
        model=regex(MODELS),
    conda:
        "../envs/posmech.yaml"
    threads: 2
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
        taxonomy=section_params("taxonomy"),
        anatomy=anatomy_pass_params,
    script:
        "../../scripts/taxonomy_family.py"


rule posembed_averaging:
    """W_pos averaged in groups of k: held-out next-token loss (P2) and repeat-string
    prompt probabilities (P3); the model is restored bitwise after each k."""
    input:
        manifest=rules.fetch_model.output.manifest,
        tokens=section_tokens("posembed_averaging"),
        corpus=lambda wc: output_of(
            rules.prepare_corpus.output.jsonl,
            corpus=section_params("posembed_averaging")()["corpus"],
        ),
        prompts=repo_file(config["posembed_averaging"]["prompts"]),
    output:
        table=report(
            "results/{model}/posembed/averaging.csv",
            caption="../report/posembed_averaging.rst",
            category="P",
            subcategory="Previous-token heads (P2-P7)",
        ),
        figure=report(
            "results/{model}/posembed/averaging.png",
            caption="../report/posembed_averaging.rst",
            category="P",
            subcategory="Previous-token heads (P2-P7)",
        ),
        scorecard="results/{model}/scorecard/posembed_averaging.csv",
    log:
        "logs/posembed_averaging/{model}.log",
    benchmark:
        "benchmarks/posembed_averaging/{model}.tsv"
    wildcard_constraints:
        model=regex(MODELS),
    conda:
        "../envs/posmech.yaml"
    threads: 2
    resources:
        gpu=heavy_resources,
        mem_mb=heavy_mem_mb,
        runtime=heavy_runtime_for(4, config["posembed_averaging"]["n_documents"]),
    params:
        entry=model_entry,
        averaging=section_params("posembed_averaging"),
    script:
        "../../scripts/posembed_averaging.py"


rule posembed_attention:
    """The chosen heads' attention window on a document, intact vs W_pos averaged (P4)."""
    input:
        manifest=rules.fetch_model.output.manifest,
        tokens=section_tokens("posembed_attention"),
        heads=rules.taxonomy.output.diagonal_taxonomy__heads,
    output:
        table=report(
            "results/{model}/posembed/attention.csv",
            caption="../report/posembed_attention.rst",
            category="P",
            subcategory="Previous-token heads (P2-P7)",
        ),
        patterns="results/{model}/posembed/attention.h5",
        figure=report(
            "results/{model}/posembed/attention.png",
            caption="../report/posembed_attention.rst",
            category="P",
            subcategory="Previous-token heads (P2-P7)",
        ),
        scorecard="results/{model}/scorecard/posembed_attention.csv",
    log:
        "logs/posembed_attention/{model}.log",
    benchmark:
        "benchmarks/posembed_attention/{model}.tsv"
    wildcard_constraints:
        model=regex(MODELS),
    conda:
        "../envs/posmech.yaml"
    threads: 2
    resources:
        gpu=heavy_resources,
        mem_mb=heavy_mem_mb,
        runtime=heavy_runtime_for(4, 1),
    params:
        entry=model_entry,
        attention=section_params("posembed_attention"),
    script:
        "../../scripts/posembed_attention.py"


collect(rules.taxonomy, model=taxonomy_models())
collect(rules.posembed_averaging, model=taxonomy_models("posembed_averaging"))
collect(rules.posembed_attention, model=taxonomy_models("posembed_attention"))
