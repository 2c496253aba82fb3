"""Rule diagonal_taxonomy: per-head mean attention per diagonal offset (P6), the P7
ranking with TransformerLens's head_detector score, and the chosen sharp / early heads."""

from posmech.analyses.attention_statistics import read_statistics
from posmech.analyses.taxonomy import analyse_taxonomy
from posmech.models.loading import read_manifest
from posmech.plots.taxonomy import taxonomy_figure
from posmech.runner import run
from posmech.tables import scorecard_rows, write_table


def main(smk, log):
    model, p = smk.wildcards.model, dict(smk.params.taxonomy)
    man = read_manifest(smk.input.manifest)
    stats, _, attrs = read_statistics(smk.input.statistics)
    context = attrs["taxonomy_context"]
    per_head, diagonals, chosen, meta = analyse_taxonomy(
        stats, model, p["early_top_n"], (p["pin"] or {}).get(model), attrs["exclude_first_query"], p["tie_rtol"])
    meta = {"claim": "P6,P7", "model": model, "corpus": p["corpus"], "context": context, **meta,
            "resolved_revision": man["resolved_revision"], "processing": attrs["processing"]}
    write_table(per_head, smk.output.table, meta)
    write_table(diagonals, smk.output.diagonals, meta)
    write_table(chosen, smk.output.heads, {k: meta[k] for k in ("claim", "model", "corpus", "n_documents", "pin")})
    taxonomy_figure(per_head, chosen, meta, model, smk.output.figure)
    prev = per_head[per_head["rank"].notna()].sort_values("rank")
    detail = f"{meta['n_documents']} {p['corpus']} documents of {context} tokens"
    rows = [
        {"claim": "P6", "quantity": "n_prev_token_heads", "value": meta["n_previous_token_heads"],
         "detail": f"of {meta['n_heads']} heads; {detail}", "artifact": smk.output.figure},
        {"claim": "P6", "quantity": "prev_token_head_fraction",
         "value": meta["n_previous_token_heads"] / meta["n_heads"],
         "detail": f"{meta['n_previous_token_heads']} of {meta['n_heads']} heads have their largest mean diagonal at "
                   f"offset -1; {detail}", "artifact": smk.output.figure},
        {"claim": "P7", "quantity": "sharpest_prev_token_head", "value": prev["head_name"].head(1).tolist(),
         "detail": detail, "artifact": smk.output.table},
        {"claim": "P7", "quantity": "diagonal_ratio", "value": dict(zip(prev["head_name"], prev["ratio"].round(4))),
         "detail": f"every previous-token head; Spearman vs head_detector {meta['spearman_ratio_vs_head_detector']}",
         "artifact": smk.output.table},
    ]
    write_table(scorecard_rows([{**r, "model": model} for r in rows]), smk.output.scorecard)
    if meta["n_heads_with_ties"]:
        log.info("%d heads have offsets tied for the largest mean diagonal (relative tolerance %g); "
                 "ties go to the smallest offset", meta["n_heads_with_ties"], p["tie_rtol"])
    log.info("%d of %d heads are previous-token heads; chosen %s", meta["n_previous_token_heads"], meta["n_heads"],
             ", ".join(f"{r.role} {r.head_name}" for r in chosen.itertuples()))


run(snakemake, main)  # noqa: F821
