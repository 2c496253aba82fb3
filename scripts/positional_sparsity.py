"""Rule positional_sparsity: per layer, the fraction of far-from-zero entries of the
extended embeddings relative to W_pos's scale, and the ratio to W_pos (P9)."""

from posmech.analyses import geometry as geo
from posmech.plots import geometry as plots
from posmech.pipeline.runner import run
from posmech.store.tables import scorecard_rows, write_table


def main(smk, log):
    model, s, out = smk.wildcards.model, smk.params.settings, smk.output
    ext = geo.read_extended_artifact(smk.input.h5)
    first = geo.analysis_first(ext, s.first_position)
    table = geo.sparsity_table(ext, model, first, s.sparsity_threshold)
    meta = geo.table_meta(ext, first, far_from_zero=f"|x| > {s.sparsity_threshold} x RMS entry of centred W_pos")
    write_table(table, out.table, meta)
    plots.sparsity(table, f"P9 {model}: entries far from 0, extended embeddings vs W_pos", out.figure)
    rows = geo.sparsity_scorecard(table, model, out.table)
    write_table(scorecard_rows(rows), out.scorecard)
    log.info("W_pos / extended far-from-zero ratio (median, layers > 0): %.2f", rows[0]["value"])


if __name__ == "__main__":  # a job of its own; a family job imports main (posmech.pipeline.runner)
    run(snakemake, main)  # noqa: F821
