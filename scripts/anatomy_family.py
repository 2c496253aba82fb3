"""Rule anatomy: the anatomy family's job for one model (docs/workflow.md, "Families"):
score_anatomy, score_taxa, in one process (posmech.pipeline.runner.run_family; the analyses
and their links: posmech.core.families)."""

from importlib import import_module

from posmech.pipeline.runner import run_family

run_family(snakemake, "anatomy", import_module)  # noqa: F821
