"""Rule taxonomy: the taxonomy family's job for one model (docs/workflow.md, "Families"):
attention_statistics, diagonal_taxonomy, in one process (posmech.pipeline.runner.run_family; the analyses
and their links: posmech.core.families)."""

from importlib import import_module

from posmech.pipeline.runner import run_family

run_family(snakemake, "taxonomy", import_module)  # noqa: F821
