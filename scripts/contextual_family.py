"""Rule contextual: the contextual family's job for one model (docs/workflow.md, "Families"):
layer0_decomposition, layer0_positional_patterns, layer0_head_classes, softmax_denominators,
denominator_variance, layer1_patterns, in one process (posmech.runner.run_family; the analyses
and their links: posmech.families)."""

from posmech.runner import run_family

run_family(snakemake, "contextual")  # noqa: F821
