# Contextual neurons in layer 0 (C1-C3, seed post 004). Reads the layer-0 decomposition
# (layer0.h5) and the K7 head classes of contextual.smk; never recomputes them.
# Library: posmech.analyses.neurons; artifact layout: docs/artifacts.md.


rule neurons:
    """The neurons family (docs/workflow.md, "Families"), one job per model:
    - extended_token_embeddings: Extended embeddings through the contextual heads and every
      neuron's token-contribution vector (C1);
    - contextual_neurons: Top/bottom tokens of the configured neurons; every neuron ranked
      by explained variance (C2);
    - bag_of_tokens_fit: Approximate vs real blocks.0.mlp.hook_pre of the neurons along
      texts (C3).
    """
    input:
        unpack(contextual_tokens),
        manifest=rules.fetch_model.output.manifest,
        h5=rules.contextual.output.layer0_decomposition__h5,
        classes=rules.contextual.output.layer0_head_classes__table,
    output:
        extended_token_embeddings__h5="results/{model}/neurons/extended_tokens.h5",
        extended_token_embeddings__scorecard="results/{model}/scorecard/extended_token_embeddings.csv",
        contextual_neurons__table=report(
            "results/{model}/neurons/top_tokens.csv",
            caption="../report/contextual_neurons.rst",
            category="C",
            subcategory="Contextual neurons (C1-C3)",
        ),
        contextual_neurons__ranking=report(
            "results/{model}/neurons/neuron_ranking.csv",
            caption="../report/neuron_ranking.rst",
            category="C",
            subcategory="Contextual neurons (C1-C3)",
        ),
        contextual_neurons__figure=report(
            "results/{model}/neurons/top_tokens.png",
            caption="../report/contextual_neurons.rst",
            category="C",
            subcategory="Contextual neurons (C1-C3)",
        ),
        contextual_neurons__scorecard="results/{model}/scorecard/contextual_neurons.csv",
        bag_of_tokens_fit__table=report(
            "results/{model}/neurons/bag_of_tokens_fit.csv",
            caption="../report/bag_of_tokens_fit.rst",
            category="C",
            subcategory="Contextual neurons (C1-C3)",
        ),
        bag_of_tokens_fit__figure=report(
            "results/{model}/neurons/bag_of_tokens_fit.png",
            caption="../report/bag_of_tokens_fit.rst",
            category="C",
            subcategory="Contextual neurons (C1-C3)",
        ),
        bag_of_tokens_fit__scorecard="results/{model}/scorecard/bag_of_tokens_fit.csv",
    log:
        "logs/neurons/{model}.log",
    benchmark:
        "benchmarks/neurons/{model}.tsv"
    wildcard_constraints:
        model=regex(FINAL_MODELS),  # a checkpoint: its sweep point (dynamics.smk)
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
