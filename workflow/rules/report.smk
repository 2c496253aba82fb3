# Cheap (read HDF5/CSV, plot): run locally also with profiles/slurm (docs/cluster.md).
localrules:
    findings,
    head_table,
    report,


rule findings:
    """Judge every model-independent finding (resources/findings.yaml) on every model of
    the run: holds, fails or not measurable, with the value, the threshold and the reason.
    """
    input:
        findings=static("resources/findings.yaml"),
        schema=static("workflow/schemas/findings.schema.yaml"),
        # what every stage collected (common.smk: collect), read when the DAG is built
        scorecards=lambda wc: collected("scorecard", checkpoints=False),
    output:
        table="results/report/findings.csv",
    log:
        "logs/report/findings.log",
    benchmark:
        "benchmarks/report/findings.tsv"
    conda:
        "../envs/posmech.yaml"
    params:
        thresholds=config["findings"],
        models=FINAL_MODELS,
        # {model: {rule: reason}} of the rules that cannot run on a model (applicability)
        not_applicable=NOT_APPLICABLE,
        # {twin: its model} (config section `twins`): the structural/learned columns
        twins=TWIN_OF,
        # which null the twins are (`twins.weights`: init, shuffled): column `twin_weights`
        twin_weights=config["twins"]["weights"],
        # what each twin read (findings.meta.json `twin_reads`, the grid's legend)
        twin_reads=TWIN_READS,
    script:
        "../../scripts/findings.py"


rule head_table:
    """One row per layer x head of a model with every role the analyses assign (P6/P7,
    P13, K3/K4, K7, L roles), its score and whether it passes the role's threshold.
    Its path differs from the taxonomy's results/{model}/taxonomy/heads.csv by the folder:
    the model wildcard is one of the run's model names (never contains '/').
    """
    input:
        unpack(head_table_inputs),
    output:
        table="results/{model}/heads.csv",
    log:
        "logs/head_table/{model}.log",
    benchmark:
        "benchmarks/head_table/{model}.tsv"
    wildcard_constraints:
        model=regex(MODELS),
    conda:
        "../envs/posmech.yaml"
    params:
        n=config["kernels"]["etc_heatmap_position"],
    script:
        "../../scripts/head_table.py"


rule report:
    """Assemble the HTML report and the scorecard (published vs reproduced)."""
    input:
        published=static("resources/published.yaml"),
        claims=static("docs/claims.md"),
        findings=rules.findings.output.table,
        heads=expand(
            rules.head_table.output.table,
            model=[m for m in head_table_models() if m in FINAL_MODELS],
        ),
        # what every stage collected (common.smk: collect), read when the DAG is built
        scorecards=lambda wc: collected("scorecard", checkpoints=False),
        figures=lambda wc: collected("figure", checkpoints=False),
        tables=lambda wc: collected("table", checkpoints=False),
        summaries=expand(
            rules.train_demo_model.output.summary,
            model=model_names_by_kind(config, "train"),
        ),
        manifests=expand(rules.fetch_model.output.manifest, model=FINAL_MODELS),
        tokens=lambda wc: collected(of="tokenize", checkpoints=False),
        # the training-dynamics section (rule dynamics), when the run has checkpoints
        dynamics=lambda wc: collected(of="dynamics"),
        upstream=lambda wc: collected(),
    output:
        html="results/report/index.html",
        figures=directory("results/report/figures"),
        scorecard=report(
            "results/report/scorecard.csv",
            caption="../report/scorecard.rst",
            category="Scorecard",
        ),
    log:
        "logs/report/report.log",
    benchmark:
        "benchmarks/report/report.tsv"
    conda:
        "../envs/posmech.yaml"
    params:
        flags=report_flags,
        benchmarks="benchmarks",
    script:
        "../../scripts/report.py"


# the findings table is part of every run (the report reads it too)
collect(rules.findings)
collect(rules.head_table, model=head_table_models())
