# Contextual attention heads in layer 0 (claims K6-K10, seed post 004).
# layer0_decomposition writes the layer-0 decomposition once (positional and content
# factors, measured LayerNorm scale, every text's softmax denominators); the K rules and
# the contextual-neuron rules read it (docs/artifacts.md). Helpers: common.smk.
contextual_check()


# Cheap (read HDF5/CSV, numpy on layer-0 weights, plot): run locally with profiles/slurm.
localrules:
    softmax_denominators,
    denominator_variance,


rule layer0_decomposition:
    """Layer-0 positional/content decomposition, LN scale, every text's denominators (K6-K9)."""
    input:
        unpack(contextual_tokens),
        manifest=rules.fetch_model.output.manifest,
    output:
        h5="results/{model}/contextual/layer0.h5",
        figure=report(
            "results/{model}/contextual/ln_scale.png",
            caption="../report/ln_scale.rst",
            category="K",
            subcategory="Contextual heads in layer 0 (K6-K10)",
        ),
        scorecard="results/{model}/scorecard/layer0_decomposition.csv",
    log:
        "logs/layer0_decomposition/{model}.log",
    benchmark:
        "benchmarks/layer0_decomposition/{model}.tsv"
    wildcard_constraints:
        model=regex(MODELS),
    conda:
        "../envs/posmech.yaml"
    threads: 2
    resources:
        mem_mb=heavy_mem_mb,
        runtime=heavy_runtime,
    params:
        entry=model_entry,
        contextual=contextual_params,
    script:
        "../../scripts/layer0_decomposition.py"


rule layer0_positional_patterns:
    """Layer-0 positional patterns as grids beside the real attention row (K6)."""
    input:
        manifest=rules.fetch_model.output.manifest,
        h5=rules.layer0_decomposition.output.h5,
    output:
        table=report(
            "results/{model}/contextual/positional_patterns.csv",
            caption="../report/positional_patterns.rst",
            category="K",
            subcategory="Contextual heads in layer 0 (K6-K10)",
        ),
        figure=report(
            "results/{model}/contextual/positional_patterns.png",
            caption="../report/positional_patterns.rst",
            category="K",
            subcategory="Contextual heads in layer 0 (K6-K10)",
        ),
        scorecard="results/{model}/scorecard/layer0_positional_patterns.csv",
    log:
        "logs/layer0_positional_patterns/{model}.log",
    wildcard_constraints:
        model=regex(MODELS),
    conda:
        "../envs/posmech.yaml"
    params:
        contextual=contextual_params,
    script:
        "../../scripts/layer0_positional_patterns.py"


rule layer0_head_classes:
    """Behavioural classes of the layer-0 heads from measured quantities (K7)."""
    input:
        manifest=rules.fetch_model.output.manifest,
        h5=rules.layer0_decomposition.output.h5,
    output:
        table=report(
            "results/{model}/contextual/head_classes.csv",
            caption="../report/head_classes.rst",
            category="K",
            subcategory="Contextual heads in layer 0 (K6-K10)",
        ),
        figure=report(
            "results/{model}/contextual/head_classes.png",
            caption="../report/head_classes.rst",
            category="K",
            subcategory="Contextual heads in layer 0 (K6-K10)",
        ),
        scorecard="results/{model}/scorecard/layer0_head_classes.csv",
    log:
        "logs/layer0_head_classes/{model}.log",
    benchmark:
        "benchmarks/layer0_head_classes/{model}.tsv"
    wildcard_constraints:
        model=regex(MODELS),
    conda:
        "../envs/posmech.yaml"
    threads: 2
    params:
        contextual=contextual_params,
    script:
        "../../scripts/layer0_head_classes.py"


rule softmax_denominators:
    """Softmax denominators against n, destination token fixed, per text (K8)."""
    input:
        h5=rules.layer0_decomposition.output.h5,
        classes=rules.layer0_head_classes.output.table,
    output:
        table=report(
            "results/{model}/contextual/denominators.csv",
            caption="../report/denominators.rst",
            category="K",
            subcategory="Contextual heads in layer 0 (K6-K10)",
        ),
        figure=report(
            "results/{model}/contextual/denominators.png",
            caption="../report/denominators.rst",
            category="K",
            subcategory="Contextual heads in layer 0 (K6-K10)",
        ),
        scorecard="results/{model}/scorecard/softmax_denominators.csv",
    log:
        "logs/softmax_denominators/{model}.log",
    wildcard_constraints:
        model=regex(MODELS),
    conda:
        "../envs/posmech.yaml"
    params:
        contextual=contextual_params,
    script:
        "../../scripts/softmax_denominators.py"


rule denominator_variance:
    """The independent model Var Z = sum p^2 Var(c) against resampled texts (K9)."""
    input:
        h5=rules.layer0_decomposition.output.h5,
        classes=rules.layer0_head_classes.output.table,
    output:
        table=report(
            "results/{model}/contextual/denominator_variance.csv",
            caption="../report/denominator_variance.rst",
            category="K",
            subcategory="Contextual heads in layer 0 (K6-K10)",
        ),
        figure=report(
            "results/{model}/contextual/denominator_variance.png",
            caption="../report/denominator_variance.rst",
            category="K",
            subcategory="Contextual heads in layer 0 (K6-K10)",
        ),
        scorecard="results/{model}/scorecard/denominator_variance.csv",
    log:
        "logs/denominator_variance/{model}.log",
    wildcard_constraints:
        model=regex(MODELS),
    conda:
        "../envs/posmech.yaml"
    params:
        contextual=contextual_params,
    script:
        "../../scripts/denominator_variance.py"


rule layer1_patterns:
    """Layer-1 attention rows on the pattern text vs positional kernels (K10)."""
    input:
        manifest=rules.fetch_model.output.manifest,
        h5=rules.layer0_decomposition.output.h5,
        means=lambda wc: output_of(
            rules.cache_activations.output.h5,
            wc,
            corpus=kernels_params()["means_corpus"],
        ),
    output:
        table=report(
            "results/{model}/contextual/layer1_patterns.csv",
            caption="../report/layer1_patterns.rst",
            category="K",
            subcategory="Contextual heads in layer 0 (K6-K10)",
        ),
        figure=report(
            "results/{model}/contextual/layer1_patterns.png",
            caption="../report/layer1_patterns.rst",
            category="K",
            subcategory="Contextual heads in layer 0 (K6-K10)",
        ),
        scorecard="results/{model}/scorecard/layer1_patterns.csv",
    log:
        "logs/layer1_patterns/{model}.log",
    benchmark:
        "benchmarks/layer1_patterns/{model}.tsv"
    wildcard_constraints:
        model=regex(MODELS),
    conda:
        "../envs/posmech.yaml"
    threads: 2
    resources:
        gpu=heavy_resources,
        mem_mb=heavy_mem_mb,
        runtime=heavy_runtime_for(1, 1),
    params:
        entry=model_entry,
        contextual=contextual_params,
        kernels=kernels_params,
    script:
        "../../scripts/layer1_patterns.py"


collect(rules.layer0_decomposition, model=contextual_models())
collect(rules.layer0_positional_patterns, model=contextual_models())
collect(rules.layer0_head_classes, model=contextual_models())
collect(rules.softmax_denominators, model=contextual_models())
collect(rules.denominator_variance, model=contextual_models())
collect(rules.layer1_patterns, model=contextual_models())
