"""Rule score_taxa: every head's score profile around the diagonal over many documents and
query positions; features (dip, bump, trend), taxa and the P6 split (P13)."""

from posmech.analyses import anatomy as sa
from posmech.analyses.taxonomy.statistics import read_statistics
from posmech.analyses.taxonomy import read_chosen_heads, strict_early_heads
from posmech.plots.anatomy import taxa_figure
from posmech.pipeline.runner import run
from posmech.store.tables import claim_columns, read_table, scorecard_rows, write_table


def main(smk, log):
    model, p = smk.wildcards.model, smk.params.settings
    th = p.taxa
    _, prof, attrs = read_statistics(smk.input.statistics, need_profiles=True)
    context = attrs["anatomy_context"]
    taxa = sa.classify_taxa(prof.features, th)
    split = sa.split_of_previous_token_heads(taxa, read_table(smk.input.taxonomy))
    meta = {"claim": "P13", "model": model, "corpus": p.corpus, "context": context,
            "n_documents": prof.n_documents, "n_rows_per_head": int(prof.features.shape[2]), "window": p.window,
            "rows_per_document": p.rows_per_document, "thresholds": th.as_dict(), "flat_rtol": sa.FLAT_RTOL,
            "max_abs_diff_vs_hook_attn_scores": prof.max_check_error, "prev_token_heads_by_taxon": split,
            "processing": attrs["processing"]}
    claim_columns(taxa, "P13", model)
    write_table(sa.taxa_order(taxa), smk.output.table, meta)
    profiles = sa.profile_frame(prof, model)
    write_table(profiles, smk.output.profiles, meta)
    sa.write_profiles(smk.output.h5, prof, meta)
    chosen = read_chosen_heads(smk.input.heads)
    roles = {h: r for r in ("early", "sharp") for h in chosen[r]}
    taxa_figure(taxa, profiles, th, roles, f"P13 {model}: score taxa of every head ({prof.n_documents} documents, "
                f"{meta['n_rows_per_head']} rows per head, window ±{p.window})", smk.output.figure)
    detail = f"{prof.n_documents} {p.corpus} documents of {context} tokens, {meta['n_rows_per_head']} rows per head"
    rows = sa.score_taxa_scorecard(taxa, split, strict_early_heads(chosen), model, detail, smk.output.table)
    write_table(scorecard_rows(rows), smk.output.scorecard)
    for t in sa.TAXA[:2]:
        log.info("%s: %s", t, ", ".join(taxa.loc[taxa["taxon"] == t, "head_name"]) or "none")
    log.info("P6 previous-token heads by taxon: %s", split)


if __name__ == "__main__":  # a job of its own; a family job imports main (posmech.pipeline.runner)
    run(snakemake, main)  # noqa: F821
