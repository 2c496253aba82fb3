"""Rule attn_only: the attn_only family's job for one model (docs/workflow.md, "Families"):
random_token_patterns, input_decomposition, in one process (posmech.runner.run_family)."""

import input_decomposition
import random_token_patterns

from posmech.runner import run_family

run_family(snakemake, [  # noqa: F821
    (random_token_patterns.main, {}),
    (input_decomposition.main, {"heads": "random_token_patterns__heads"}),
])
