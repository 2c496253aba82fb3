# Models: a Hub model is snapshotted once, a local directory is validated and used in
# place, a `train:` entry is trained by the pipeline (the offline default).


# Downloads need the internet of the login node; with profiles/slurm they run there, and so
# does copying a checkpoint the training saved (milliseconds).
localrules:
    fetch_model,
    checkpoint_model,


rule fetch_model:
    """Snapshot a Hub model (safetensors, config, tokenizer) or validate a local directory."""
    output:
        manifest="resources/models/{model}/manifest.json",
    log:
        "logs/fetch_model/{model}.log",
    wildcard_constraints:
        # a figureless local model is validated in its point's job (dynamics.smk)
        model=regex(
            [
                m
                for m in model_names_by_kind(config, "hub")
                + model_names_by_kind(config, "local")
                if m not in BUILT_IN_POINTS["fetch_model"]
            ]
        ),
    conda:
        "../envs/posmech.yaml"
    params:
        entry=weights_entry,
    script:
        "../../scripts/fetch_model.py"


rule train_demo_model:
    """Train a small character model (GPT-2 or attention-only; seeded, fixed steps) and
    measure its head scores."""
    input:
        corpus=lambda wc: output_of(
            rules.prepare_corpus.output.jsonl,
            corpus=model_entry(wc)["train"]["corpus"],
        ),
    output:
        # the same manifest as fetch_model's: every analysis reads one kind of model
        manifest=rules.fetch_model.output.manifest,
        curve=report(
            "results/{model}/training/curve.csv",
            caption="../report/training_curve.rst",
            category="Demo model",
        ),
        figure=report(
            "results/{model}/training/curve.png",
            caption="../report/training_curve.rst",
            category="Demo model",
        ),
        summary="results/{model}/training/summary.json",
        # the weights after each step of `train.checkpoints` (rule checkpoint_model)
        checkpoints=directory("resources/models/{model}/checkpoints"),
    log:
        "logs/train_demo_model/{model}.log",
    benchmark:
        "benchmarks/train_demo_model/{model}.tsv"
    wildcard_constraints:
        model=regex(model_names_by_kind(config, "train")),
    # before any analysis job when cores free up (every job of the model and its
    # checkpoints waits for its training), the longest training first (train_priority)
    priority: train_priority
    conda:
        "../envs/posmech.yaml"
    threads: lambda wc: model_entry(wc)["train"].get("threads") or 2
    resources:
        mem_mb=heavy_mem_mb,
        runtime=train_runtime,
    params:
        entry=weights_entry,
    script:
        "../../scripts/train_demo_model.py"


rule build_twin:
    """A random-init twin: the model's architecture and size, weights drawn with a seed
    (posmech.models.twin; config section `twins`)."""
    input:
        parent=lambda wc: output_of(
            rules.fetch_model.output.manifest,
            model=config["models"][wc.model]["twin_of"],
        ),
    output:
        manifest=rules.fetch_model.output.manifest,
    log:
        "logs/build_twin/{model}.log",
    benchmark:
        "benchmarks/build_twin/{model}.tsv"
    wildcard_constraints:
        # a twin without figures builds its weights in its point's job (dynamics.smk)
        model=regex([t for t in TWINS if t not in TWIN_POINTS]),
    conda:
        "../envs/posmech.yaml"
    params:
        entry=weights_entry,
    script:
        "../../scripts/build_twin.py"


rule checkpoint_model:
    """A checkpoint the training of its model saved (`train.checkpoints`) as the model
    `<model>@step<N>` (posmech.models.checkpoints; the dynamics sweep)."""
    input:
        checkpoints=lambda wc: output_of(
            rules.train_demo_model.output.checkpoints,
            model=config["models"][wc.model]["checkpoint_of"],
        ),
    output:
        manifest=rules.fetch_model.output.manifest,
    log:
        "logs/checkpoint_model/{model}.log",
    wildcard_constraints:
        model=regex(model_names_by_kind(config, "checkpoint")),
    conda:
        "../envs/posmech.yaml"
    params:
        entry=weights_entry,
    script:
        "../../scripts/checkpoint_model.py"


collect(
    rules.fetch_model,
    model=model_names_by_kind(config, "hub") + model_names_by_kind(config, "local"),
)
# The training curve table is in Snakemake's native report; the HTML report shows the
# curve figure in its demo-model section.
collect(
    rules.train_demo_model,
    model=model_names_by_kind(config, "train"),
    report_tables=False,
)
collect(rules.build_twin, model=[t for t in TWINS if t not in TWIN_POINTS])
collect(rules.checkpoint_model, model=model_names_by_kind(config, "checkpoint"))
