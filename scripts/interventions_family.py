"""Rule interventions: the interventions family's job for one model (docs/workflow.md, "Families"):
prev_knockout, repeated_tokens, induction_intervention, in one process
(posmech.runner.run_family)."""

import induction_intervention
import prev_knockout
import repeated_tokens

from posmech.runner import run_family

run_family(snakemake, [  # noqa: F821
    (prev_knockout.main, {}),
    (repeated_tokens.main, {}),
    (induction_intervention.main, {}),
])
