"""The analysis families that run as one job per model (docs/workflow.md, "Families").

The rule ``<family>`` of ``workflow/rules/<family>.smk`` runs the analyses of
:data:`FAMILIES`, in this order, in one process (:func:`posmech.runner.run_family`). A job has
fixed outputs, so a family runs on a model all or not at all: its analyses must be
applicable to the same models (:func:`posmech.applicability.family_problems`; the workflow
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


def rule_of(analysis: str) -> str:
    """The Snakemake rule that runs ``analysis``: its family's, else its own name."""
    return next((family for family, names in FAMILIES.items() if analysis in names), analysis)
