"""Rule kernels: the kernels family's job for one model (docs/workflow.md, "Families"):
positional_kernels, etc_table, kernel_heatmaps, in one process (posmech.pipeline.runner.run_family; the analyses
and their links: posmech.core.families)."""

from importlib import import_module

from posmech.pipeline.runner import run_family

run_family(snakemake, "kernels", import_module)  # noqa: F821
