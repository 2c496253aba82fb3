"""Rule taxonomy: the taxonomy family's job for one model (docs/workflow.md, "Families"):
attention_statistics, diagonal_taxonomy, in one process (posmech.runner.run_family; the analyses
and their links: posmech.families)."""

from posmech.runner import run_family

run_family(snakemake, "taxonomy")  # noqa: F821
