"""Rule diagonal_taxonomy: per-head mean attention per diagonal offset (P6), the P7
ranking with TransformerLens's head_detector score, and the chosen sharp / early heads."""

from posmech.analyses.taxonomy.statistics import read_statistics
from posmech.analyses.taxonomy import analyse_taxonomy, taxonomy_scorecard
from posmech.models.scores import read_position_biases
from posmech.models.loading import read_manifest
from posmech.plots.taxonomy import taxonomy_figure
from posmech.pipeline.runner import run
from posmech.store.tables import scorecard_rows, write_table


def main(smk, log):
    model, p = smk.wildcards.model, smk.params.settings
    man = read_manifest(smk.input.manifest)
    stats, _, attrs = read_statistics(smk.input.statistics)
    context = attrs["taxonomy_context"]
    per_head, diagonals, chosen, meta = analyse_taxonomy(
        stats, model, p.early_top_n, p.pinned(model), attrs["exclude_first_query"], p.tie_rtol,
        p.prev_token_min_excess, *read_position_biases(man["hf_dir"], *stats.sums.shape[:2]))
    meta = {"claim": "P6,P7", "model": model, "corpus": p.corpus, "context": context, **meta,
            "resolved_revision": man["resolved_revision"], "processing": attrs["processing"]}
    write_table(per_head, smk.output.table, meta)
    write_table(diagonals, smk.output.diagonals, meta)
    write_table(chosen, smk.output.heads, {k: meta[k] for k in ("claim", "model", "corpus", "n_documents", "pin")})
    taxonomy_figure(per_head, chosen, meta, model, smk.output.figure)
    card = taxonomy_scorecard(per_head, meta, model, p.corpus, context, smk.output.figure, smk.output.table)
    write_table(scorecard_rows(card), smk.output.scorecard)
    if meta["n_heads_with_ties"]:
        log.info("%d heads have offsets tied for the largest mean diagonal (relative tolerance %g); "
                 "ties go to the smallest offset", meta["n_heads_with_ties"], p.tie_rtol)
    log.info("%d of %d heads are previous-token heads (%d by the post's definition); chosen %s",
             meta["n_previous_token_heads"], meta["n_heads"], meta["n_previous_token_heads_post"],
             ", ".join(f"{r.role} {r.head_name} ({r.rule})" for r in chosen.itertuples()))


if __name__ == "__main__":  # a job of its own; a family job imports main (posmech.pipeline.runner)
    run(snakemake, main)  # noqa: F821
