"""Rule geometry: the geometry family's job for one model (docs/workflow.md, "Families"):
extended_positional_embeddings, positional_pca, canonical_angles, positional_sparsity, in one
process (posmech.runner.run_family)."""

import canonical_angles
import extended_positional_embeddings
import positional_pca
import positional_sparsity

from posmech.runner import run_family

run_family(snakemake, [  # noqa: F821
    (extended_positional_embeddings.main, {}),
    (positional_pca.main, {"h5": "extended_positional_embeddings__h5"}),
    (canonical_angles.main, {"h5": "extended_positional_embeddings__h5"}),
    (positional_sparsity.main, {"h5": "extended_positional_embeddings__h5"}),
])
