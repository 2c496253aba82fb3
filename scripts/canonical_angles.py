"""Rule canonical_angles: principal angles between the top-k right-singular subspaces of
W_pos and of each layer's extended embeddings (P11)."""

from posmech.analyses import geometry as geo
from posmech.plots import geometry as plots
from posmech.pipeline.runner import run
from posmech.store.tables import scorecard_rows, write_table


def main(smk, log):
    model, s, out = smk.wildcards.model, smk.params.settings, smk.output
    ext = geo.read_extended_artifact(smk.input.h5)
    first = geo.analysis_first(ext, s.first_position)
    layer = geo.helix_layer(ext, s.layer)
    layers = geo.claimed_layers(ext, s.layer)  # a twin's null: the claim's layer only (config twins.claims_only)
    table = geo.angles_table(ext, model, first, s.k, s.min_gap, layers)
    meta = geo.table_meta(ext, first, k=s.k, min_gap=s.min_gap, layers_computed="every layer" if layers is None else layers,
                          method="scipy.linalg.subspace_angles on the top-k right-singular vectors (d_model space)")
    write_table(table, out.table, meta)
    if layers is None:  # a twin's null draws no figure
        plots.angles(table, f"P11 {model}: canonical angles, top-{s.k} subspaces of W_pos vs extended",
                     out.figure)
    rows = geo.angles_scorecard(table, model, layer, out.table)
    write_table(scorecard_rows(rows), out.scorecard)
    if rows[0]["value"] is None:
        log.warning("layer %d canonical angles: %s", layer, rows[0]["detail"])
    else:
        log.info("layer %d canonical angles (deg): %s", layer, rows[0]["value"])


if __name__ == "__main__":  # a job of its own; a family job imports main (posmech.pipeline.runner)
    run(snakemake, main)  # noqa: F821
