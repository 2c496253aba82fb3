"""Rule attn_only: the attn_only family's job for one model (docs/workflow.md, "Families"):
random_token_patterns, input_decomposition, in one process (posmech.runner.run_family; the analyses
and their links: posmech.families)."""

from posmech.runner import run_family

run_family(snakemake, "attn_only")  # noqa: F821
