"""The analysis families that run as one job per model (docs/workflow.md, "Families").

The rule ``<family>`` of ``workflow/rules/<family>.smk`` runs the analyses of
:data:`FAMILIES`, in this order, in one process (:func:`posmech.pipeline.runner.run_family`). A job has
fixed outputs, so a family runs on a model all or not at all: its analyses must be
applicable to the same models (:func:`posmech.pipeline.applicability.family_problems`; the workflow
refuses a family that is not). Analyses not named here run as rules of their own. Data only,
so that any module (the HDF5 errors naming the rule to rerun) can read it.
"""

from __future__ import annotations

FAMILIES: dict[str, tuple[str, ...]] = {
    "taxonomy": ("attention_statistics", "diagonal_taxonomy"),
    "anatomy": ("score_anatomy", "score_taxa"),
    "geometry": ("extended_positional_embeddings", "positional_pca", "canonical_angles", "positional_sparsity"),
    "interventions": ("prev_knockout", "repeated_tokens", "induction_intervention"),
    "kernels": ("positional_kernels", "etc_table", "kernel_heatmaps"),
    "contextual": ("layer0_decomposition", "layer0_positional_patterns", "layer0_head_classes",
                   "softmax_denominators", "denominator_variance", "layer1_patterns"),
    "neurons": ("extended_token_embeddings", "contextual_neurons", "bag_of_tokens_fit"),
    "attn_only": ("random_token_patterns", "input_decomposition"),
}


#: the inputs of each analysis that read an output of an analysis run before it in its
#: family's job: ``{analysis: {its input name: "<earlier analysis>__<output key>"}}``
#: (:func:`posmech.pipeline.runner.analysis_view`); an analysis not listed reads only its rule's inputs
LINKS: dict[str, dict[str, str]] = {
    "diagonal_taxonomy": {"statistics": "attention_statistics__h5"},
    "positional_pca": {"h5": "extended_positional_embeddings__h5"},
    "canonical_angles": {"h5": "extended_positional_embeddings__h5"},
    "positional_sparsity": {"h5": "extended_positional_embeddings__h5"},
    "etc_table": {"h5": "positional_kernels__h5"},
    "kernel_heatmaps": {"h5": "positional_kernels__h5", "table": "etc_table__table"},
    "layer0_positional_patterns": {"h5": "layer0_decomposition__h5"},
    "layer0_head_classes": {"h5": "layer0_decomposition__h5"},
    "softmax_denominators": {"h5": "layer0_decomposition__h5", "classes": "layer0_head_classes__table"},
    "denominator_variance": {"h5": "layer0_decomposition__h5", "classes": "layer0_head_classes__table"},
    "layer1_patterns": {"h5": "layer0_decomposition__h5"},
    "contextual_neurons": {"extended": "extended_token_embeddings__h5"},
    "bag_of_tokens_fit": {"extended": "extended_token_embeddings__h5", "ranking": "contextual_neurons__ranking"},
    "input_decomposition": {"heads": "random_token_patterns__heads"},
}


def rule_of(analysis: str) -> str:
    """The Snakemake rule that runs ``analysis``: its family's, else its own name."""
    return next((family for family, names in FAMILIES.items() if analysis in names), analysis)


#: the per-head tables the head-roles table gathers (rule head_table, :mod:`posmech.verdicts.heads`):
#: ``{its input name: "<analysis>__<output key>"}``, an output of the analysis's family rule,
#: read for the models the family runs on
HEAD_TABLE_SOURCES: dict[str, str] = {
    "taxonomy": "diagonal_taxonomy__table",
    "chosen": "diagonal_taxonomy__heads",
    "taxa": "score_taxa__table",
    "etc": "etc_table__table",
    "classes": "layer0_head_classes__table",
    "roles": "random_token_patterns__heads",
    "masses": "random_token_patterns__masses",
}
