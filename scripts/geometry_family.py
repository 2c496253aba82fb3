"""Rule geometry: the geometry family's job for one model (docs/workflow.md, "Families"):
extended_positional_embeddings, positional_pca, canonical_angles, positional_sparsity, in one
process (posmech.runner.run_family)."""

from posmech.runner import run_family

run_family(snakemake, "geometry")  # noqa: F821
