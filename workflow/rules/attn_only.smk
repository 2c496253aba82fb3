# The attention-only family (L1-L5, seed 001): random-token inputs, position-only /
# token-only forward variants, BOS and induction. Library: posmech.analyses.attn_only;
# settings and checks: posmech.settings.attn_only; helpers (attn_only_*) in common.smk.
try:
    attn_only_check(SETTINGS.attn_only, config)
except PosmechError as err:
    raise WorkflowError(str(err)) from None


rule attn_only:
    """The attn_only family (docs/workflow.md, "Families"), one job per model:
    - random_token_patterns: Mean attention of every head over random-token sequences (L1);
      the previous-token,
    - look-back-two and induction heads (found or pinned) in head_roles.csv;
    - input_decomposition: Scores and patterns of the previous-token and look-back-two heads
      with position-only,
    - token-only and both inputs (L2, L5); the position-only pattern (L3).
    """
    input:
        manifest=rules.fetch_model.output.manifest,
    output:
        random_token_patterns__table=report(
            "results/{model}/attn_only/random_token_patterns.csv",
            caption="../report/random_token_patterns.rst",
            category="L",
            subcategory="Attention-only family (L1-L5)",
        ),
        random_token_patterns__masses="results/{model}/attn_only/random_token_masses.csv",
        random_token_patterns__heads="results/{model}/attn_only/head_roles.csv",
        random_token_patterns__figure=report(
            "results/{model}/attn_only/random_token_patterns.png",
            caption="../report/random_token_patterns.rst",
            category="L",
            subcategory="Attention-only family (L1-L5)",
        ),
        random_token_patterns__scorecard="results/{model}/scorecard/random_token_patterns.csv",
        input_decomposition__table=report(
            "results/{model}/attn_only/input_decomposition.csv",
            caption="../report/input_decomposition.rst",
            category="L",
            subcategory="Attention-only family (L1-L5)",
        ),
        input_decomposition__previous=report(
            "results/{model}/attn_only/decomposition_previous.png",
            caption="../report/input_decomposition.rst",
            category="L",
            subcategory="Attention-only family (L1-L5)",
        ),
        input_decomposition__position_only=report(
            "results/{model}/attn_only/position_only_previous.png",
            caption="../report/position_only_previous.rst",
            category="L",
            subcategory="Attention-only family (L1-L5)",
        ),
        input_decomposition__look_back_two=report(
            "results/{model}/attn_only/decomposition_look_back_two.png",
            caption="../report/input_decomposition.rst",
            category="L",
            subcategory="Attention-only family (L1-L5)",
        ),
        input_decomposition__scorecard="results/{model}/scorecard/input_decomposition.csv",
    log:
        "logs/attn_only/{model}.log",
    benchmark:
        "benchmarks/attn_only/{model}.tsv"
    wildcard_constraints:
        model=regex(FINAL_MODELS),  # a checkpoint: its sweep point (dynamics.smk)
    conda:
        "../envs/posmech.yaml"
    threads: model_threads
    resources:
        gpu=heavy_resources,
        mem_mb=heavy_mem_mb_for(
            config["attn_only"]["batch_size"],
            keeps=("patterns", "residuals"),
            n_tokens=SETTINGS.attn_only.longest_sequence(
                "n_tokens", "induction_score.half_length"
            ),
        ),
        # short sequences, 32 tokens each at most
        runtime=RESOURCES.short_runtime(
            SETTINGS.attn_only.n_sequences
            + SETTINGS.attn_only.induction_score.n_sequences
        ),
    params:
        entry=model_entry,
        settings=SETTINGS.attn_only.as_param(),
    script:
        "../../scripts/attn_only_family.py"


rule bos_induction:
    """P([B]) at the final [A] of [BOS] A B R1..R7 A vs A B R1..R7 A; the induction head's
    attention row there (L4)."""
    input:
        manifest=rules.fetch_model.output.manifest,
        heads=rules.attn_only.output.random_token_patterns__heads,
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
        model=regex(FINAL_MODELS),  # a checkpoint: its sweep point (dynamics.smk)
    conda:
        "../envs/posmech.yaml"
    threads: model_threads
    resources:
        gpu=heavy_resources,
        mem_mb=heavy_mem_mb_for(
            config["attn_only"]["batch_size"],
            keeps=("patterns", "residuals", "last_logits"),
            n_tokens=SETTINGS.attn_only.longest_sequence("bos_induction.n_random"),
        ),
        runtime=RESOURCES.short_runtime(2 * SETTINGS.attn_only.bos_induction.n_samples),
    params:
        entry=model_entry,
        settings=SETTINGS.attn_only.as_param(),
    script:
        "../../scripts/bos_induction.py"


collect(rules.attn_only, model=attn_only_models())
collect(rules.bos_induction, model=attn_only_models(bos=True))
