"""Rule anatomy: the anatomy family's job for one model (docs/workflow.md, "Families"):
score_anatomy, score_taxa, in one process (posmech.runner.run_family)."""

import score_anatomy
import score_taxa

from posmech.runner import run_family

run_family(snakemake, [  # noqa: F821
    (score_anatomy.main, {}),
    (score_taxa.main, {}),
])
