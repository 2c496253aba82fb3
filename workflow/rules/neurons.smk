# Contextual neurons in layer 0 (C1-C3, seed post 004). Reads the layer-0 decomposition
# (layer0.h5) and the K7 head classes of contextual.smk; never recomputes them.
# Library: posmech.analyses.neurons; artifact layout: docs/artifacts.md.


rule extended_token_embeddings:
    """Extended embeddings through the contextual heads and every neuron's token-contribution vector (C1)."""
    input:
        manifest=rules.fetch_model.output.manifest,
        h5=rules.layer0_decomposition.output.h5,
        classes=rules.layer0_head_classes.output.table,
    output:
        h5="results/{model}/neurons/extended_tokens.h5",
        scorecard="results/{model}/scorecard/extended_token_embeddings.csv",
    log:
        "logs/extended_token_embeddings/{model}.log",
    benchmark:
        "benchmarks/extended_token_embeddings/{model}.tsv"
    wildcard_constraints:
        model=regex(MODELS),
    conda:
        "../envs/posmech.yaml"
    threads: 2
    resources:
        mem_mb=heavy_mem_mb,
        runtime=heavy_runtime,
    params:
        neurons=neurons_params,
    script:
        "../../scripts/extended_token_embeddings.py"


rule contextual_neurons:
    """Top/bottom tokens of the configured neurons; every neuron ranked by explained variance (C2)."""
    input:
        unpack(contextual_tokens),
        manifest=rules.fetch_model.output.manifest,
        h5=rules.layer0_decomposition.output.h5,
        extended=rules.extended_token_embeddings.output.h5,
    output:
        table=report(
            "results/{model}/neurons/top_tokens.csv",
            caption="../report/contextual_neurons.rst",
            category="C",
            subcategory="Contextual neurons (C1-C3)",
        ),
        ranking=report(
            "results/{model}/neurons/neuron_ranking.csv",
            caption="../report/neuron_ranking.rst",
            category="C",
            subcategory="Contextual neurons (C1-C3)",
        ),
        figure=report(
            "results/{model}/neurons/top_tokens.png",
            caption="../report/contextual_neurons.rst",
            category="C",
            subcategory="Contextual neurons (C1-C3)",
        ),
        scorecard="results/{model}/scorecard/contextual_neurons.csv",
    log:
        "logs/contextual_neurons/{model}.log",
    benchmark:
        "benchmarks/contextual_neurons/{model}.tsv"
    wildcard_constraints:
        model=regex(MODELS),
    conda:
        "../envs/posmech.yaml"
    threads: 2
    resources:
        mem_mb=heavy_mem_mb,
        runtime=heavy_runtime,
    params:
        neurons=neurons_params,
        contextual=contextual_params,
    script:
        "../../scripts/contextual_neurons.py"


rule bag_of_tokens_fit:
    """Approximate vs real blocks.0.mlp.hook_pre of the neurons along texts (C3)."""
    input:
        manifest=rules.fetch_model.output.manifest,
        h5=rules.layer0_decomposition.output.h5,
        extended=rules.extended_token_embeddings.output.h5,
        ranking=rules.contextual_neurons.output.ranking,
    output:
        table=report(
            "results/{model}/neurons/bag_of_tokens_fit.csv",
            caption="../report/bag_of_tokens_fit.rst",
            category="C",
            subcategory="Contextual neurons (C1-C3)",
        ),
        figure=report(
            "results/{model}/neurons/bag_of_tokens_fit.png",
            caption="../report/bag_of_tokens_fit.rst",
            category="C",
            subcategory="Contextual neurons (C1-C3)",
        ),
        scorecard="results/{model}/scorecard/bag_of_tokens_fit.csv",
    log:
        "logs/bag_of_tokens_fit/{model}.log",
    benchmark:
        "benchmarks/bag_of_tokens_fit/{model}.tsv"
    wildcard_constraints:
        model=regex(MODELS),
    conda:
        "../envs/posmech.yaml"
    threads: 2
    resources:
        gpu=heavy_resources,
        mem_mb=heavy_mem_mb,
        runtime=heavy_runtime,
    params:
        entry=model_entry,
        neurons=neurons_params,
    script:
        "../../scripts/bag_of_tokens_fit.py"


collect(rules.extended_token_embeddings, model=neurons_models())
collect(rules.contextual_neurons, model=neurons_models())
collect(rules.bag_of_tokens_fit, model=neurons_models())
