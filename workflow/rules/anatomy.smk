# Score anatomy (P12, P13): raw q·k scores of the chosen previous-token heads, and the
# score taxa of every head. Reads the taxonomy's documented tables (heads.csv, taxonomy.csv)
# and the shared pass (attention_statistics.h5).


rule anatomy:
    """The anatomy family (docs/workflow.md, "Families"), one job per model:
    - score_anatomy: Raw scores (q·k/sqrt(d_head), future included), masked scores and
      pattern of the
    - chosen sharp and early previous-token heads on one document, full and zoomed (P12);
    - score_taxa: Every head's row-centred score profile around the diagonal over many
      documents and
    - query positions: dip at 0, bump at -1, trend; taxa and the P6 split (P13). The rows
    - come from the shared pass (attention_statistics).
    """
    input:
        manifest=rules.fetch_model.output.manifest,
        tokens=lambda wc: tokens_file(wc, SETTINGS.anatomy.corpus),
        heads=rules.taxonomy.output.diagonal_taxonomy__heads,
        statistics=rules.taxonomy.output.attention_statistics__h5,
        taxonomy=rules.taxonomy.output.diagonal_taxonomy__table,
    output:
        score_anatomy__table=report(
            "results/{model}/anatomy/scores.csv",
            caption="../report/score_anatomy.rst",
            category="P",
            subcategory="Score anatomy (P12, P13)",
        ),
        score_anatomy__h5="results/{model}/anatomy/scores.h5",
        score_anatomy__full=report(
            "results/{model}/anatomy/scores_full.png",
            caption="../report/score_anatomy.rst",
            category="P",
            subcategory="Score anatomy (P12, P13)",
        ),
        score_anatomy__zoom=report(
            "results/{model}/anatomy/scores_zoom.png",
            caption="../report/score_anatomy.rst",
            category="P",
            subcategory="Score anatomy (P12, P13)",
        ),
        score_anatomy__scorecard="results/{model}/scorecard/score_anatomy.csv",
        score_taxa__table=report(
            "results/{model}/anatomy/taxa.csv",
            caption="../report/score_taxa.rst",
            category="P",
            subcategory="Score anatomy (P12, P13)",
        ),
        score_taxa__profiles="results/{model}/anatomy/profiles.csv",
        score_taxa__h5="results/{model}/anatomy/profiles.h5",
        score_taxa__figure=report(
            "results/{model}/anatomy/taxa.png",
            caption="../report/score_taxa.rst",
            category="P",
            subcategory="Score anatomy (P12, P13)",
        ),
        score_taxa__scorecard="results/{model}/scorecard/score_taxa.csv",
    log:
        "logs/anatomy/{model}.log",
    benchmark:
        "benchmarks/anatomy/{model}.tsv"
    wildcard_constraints:
        model=regex(FINAL_MODELS),  # a checkpoint: its sweep point (dynamics.smk)
    conda:
        "../envs/posmech.yaml"
    threads: model_threads
    resources:
        gpu=heavy_resources,
        mem_mb=heavy_mem_mb,
        runtime=heavy_runtime_for(1, 1),
    params:
        entry=model_entry,
        settings=SETTINGS.anatomy.as_param(),
    script:
        "../../scripts/anatomy_family.py"


collect(rules.anatomy, model=selected(config, "anatomy", "models"))
