# Contextual attention heads in layer 0 (claims K6-K10, seed post 004).
# layer0_decomposition writes the layer-0 decomposition once (positional and content
# factors, measured LayerNorm scale, every text's softmax denominators); the K rules and
# the contextual-neuron rules read it (docs/artifacts.md). Settings and checks:
# posmech.settings.contextual, posmech.analyses.contextual; helpers: common.smk.
from posmech.analyses.contextual import check_contexts

try:  # the positions against each model's context, before any job (the rule checks again)
    check_contexts(
        SETTINGS.contextual,
        runs_on("layer0_decomposition", models_of("contextual")),
        lambda m: model_shape(m).n_ctx,
    )
except PosmechError as err:
    raise WorkflowError(str(err)) from None


rule contextual:
    """The contextual family (docs/workflow.md, "Families"), one job per model:
    - layer0_decomposition: Layer-0 positional/content decomposition, LN scale, every text's
      denominators (K6-K9);
    - layer0_positional_patterns: Layer-0 positional patterns as grids beside the real
      attention row (K6);
    - layer0_head_classes: Behavioural classes of the layer-0 heads from measured quantities
      (K7);
    - softmax_denominators: Softmax denominators against n, destination token fixed, per
      text (K8);
    - denominator_variance: The independent model Var Z = sum p^2 Var(c) against resampled
      texts (K9);
    - layer1_patterns: Layer-1 attention rows on the pattern text vs positional kernels
      (K10).
    """
    input:
        unpack(contextual_tokens),
        manifest=rules.fetch_model.output.manifest,
        means=lambda wc: output_of(
            rules.cache_activations.output.h5,
            wc,
            corpus=SETTINGS.kernels.means_corpus,
        ),
    output:
        layer0_decomposition__h5="results/{model}/contextual/layer0.h5",
        layer0_decomposition__figure=report(
            "results/{model}/contextual/ln_scale.png",
            caption="../report/ln_scale.rst",
            category="K",
            subcategory="Contextual heads in layer 0 (K6-K10)",
        ),
        layer0_decomposition__scorecard="results/{model}/scorecard/layer0_decomposition.csv",
        layer0_positional_patterns__table=report(
            "results/{model}/contextual/positional_patterns.csv",
            caption="../report/positional_patterns.rst",
            category="K",
            subcategory="Contextual heads in layer 0 (K6-K10)",
        ),
        layer0_positional_patterns__figure=report(
            "results/{model}/contextual/positional_patterns.png",
            caption="../report/positional_patterns.rst",
            category="K",
            subcategory="Contextual heads in layer 0 (K6-K10)",
        ),
        layer0_positional_patterns__scorecard="results/{model}/scorecard/layer0_positional_patterns.csv",
        layer0_head_classes__table=report(
            "results/{model}/contextual/head_classes.csv",
            caption="../report/head_classes.rst",
            category="K",
            subcategory="Contextual heads in layer 0 (K6-K10)",
        ),
        layer0_head_classes__figure=report(
            "results/{model}/contextual/head_classes.png",
            caption="../report/head_classes.rst",
            category="K",
            subcategory="Contextual heads in layer 0 (K6-K10)",
        ),
        layer0_head_classes__scorecard="results/{model}/scorecard/layer0_head_classes.csv",
        softmax_denominators__table=report(
            "results/{model}/contextual/denominators.csv",
            caption="../report/denominators.rst",
            category="K",
            subcategory="Contextual heads in layer 0 (K6-K10)",
        ),
        softmax_denominators__figure=report(
            "results/{model}/contextual/denominators.png",
            caption="../report/denominators.rst",
            category="K",
            subcategory="Contextual heads in layer 0 (K6-K10)",
        ),
        softmax_denominators__scorecard="results/{model}/scorecard/softmax_denominators.csv",
        denominator_variance__table=report(
            "results/{model}/contextual/denominator_variance.csv",
            caption="../report/denominator_variance.rst",
            category="K",
            subcategory="Contextual heads in layer 0 (K6-K10)",
        ),
        denominator_variance__figure=report(
            "results/{model}/contextual/denominator_variance.png",
            caption="../report/denominator_variance.rst",
            category="K",
            subcategory="Contextual heads in layer 0 (K6-K10)",
        ),
        denominator_variance__scorecard="results/{model}/scorecard/denominator_variance.csv",
        layer1_patterns__table=report(
            "results/{model}/contextual/layer1_patterns.csv",
            caption="../report/layer1_patterns.rst",
            category="K",
            subcategory="Contextual heads in layer 0 (K6-K10)",
        ),
        layer1_patterns__figure=report(
            "results/{model}/contextual/layer1_patterns.png",
            caption="../report/layer1_patterns.rst",
            category="K",
            subcategory="Contextual heads in layer 0 (K6-K10)",
        ),
        layer1_patterns__scorecard="results/{model}/scorecard/layer1_patterns.csv",
    log:
        "logs/contextual/{model}.log",
    benchmark:
        "benchmarks/contextual/{model}.tsv"
    wildcard_constraints:
        model=regex(FINAL_MODELS),  # a checkpoint: its sweep point (dynamics.smk)
    conda:
        "../envs/posmech.yaml"
    threads: model_threads
    resources:
        # layer0_decomposition's budget (one pass over the corpora's tokens), and one more
        # for layer1_patterns (a pass over the pattern text) and the light analyses
        gpu=heavy_resources,
        mem_mb=heavy_mem_mb,
        runtime=heavy_runtime_for(2),
    params:
        entry=model_entry,
        settings=SETTINGS.contextual.as_param(),
        kernels=SETTINGS.kernels.as_param(),
    script:
        "../../scripts/contextual_family.py"


collect(rules.contextual, model=models_of("contextual"))
