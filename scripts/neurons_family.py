"""Rule neurons: the neurons family's job for one model (docs/workflow.md, "Families"):
extended_token_embeddings, contextual_neurons, bag_of_tokens_fit, in one process
(posmech.pipeline.runner.run_family)."""

from importlib import import_module

from posmech.pipeline.runner import run_family

run_family(snakemake, "neurons", import_module)  # noqa: F821
