"""Rule attn_only: the attn_only family's job for one model (docs/workflow.md, "Families"):
random_token_patterns, input_decomposition, in one process (posmech.pipeline.runner.run_family; the analyses
and their links: posmech.core.families)."""

from importlib import import_module

from posmech.pipeline.runner import run_family

run_family(snakemake, "attn_only", import_module)  # noqa: F821
