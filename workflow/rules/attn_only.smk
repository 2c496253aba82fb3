# The attention-only family (L1-L5, seed 001): random-token inputs, position-only /
# token-only forward variants, BOS and induction. Library: posmech.analyses.attn_only;
# settings and checks: posmech.settings.attn_only; helpers (attn_only_*) in common.smk.
try:
    attn_only_check(SETTINGS.attn_only, config)
except PosmechError as err:
    raise WorkflowError(str(err)) from None


rule attn_only:
    """The attn_only family (docs/workflow.md, "Families"), one job per model. Its
    analyses, in the order the job runs them, and what each does, needs of a model,
    reads and writes: workflow/analyses/attn_only.yaml."""
    input:
        manifest=rules.fetch_model.output.manifest,
    output:
        **declared_outputs("attn_only"),
    log:
        "logs/attn_only/{model}.log",
    benchmark:
        "benchmarks/attn_only/{model}.tsv"
    wildcard_constraints:
        model=regex(JOB_MODELS),  # a checkpoint, a twin: its sweep point (dynamics.smk)
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
    """A rule of its own: analysis bos_induction, one job per model. What it does, needs of
    a model, reads and writes: workflow/analyses/bos_induction.yaml."""
    input:
        **declared_inputs("bos_induction"),
        manifest=rules.fetch_model.output.manifest,
    output:
        **declared_outputs("bos_induction"),
    log:
        "logs/bos_induction/{model}.log",
    benchmark:
        "benchmarks/bos_induction/{model}.tsv"
    wildcard_constraints:
        model=regex(JOB_MODELS),  # a checkpoint, a twin: its sweep point (dynamics.smk)
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
