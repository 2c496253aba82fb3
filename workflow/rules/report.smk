# Cheap (read HDF5/CSV, plot): run locally also with profiles/slurm (docs/cluster.md).
localrules:
    report,


rule report:
    """Assemble the HTML report and the scorecard (published vs reproduced)."""
    input:
        published=static("resources/published.yaml"),
        claims=static("docs/claims.md"),
        scorecards=lambda wc: report_registered(SCORECARDS),
        figures=lambda wc: report_figures(),
        tables=lambda wc: report_registered(REPORT_TABLES),
        summaries=lambda wc: [
            f"results/{m}/training/summary.json"
            for m in model_names_by_kind(config, "train")
        ],
        manifests=[manifest(m) for m in MODELS],
        tokens=lambda wc: tokens_targets(),
        upstream=lambda wc: report_upstream_targets(),
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
