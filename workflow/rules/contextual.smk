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
    """The contextual family (docs/workflow.md, "Families"), one job per model. Its
    analyses, in the order the job runs them, and what each does, needs of a model,
    reads and writes: workflow/analyses/contextual.yaml."""
    input:
        unpack(contextual_tokens),
        manifest=rules.fetch_model.output.manifest,
        means=lambda wc: output_of(
            rules.cache_activations.output.h5,
            wc,
            corpus=SETTINGS.kernels.means_corpus,
        ),
    output:
        **declared_outputs("contextual"),
    log:
        "logs/contextual/{model}.log",
    benchmark:
        "benchmarks/contextual/{model}.tsv"
    wildcard_constraints:
        model=regex(JOB_MODELS),  # a checkpoint, a twin: its sweep point (dynamics.smk)
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
