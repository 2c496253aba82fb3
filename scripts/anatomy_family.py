"""Rule anatomy: the anatomy family's job for one model (docs/workflow.md, "Families"):
score_anatomy, score_taxa, in one process (posmech.runner.run_family; the analyses
and their links: posmech.families)."""

from posmech.runner import run_family

run_family(snakemake, "anatomy")  # noqa: F821
