"""Rule taxonomy: the taxonomy family's job for one model (docs/workflow.md, "Families"):
attention_statistics, diagonal_taxonomy, in one process (posmech.runner.run_family)."""

import attention_statistics
import diagonal_taxonomy

from posmech.runner import run_family

run_family(snakemake, [  # noqa: F821
    (attention_statistics.main, {}),
    (diagonal_taxonomy.main, {"statistics": "attention_statistics__h5"}),
])
