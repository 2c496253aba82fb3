# The attention-only family (L1-L5, seed 001): random-token inputs, position-only /
# token-only forward variants, BOS and induction. Library: posmech.analyses.attn_only.
from posmech.analyses.attn_only import check_settings, resolve_bos, sequence_lengths


def attn_only_models():
    return selected(config, "attn_only", "models")


def attn_only_params(wildcards=None):
    return config["attn_only"]


def _check_attn_only():
    """What the config alone can tell, before any job: settings, and sequence lengths
    against the context of trained models (whose n_ctx is in the config)."""
    p = config["attn_only"]
    check_settings(p)
    for m in attn_only_models():
        entry = config["models"][m]
        if "train" in entry:
            lengths = sequence_lengths(p, resolve_bos(p["bos"], entry))
            for key, n in lengths.items():
                if n > entry["train"]["n_ctx"]:
                    raise PosmechError(
                        f"{key}: sequences of {n} tokens are longer than model `{m}`'s context "
                        f"(models.{m}.train.n_ctx = {entry['train']['n_ctx']}); lower it"
                    )


try:
    _check_attn_only()
except PosmechError as err:
    raise WorkflowError(str(err)) from None


ATTN_ONLY_FIGURES = {
    "random_token_patterns": ["random_token_patterns.png"],
    "input_decomposition": [
        "decomposition_previous.png",
        "position_only_previous.png",
        "decomposition_look_back_two.png",
    ],
    "bos_induction": ["bos_induction.png"],
}


def attn_only_rules(model):
    """The L rules run on ``model``: bos_induction (L4) compares with and without BOS, so
    it is left out for a model run without BOS (`attn_only.bos` false or `model` with
    `prepend_bos: false`)."""
    bos = resolve_bos(config["attn_only"]["bos"], config["models"][model])
    return [r for r in ATTN_ONLY_FIGURES if bos or r != "bos_induction"]


def attn_only_scorecards():
    return [
        f"results/{m}/scorecard/{r}.csv"
        for m in attn_only_models()
        for r in attn_only_rules(m)
    ]


def attn_only_figures():
    return [
        f"results/{m}/attn_only/{f}"
        for m in attn_only_models()
        for r in attn_only_rules(m)
        for f in ATTN_ONLY_FIGURES[r]
    ]


def attn_only_tables():
    return [
        f"results/{m}/attn_only/{r}.csv"
        for m in attn_only_models()
        for r in attn_only_rules(m)
    ]


def attn_only_targets():
    return (
        [f"results/{m}/attn_only/heads.csv" for m in attn_only_models()]
        + attn_only_scorecards()
        + attn_only_figures()
        + attn_only_tables()
    )


TARGETS.append(attn_only_targets)
SCORECARDS.append(attn_only_scorecards)
REPORT_FIGURES.append(attn_only_figures)
REPORT_TABLES.append(attn_only_tables)


def attn_only_passes(*counts):
    """``runtime`` of an L rule: ``counts`` forward passes of sequences of the context size
    (an upper bound: the L sequences are short)."""

    def runtime(wildcards, attempt):
        from posmech.cluster import runtime_min

        shape = model_shape(wildcards.model)
        scale = config.get("cluster", {}).get("runtime_scale", 1.0)
        tokens = sum(counts) * 32
        return runtime_min(shape, tokens, 1, on_gpu(wildcards.model), scale, attempt)

    return runtime


