

rule prev_knockout:
    """Zero attention to the previous position at every period-th query in the early layers (P5)."""
    input:
        manifest=rules.fetch_model.output.manifest,
        tokens=interventions_tokens,
        heads=rules.diagonal_taxonomy.output.heads,
    output:
        table=report(
            "results/{model}/interventions/prev_knockout.csv",
            caption="../report/prev_knockout.rst",
            category="P",
            subcategory="Interventions (P5, P14-P16)",
        ),
        figure=report(
            "results/{model}/interventions/prev_knockout.png",
            caption="../report/prev_knockout.rst",
            category="P",
            subcategory="Interventions (P5, P14-P16)",
        ),
        scorecard="results/{model}/scorecard/prev_knockout.csv",
    log:
        "logs/prev_knockout/{model}.log",
    benchmark:
        "benchmarks/prev_knockout/{model}.tsv"
    wildcard_constraints:
        model=regex(MODELS),
    conda:
        "../envs/posmech.yaml"
    threads: 2
    resources:
        gpu=heavy_resources,
        mem_mb=heavy_mem_mb,
        runtime=heavy_runtime_for(3, config["interventions"]["n_documents"]),
    params:
        entry=model_entry,
        cfg=interventions_params,
        corpus=interventions_corpus,
    script:
        "../../scripts/prev_knockout.py"


rule extended_averaging:
    """Average the extended positional embeddings just before each chosen head's layer (P15)."""
    input:
        manifest=rules.fetch_model.output.manifest,
        tokens=interventions_tokens,
        heads=rules.diagonal_taxonomy.output.heads,
        extended=rules.extended_positional_embeddings.output.h5,
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
        model=regex(MODELS),
    conda:
        "../envs/posmech.yaml"
    threads: 2
    resources:
        gpu=heavy_resources,
        mem_mb=heavy_mem_mb,
        runtime=heavy_runtime_for(3, config["interventions"]["n_documents"]),
    params:
        entry=model_entry,
        cfg=interventions_params,
        corpus=interventions_corpus,
    script:
        "../../scripts/extended_averaging.py"


rule repeated_tokens:
    """The sharp head's previous-token attention on repeated consecutive tokens (P14)."""
    input:
        manifest=rules.fetch_model.output.manifest,
        tokens=interventions_tokens,
        heads=rules.diagonal_taxonomy.output.heads,
    output:
        table=report(
            "results/{model}/interventions/repeated_tokens.csv",
            caption="../report/repeated_tokens.rst",
            category="P",
            subcategory="Interventions (P5, P14-P16)",
        ),
        figure=report(
            "results/{model}/interventions/repeated_tokens.png",
            caption="../report/repeated_tokens.rst",
            category="P",
            subcategory="Interventions (P5, P14-P16)",
        ),
        scorecard="results/{model}/scorecard/repeated_tokens.csv",
    log:
        "logs/repeated_tokens/{model}.log",
    benchmark:
        "benchmarks/repeated_tokens/{model}.tsv"
    wildcard_constraints:
        model=regex(MODELS),
    conda:
        "../envs/posmech.yaml"
    threads: 2
    resources:
        gpu=heavy_resources,
        mem_mb=heavy_mem_mb,
        runtime=heavy_runtime_for(2, config["interventions"]["n_documents"]),
    params:
        entry=model_entry,
        cfg=interventions_params,
        corpus=interventions_corpus,
    script:
        "../../scripts/repeated_tokens.py"


rule induction_intervention:
    """Redirect the sharp head's attention and scale its output on a repeat prompt (P16)."""
    input:
        manifest=rules.fetch_model.output.manifest,
        heads=rules.diagonal_taxonomy.output.heads,
        prompt=induction_prompt,
    output:
        table=report(
            "results/{model}/interventions/induction_intervention.csv",
            caption="../report/induction_intervention.rst",
            category="P",
            subcategory="Interventions (P5, P14-P16)",
        ),
        figure=report(
            "results/{model}/interventions/induction_intervention.png",
            caption="../report/induction_intervention.rst",
            category="P",
            subcategory="Interventions (P5, P14-P16)",
        ),
        scorecard="results/{model}/scorecard/induction_intervention.csv",
    log:
        "logs/induction_intervention/{model}.log",
    benchmark:
        "benchmarks/induction_intervention/{model}.tsv"
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
        cfg=interventions_params,
    script:
        "../../scripts/induction_intervention.py"


collect(rules.prev_knockout, model=interventions_models())
collect(rules.extended_averaging, model=interventions_models())
collect(rules.repeated_tokens, model=interventions_models())
collect(rules.induction_intervention, model=interventions_models())
