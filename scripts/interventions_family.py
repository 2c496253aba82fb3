"""Rule interventions: the interventions family's job for one model (docs/workflow.md, "Families"):
prev_knockout, repeated_tokens, induction_intervention, in one process
(posmech.runner.run_family)."""

from posmech.runner import run_family

run_family(snakemake, "interventions")  # noqa: F821