rule random_token_patterns:
    """Mean attention of every head over random-token sequences (L1); the previous-token,
    look-back-two and induction heads (found or pinned) in heads.csv."""
    input:
        manifest="resources/models/{model}/manifest.json",
    output:
        table=report(
            "results/{model}/attn_only/random_token_patterns.csv",
            caption="../report/random_token_patterns.rst",
            category="L",
            subcategory="Attention-only family (L1-L5)",
        ),
        masses="results/{model}/attn_only/random_token_masses.csv",
        heads="results/{model}/attn_only/heads.csv",
        figure=report(
            "results/{model}/attn_only/random_token_patterns.png",
            caption="../report/random_token_patterns.rst",
            category="L",
            subcategory="Attention-only family (L1-L5)",
        ),
        scorecard="results/{model}/scorecard/random_token_patterns.csv",
    log:
        "logs/random_token_patterns/{model}.log",
    benchmark:
        "benchmarks/random_token_patterns/{model}.tsv"
    wildcard_constraints:
        model=regex(MODELS),
    conda:
        "../envs/posmech.yaml"
    threads: 2
    resources:
        gpu=heavy_resources,
        mem_mb=heavy_mem_mb_for(config["attn_only"]["batch_size"]),
        runtime=attn_only_passes(
            config["attn_only"]["n_sequences"],
            config["attn_only"]["induction_score"]["n_sequences"],
        ),
    params:
        entry=model_entry,
        cfg=attn_only_params,
    script:
        "../../scripts/random_token_patterns.py"


rule input_decomposition:
    """Scores and patterns of the previous-token and look-back-two heads with position-only,
    token-only and both inputs (L2, L5); the position-only pattern (L3)."""
    input:
        manifest="resources/models/{model}/manifest.json",
        heads="results/{model}/attn_only/heads.csv",
    output:
        table=report(
            "results/{model}/attn_only/input_decomposition.csv",
            caption="../report/input_decomposition.rst",
            category="L",
            subcategory="Attention-only family (L1-L5)",
        ),
        previous=report(
            "results/{model}/attn_only/decomposition_previous.png",
            caption="../report/input_decomposition.rst",
            category="L",
            subcategory="Attention-only family (L1-L5)",
        ),
        position_only=report(
            "results/{model}/attn_only/position_only_previous.png",
            caption="../report/position_only_previous.rst",
            category="L",
            subcategory="Attention-only family (L1-L5)",
        ),
        look_back_two=report(
            "results/{model}/attn_only/decomposition_look_back_two.png",
            caption="../report/input_decomposition.rst",
            category="L",
            subcategory="Attention-only family (L1-L5)",
        ),
        scorecard="results/{model}/scorecard/input_decomposition.csv",
    log:
        "logs/input_decomposition/{model}.log",
    benchmark:
        "benchmarks/input_decomposition/{model}.tsv"
    wildcard_constraints:
        model=regex(MODELS),
    conda:
        "../envs/posmech.yaml"
    threads: 2
    resources:
        gpu=heavy_resources,
        mem_mb=heavy_mem_mb_for(config["attn_only"]["batch_size"]),
        runtime=attn_only_passes(2 * config["attn_only"]["n_sequences"]),
    params:
        entry=model_entry,
        cfg=attn_only_params,
    script:
        "../../scripts/input_decomposition.py"


rule bos_induction:
    """P([B]) at the final [A] of [BOS] A B R1..R7 A vs A B R1..R7 A; the induction head's
    attention row there (L4)."""
    input:
        manifest="resources/models/{model}/manifest.json",
        heads="results/{model}/attn_only/heads.csv",
    output:
        table=report(
            "results/{model}/attn_only/bos_induction.csv",
            caption="../report/bos_induction.rst",
            category="L",
            subcategory="Attention-only family (L1-L5)",
        ),
        figure=report(
            "results/{model}/attn_only/bos_induction.png",
            caption="../report/bos_induction.rst",
            category="L",
            subcategory="Attention-only family (L1-L5)",
        ),
        scorecard="results/{model}/scorecard/bos_induction.csv",
    log:
        "logs/bos_induction/{model}.log",
    benchmark:
        "benchmarks/bos_induction/{model}.tsv"
    wildcard_constraints:
        model=regex(MODELS),
    conda:
        "../envs/posmech.yaml"
    threads: 2
    resources:
        gpu=heavy_resources,
        mem_mb=heavy_mem_mb_for(config["attn_only"]["batch_size"]),
        runtime=attn_only_passes(2 * config["attn_only"]["bos_induction"]["n_samples"]),
    params:
        entry=model_entry,
        cfg=attn_only_params,
    script:
        "../../scripts/bos_induction.py"
