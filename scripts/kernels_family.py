"""Rule kernels: the kernels family's job for one model (docs/workflow.md, "Families"):
positional_kernels, etc_table, kernel_heatmaps, in one process (posmech.runner.run_family; the analyses
and their links: posmech.families)."""

from posmech.runner import run_family

run_family(snakemake, "kernels")  # noqa: F821
