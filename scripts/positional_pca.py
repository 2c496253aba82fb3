"""Rule positional_pca: PCA of W_pos and of every layer's extended embeddings; helix
figures (P1, P10) and the three-panel comparison."""

from posmech.analyses import geometry as geo
from posmech.plots import geometry as plots
from posmech.pipeline.runner import run
from posmech.store.tables import scorecard_rows, write_table


def main(smk, log):
    model, s, out = smk.wildcards.model, smk.params.settings, smk.output
    ext = geo.read_extended_artifact(smk.input.h5)
    first = geo.analysis_first(ext, s.first_position)
    layer = geo.helix_layer(ext, s.layer)
    # a twin's null: W_pos and the claims' layer only, no figure (config twins.claims_only)
    layers = geo.claimed_layers(ext, s.layer)
    pcas = geo.all_pcas(ext, first, s.n_components, layers)
    table = geo.pca_table(ext, model, first, s.n_components, pcas)
    write_table(table, out.table, geo.table_meta(ext, first, layers_computed="every layer" if layers is None else layers))
    if layers is None:
        plots.explained_variance(table, f"P1/P10 {model}: explained variance of top components", out.explained)
        h = geo.helices(ext, first, pcas)
        plots.helix(h["W_pos"], h["positions"], f"P1 {model}: W_pos, top-3 principal components", out.wpos_helix)
        plots.helix_grid(h["panels"], h["positions"], f"P1/P10 {model}: helices (own top-3 PCA basis)", out.helices)
        plots.comparison(geo.comparison_panels(ext, first, layer), (f"extended, {ext.sites[layer]}", "W_pos"),
                         f"P10 {model}: extended embeddings (layer {layer}, red) vs W_pos (blue)", out.comparison)
    rows = geo.pca_scorecard(table, model, layer, out.wpos_helix, out.comparison)
    write_table(scorecard_rows(rows), out.scorecard)
    log.info("top-3 explained variance: W_pos %.3f, layer %d %.3f", rows[0]["value"], layer, rows[1]["value"])


if __name__ == "__main__":  # a job of its own; a family job imports main (posmech.pipeline.runner)
    run(snakemake, main)  # noqa: F821
