# Contextual attention heads in layer 0 (claims K6-K10, seed post 004).
# layer0_decomposition writes results/{model}/contextual/layer0.h5 once (positional and
# content factors, measured LayerNorm scale, every text's softmax denominators); the K rules
# and the contextual-neuron rules read it (docs/artifacts.md).


def contextual_models():
    return selected(config, "contextual", "models")


def contextual_params(wildcards=None):
    """The `contextual` section with its corpora resolved: `corpora` (null/empty: all),
    the pattern corpus first; `scale_corpus` (null: the first corpus)."""
    p = dict(config["contextual"])
    chosen = selected(config, "contextual", "corpora")
    p["pattern_corpus"] = p.get("pattern_corpus") or chosen[0]
    p["corpora"] = [p["pattern_corpus"]] + [
        c for c in chosen if c != p["pattern_corpus"]
    ]
    p["scale_corpus"] = p.get("scale_corpus") or CORPORA[0]
    return p


def contextual_check():
    """Positions against each model's context, before any job (the script checks again
    with the model's own config)."""
    from posmech.analyses.contextual import resolved_positions

    for m in contextual_models():
        try:
            resolved_positions(contextual_params(), model_shape(m).n_ctx, m)
        except PosmechError as err:
            raise WorkflowError(str(err)) from None


contextual_check()


def contextual_tokens(wildcards):
    p = contextual_params()
    names = list(dict.fromkeys(p["corpora"] + [p["scale_corpus"]]))
    return {c: f"results/{wildcards.model}/tokens/{c}.h5" for c in names}


CONTEXTUAL_RULES = {
    "layer0_decomposition": ["ln_scale.png"],
    "layer0_positional_patterns": [
        "positional_patterns.csv",
        "positional_patterns.png",
    ],
    "layer0_head_classes": ["head_classes.csv", "head_classes.png"],
    "softmax_denominators": ["denominators.csv", "denominators.png"],
    "denominator_variance": ["denominator_variance.csv", "denominator_variance.png"],
    "layer1_patterns": ["layer1_patterns.csv", "layer1_patterns.png"],
}


def contextual_scorecards():
    return [
        f"results/{m}/scorecard/{r}.csv"
        for m in contextual_models()
        for r in CONTEXTUAL_RULES
    ]


def contextual_outputs(ext):
    return [
        f"results/{m}/contextual/{f}"
        for m in contextual_models()
        for files in CONTEXTUAL_RULES.values()
        for f in files
        if f.endswith(ext)
    ]


def contextual_targets():
    return (
        [f"results/{m}/contextual/layer0.h5" for m in contextual_models()]
        + contextual_scorecards()
        + contextual_outputs(".png")
        + contextual_outputs(".csv")
    )


TARGETS.append(contextual_targets)
SCORECARDS.append(contextual_scorecards)
REPORT_FIGURES.append(lambda: contextual_outputs(".png"))
REPORT_TABLES.append(lambda: contextual_outputs(".csv"))


# Cheap (read HDF5/CSV, numpy on layer-0 weights, plot): run locally with profiles/slurm.
localrules:
    softmax_denominators,
    denominator_variance,


rule layer0_decomposition:
    """Layer-0 positional/content decomposition, LN scale, every text's denominators (K6-K9)."""
    input:
        unpack(contextual_tokens),
        manifest="resources/models/{model}/manifest.json",
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
        manifest="resources/models/{model}/manifest.json",
        h5="results/{model}/contextual/layer0.h5",
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
        manifest="resources/models/{model}/manifest.json",
        h5="results/{model}/contextual/layer0.h5",
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
        h5="results/{model}/contextual/layer0.h5",
        classes="results/{model}/contextual/head_classes.csv",
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
        h5="results/{model}/contextual/layer0.h5",
        classes="results/{model}/contextual/head_classes.csv",
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
        manifest="resources/models/{model}/manifest.json",
        h5="results/{model}/contextual/layer0.h5",
        means=lambda wc: f"results/{wc.model}/activations/{kernels_params()['means_corpus']}.h5",
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
