

rule interventions:
    """The interventions family (docs/workflow.md, "Families"), one job per model:
    - prev_knockout: Zero attention to the previous position at every period-th query in the
      early layers (P5);
    - repeated_tokens: The sharp head's previous-token attention on repeated consecutive
      tokens (P14);
    - induction_intervention: Redirect the sharp head's attention and scale its output on a
      repeat prompt (P16).
    """
    input:
        manifest=rules.fetch_model.output.manifest,
        tokens=lambda wc: tokens_file(
            wc, SETTINGS.interventions.corpus_or_first(config)
        ),
        heads=rules.taxonomy.output.diagonal_taxonomy__heads,
        prompt=lambda wc: static(SETTINGS.interventions.induction_intervention.prompt),
    output:
        prev_knockout__table=report(
            "results/{model}/interventions/prev_knockout.csv",
            caption="../report/prev_knockout.rst",
            category="P",
            subcategory="Interventions (P5, P14-P16)",
        ),
        prev_knockout__figure=report(
            "results/{model}/interventions/prev_knockout.png",
            caption="../report/prev_knockout.rst",
            category="P",
            subcategory="Interventions (P5, P14-P16)",
        ),
        prev_knockout__scorecard="results/{model}/scorecard/prev_knockout.csv",
        repeated_tokens__table=report(
            "results/{model}/interventions/repeated_tokens.csv",
            caption="../report/repeated_tokens.rst",
            category="P",
            subcategory="Interventions (P5, P14-P16)",
        ),
        repeated_tokens__figure=report(
            "results/{model}/interventions/repeated_tokens.png",
            caption="../report/repeated_tokens.rst",
            category="P",
            subcategory="Interventions (P5, P14-P16)",
        ),
        repeated_tokens__scorecard="results/{model}/scorecard/repeated_tokens.csv",
        induction_intervention__table=report(
            "results/{model}/interventions/induction_intervention.csv",
            caption="../report/induction_intervention.rst",
            category="P",
            subcategory="Interventions (P5, P14-P16)",
        ),
        induction_intervention__figure=report(
            "results/{model}/interventions/induction_intervention.png",
            caption="../report/induction_intervention.rst",
            category="P",
            subcategory="Interventions (P5, P14-P16)",
        ),
        induction_intervention__scorecard="results/{model}/scorecard/induction_intervention.csv",
    log:
        "logs/interventions/{model}.log",
    benchmark:
        "benchmarks/interventions/{model}.tsv"
    wildcard_constraints:
        model=regex(FINAL_MODELS),  # a checkpoint: its sweep point (dynamics.smk)
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
    """Average the extended positional embeddings just before each chosen head's layer (P15)."""
    input:
        manifest=rules.fetch_model.output.manifest,
        tokens=lambda wc: tokens_file(
            wc, SETTINGS.interventions.corpus_or_first(config)
        ),
        heads=rules.taxonomy.output.diagonal_taxonomy__heads,
        extended=rules.geometry.output.extended_positional_embeddings__h5,
    output:
        table=report(
            "results/{model}/interventions/extended_averaging.csv",
            caption="../report/extended_averaging.rst",
            category="P",
            subcategory="Interventions (P5, P14-P16)",
        ),
        figure=report(
            "results/{model}/interventions/extended_averaging.png",
            caption="../report/extended_averaging.rst",
            category="P",
            subcategory="Interventions (P5, P14-P16)",
        ),
        scorecard="results/{model}/scorecard/extended_averaging.csv",
    log:
        "logs/extended_averaging/{model}.log",
    benchmark:
        "benchmarks/extended_averaging/{model}.tsv"
    wildcard_constraints:
        model=regex(FINAL_MODELS),  # a checkpoint: its sweep point (dynamics.smk)
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
