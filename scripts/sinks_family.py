"""Rule sinks: the sinks family's job for one model (docs/workflow.md, "Families"): the
analyses declared in workflow/analyses/sinks.yaml, in order, in one process
(posmech.pipeline.runner.run_family)."""

from importlib import import_module

from posmech.pipeline.runner import run_family

run_family(snakemake, "sinks", import_module)  # noqa: F821
