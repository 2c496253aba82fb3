"""Rule neurons: the neurons family's job for one model (docs/workflow.md, "Families"):
extended_token_embeddings, contextual_neurons, bag_of_tokens_fit, in one process
(posmech.runner.run_family)."""

from posmech.runner import run_family

run_family(snakemake, "neurons")  # noqa: F821
