"""Rule contextual: the contextual family's job for one model (docs/workflow.md, "Families"):
layer0_decomposition, layer0_positional_patterns, layer0_head_classes, softmax_denominators,
denominator_variance, layer1_patterns, in one process (posmech.pipeline.runner.run_family; the analyses
and their links: posmech.core.families)."""

from importlib import import_module

from posmech.pipeline.runner import run_family

run_family(snakemake, "contextual", import_module)  # noqa: F821
