# Cheap (read HDF5/CSV, plot): run locally also with profiles/slurm (docs/cluster.md).
localrules:
    positional_pca,
    canonical_angles,
    positional_sparsity,


rule extended_positional_embeddings:
    """Residual stream on one-token-repeated prompts, centred over positions, averaged over tokens (P8)."""
    input:
        manifest=rules.fetch_model.output.manifest,
    output:
        h5="results/{model}/geometry/extended.h5",
        agreement=report(
            "results/{model}/geometry/extended_agreement.csv",
            caption="../report/extended_agreement.rst",
            category="P",
            subcategory="Extended positional embeddings (P8)",
        ),
        figure=report(
            "results/{model}/geometry/extended_agreement.png",
            caption="../report/extended_agreement.rst",
            category="P",
            subcategory="Extended positional embeddings (P8)",
        ),
        scorecard="results/{model}/scorecard/extended_positional_embeddings.csv",
    log:
        "logs/extended_positional_embeddings/{model}.log",
    benchmark:
        "benchmarks/extended_positional_embeddings/{model}.tsv"
    wildcard_constraints:
        model=regex(MODELS),
    conda:
        "../envs/posmech.yaml"
    threads: 2
    resources:
        gpu=heavy_resources,
        # running sums over positions inside the hooks: no activation is kept per context
        mem_mb=heavy_mem_mb_for(config["geometry"]["batch_size"], keeps=()),
        runtime=heavy_runtime_for(1, config["geometry"]["n_tokens"]),
    params:
        entry=model_entry,
        geometry=config["geometry"],
    script:
        "../../scripts/extended_positional_embeddings.py"


rule positional_pca:
    """PCA of W_pos and of the extended embeddings per layer: explained variance, helices (P1, P10)."""
    input:
        h5=rules.extended_positional_embeddings.output.h5,
    output:
        table=report(
            "results/{model}/geometry/pca.csv",
            caption="../report/positional_pca.rst",
            category="P",
            subcategory="Positional geometry (P1, P9-P11)",
        ),
        explained=report(
            "results/{model}/geometry/pca_explained.png",
            caption="../report/positional_pca.rst",
            category="P",
            subcategory="Positional geometry (P1, P9-P11)",
        ),
        wpos_helix=report(
            "results/{model}/geometry/pca_wpos_helix.png",
            caption="../report/pca_wpos_helix.rst",
            category="P",
            subcategory="Positional geometry (P1, P9-P11)",
        ),
        helices=report(
            "results/{model}/geometry/pca_helices.png",
            caption="../report/pca_helices.rst",
            category="P",
            subcategory="Positional geometry (P1, P9-P11)",
        ),
        comparison=report(
            "results/{model}/geometry/pca_comparison.png",
            caption="../report/pca_comparison.rst",
            category="P",
            subcategory="Positional geometry (P1, P9-P11)",
        ),
        scorecard="results/{model}/scorecard/positional_pca.csv",
    log:
        "logs/positional_pca/{model}.log",
    wildcard_constraints:
        model=regex(MODELS),
    conda:
        "../envs/posmech.yaml"
    params:
        geometry=config["geometry"],
    script:
        "../../scripts/positional_pca.py"


rule canonical_angles:
    """Principal angles between top-k right-singular subspaces of W_pos and each layer (P11)."""
    input:
        h5=rules.extended_positional_embeddings.output.h5,
    output:
        table=report(
            "results/{model}/geometry/canonical_angles.csv",
            caption="../report/canonical_angles.rst",
            category="P",
            subcategory="Positional geometry (P1, P9-P11)",
        ),
        figure=report(
            "results/{model}/geometry/canonical_angles.png",
            caption="../report/canonical_angles.rst",
            category="P",
            subcategory="Positional geometry (P1, P9-P11)",
        ),
        scorecard="results/{model}/scorecard/canonical_angles.csv",
    log:
        "logs/canonical_angles/{model}.log",
    wildcard_constraints:
        model=regex(MODELS),
    conda:
        "../envs/posmech.yaml"
    params:
        geometry=config["geometry"],
    script:
        "../../scripts/canonical_angles.py"


rule positional_sparsity:
    """Fraction of far-from-zero entries per layer vs W_pos (P9)."""
    input:
        h5=rules.extended_positional_embeddings.output.h5,
    output:
        table=report(
            "results/{model}/geometry/sparsity.csv",
            caption="../report/positional_sparsity.rst",
            category="P",
            subcategory="Positional geometry (P1, P9-P11)",
        ),
        figure=report(
            "results/{model}/geometry/sparsity.png",
            caption="../report/positional_sparsity.rst",
            category="P",
            subcategory="Positional geometry (P1, P9-P11)",
        ),
        scorecard="results/{model}/scorecard/positional_sparsity.csv",
    log:
        "logs/positional_sparsity/{model}.log",
    wildcard_constraints:
        model=regex(MODELS),
    conda:
        "../envs/posmech.yaml"
    params:
        geometry=config["geometry"],
    script:
        "../../scripts/positional_sparsity.py"


collect(rules.extended_positional_embeddings, model=geometry_models())
collect(rules.positional_pca, model=geometry_models())
collect(rules.canonical_angles, model=geometry_models())
collect(rules.positional_sparsity, model=geometry_models())
