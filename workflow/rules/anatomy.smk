# Score anatomy (P12, P13): raw q·k scores of the chosen previous-token heads, and the
# score taxa of every head. Reads the taxonomy's documented tables (heads.csv, taxonomy.csv)
# and the shared pass (attention_statistics.h5).


# Cheap (read HDF5, classify, plot): run locally also with profiles/slurm (docs/cluster.md).
localrules:
    score_taxa,


rule score_anatomy:
    """Raw scores (q·k/sqrt(d_head), future included), masked scores and pattern of the
    chosen sharp and early previous-token heads on one document, full and zoomed (P12).
    """
    input:
        manifest=rules.fetch_model.output.manifest,
        tokens=section_tokens("anatomy"),
        heads=rules.diagonal_taxonomy.output.heads,
    output:
        table=report(
            "results/{model}/anatomy/scores.csv",
            caption="../report/score_anatomy.rst",
            category="P",
            subcategory="Score anatomy (P12, P13)",
        ),
        h5="results/{model}/anatomy/scores.h5",
        full=report(
            "results/{model}/anatomy/scores_full.png",
            caption="../report/score_anatomy.rst",
            category="P",
            subcategory="Score anatomy (P12, P13)",
        ),
        zoom=report(
            "results/{model}/anatomy/scores_zoom.png",
            caption="../report/score_anatomy.rst",
            category="P",
            subcategory="Score anatomy (P12, P13)",
        ),
        scorecard="results/{model}/scorecard/score_anatomy.csv",
    log:
        "logs/score_anatomy/{model}.log",
    benchmark:
        "benchmarks/score_anatomy/{model}.tsv"
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
        anatomy=section_params("anatomy"),
    script:
        "../../scripts/score_anatomy.py"


rule score_taxa:
    """Every head's row-centred score profile around the diagonal over many documents and
    query positions: dip at 0, bump at -1, trend; taxa and the P6 split (P13). The rows
    come from the shared pass (attention_statistics)."""
    input:
        statistics=rules.attention_statistics.output.h5,
        taxonomy=rules.diagonal_taxonomy.output.table,
        heads=rules.diagonal_taxonomy.output.heads,
    output:
        table=report(
            "results/{model}/anatomy/taxa.csv",
            caption="../report/score_taxa.rst",
            category="P",
            subcategory="Score anatomy (P12, P13)",
        ),
        profiles="results/{model}/anatomy/profiles.csv",
        h5="results/{model}/anatomy/profiles.h5",
        figure=report(
            "results/{model}/anatomy/taxa.png",
            caption="../report/score_taxa.rst",
            category="P",
            subcategory="Score anatomy (P12, P13)",
        ),
        scorecard="results/{model}/scorecard/score_taxa.csv",
    log:
        "logs/score_taxa/{model}.log",
    wildcard_constraints:
        model=regex(MODELS),
    conda:
        "../envs/posmech.yaml"
    params:
        anatomy=section_params("anatomy"),
    script:
        "../../scripts/score_taxa.py"


collect(rules.score_anatomy, model=selected(config, "anatomy", "models"))
collect(rules.score_taxa, model=selected(config, "anatomy", "models"))
