rule geometry:
    """The geometry family (docs/workflow.md, "Families"), one job per model:
    - extended_positional_embeddings: Residual stream on one-token-repeated prompts, centred
      over positions, averaged over tokens (P8);
    - positional_pca: PCA of W_pos and of the extended embeddings per layer: explained
      variance, helices (P1, P10);
    - canonical_angles: Principal angles between top-k right-singular subspaces of W_pos and
      each layer (P11);
    - positional_sparsity: Fraction of far-from-zero entries per layer vs W_pos (P9).
    """
    input:
        manifest=rules.fetch_model.output.manifest,
    output:
        extended_positional_embeddings__h5="results/{model}/geometry/extended.h5",
        extended_positional_embeddings__agreement=report(
            "results/{model}/geometry/extended_agreement.csv",
            caption="../report/extended_agreement.rst",
            category="P",
            subcategory="Extended positional embeddings (P8)",
        ),
        extended_positional_embeddings__figure=report(
            "results/{model}/geometry/extended_agreement.png",
            caption="../report/extended_agreement.rst",
            category="P",
            subcategory="Extended positional embeddings (P8)",
        ),
        extended_positional_embeddings__scorecard="results/{model}/scorecard/extended_positional_embeddings.csv",
        positional_pca__table=report(
            "results/{model}/geometry/pca.csv",
            caption="../report/positional_pca.rst",
            category="P",
            subcategory="Positional geometry (P1, P9-P11)",
        ),
        positional_pca__explained=report(
            "results/{model}/geometry/pca_explained.png",
            caption="../report/positional_pca.rst",
            category="P",
            subcategory="Positional geometry (P1, P9-P11)",
        ),
        positional_pca__wpos_helix=report(
            "results/{model}/geometry/pca_wpos_helix.png",
            caption="../report/pca_wpos_helix.rst",
            category="P",
            subcategory="Positional geometry (P1, P9-P11)",
        ),
        positional_pca__helices=report(
            "results/{model}/geometry/pca_helices.png",
            caption="../report/pca_helices.rst",
            category="P",
            subcategory="Positional geometry (P1, P9-P11)",
        ),
        positional_pca__comparison=report(
            "results/{model}/geometry/pca_comparison.png",
            caption="../report/pca_comparison.rst",
            category="P",
            subcategory="Positional geometry (P1, P9-P11)",
        ),
        positional_pca__scorecard="results/{model}/scorecard/positional_pca.csv",
        canonical_angles__table=report(
            "results/{model}/geometry/canonical_angles.csv",
            caption="../report/canonical_angles.rst",
            category="P",
            subcategory="Positional geometry (P1, P9-P11)",
        ),
        canonical_angles__figure=report(
            "results/{model}/geometry/canonical_angles.png",
            caption="../report/canonical_angles.rst",
            category="P",
            subcategory="Positional geometry (P1, P9-P11)",
        ),
        canonical_angles__scorecard="results/{model}/scorecard/canonical_angles.csv",
        positional_sparsity__table=report(
            "results/{model}/geometry/sparsity.csv",
            caption="../report/positional_sparsity.rst",
            category="P",
            subcategory="Positional geometry (P1, P9-P11)",
        ),
        positional_sparsity__figure=report(
            "results/{model}/geometry/sparsity.png",
            caption="../report/positional_sparsity.rst",
            category="P",
            subcategory="Positional geometry (P1, P9-P11)",
        ),
        positional_sparsity__scorecard="results/{model}/scorecard/positional_sparsity.csv",
    log:
        "logs/geometry/{model}.log",
    benchmark:
        "benchmarks/geometry/{model}.tsv"
    wildcard_constraints:
        model=regex(FINAL_MODELS),  # a checkpoint: its sweep point (dynamics.smk)
    conda:
        "../envs/posmech.yaml"
    threads: model_threads
    resources:
        gpu=heavy_resources,
        # running sums over positions inside the hooks: no activation is kept per context
        mem_mb=heavy_mem_mb_for(config["geometry"]["batch_size"], keeps=()),
        runtime=heavy_runtime_for(1, config["geometry"]["n_tokens"]),
    params:
        entry=model_entry,
        settings=SETTINGS.geometry.as_param(),
    script:
        "../../scripts/geometry_family.py"


collect(rules.geometry, model=models_of("geometry"))
