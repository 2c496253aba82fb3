"""Rule neurons: the neurons family's job for one model (docs/workflow.md, "Families"):
extended_token_embeddings, contextual_neurons, bag_of_tokens_fit, in one process
(posmech.runner.run_family)."""

import bag_of_tokens_fit
import contextual_neurons
import extended_token_embeddings

from posmech.runner import run_family

run_family(snakemake, [  # noqa: F821
    (extended_token_embeddings.main, {}),
    (contextual_neurons.main, {"extended": "extended_token_embeddings__h5"}),
    (bag_of_tokens_fit.main, {"extended": "extended_token_embeddings__h5", "ranking": "contextual_neurons__ranking"}),
])
