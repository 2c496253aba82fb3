"""Rule score_anatomy: raw scores (q·k/√d_head, future included), masked scores and pattern
of the chosen previous-token heads on one document, full and zoomed (P12)."""

from posmech.analyses import anatomy as sa
from posmech.analyses.attention import window
from posmech.analyses.taxonomy import read_chosen_heads
from posmech.data.tokens import read_tokens
from posmech.core.errors import PosmechError
from posmech.models.loading import load_model, read_manifest
from posmech.models.scores import attn_scale
from posmech.plots.anatomy import score_triptychs
from posmech.pipeline.runner import run
from posmech.store.tables import claim_columns, scorecard_rows, write_table


def main(smk, log):
    model, entry, p = smk.wildcards.model, smk.params.entry, smk.params.settings
    tokens = read_tokens(smk.input.tokens)
    docs, context, index = sa.long_documents(tokens, p.document + 1, p.context)
    if p.document >= len(docs):
        raise PosmechError(f"config key `anatomy.document`: {p.document} but only {len(docs)} documents of "
                              f"corpus {p.corpus} have {context} tokens; choose a smaller index")
    doc, j = docs[p.document], index[p.document]
    heads = sa.anatomy_heads(read_chosen_heads(smk.input.heads), p.pinned(model))
    bridge = load_model(read_manifest(smk.input.manifest), entry["device"], entry["dtype"], entry["processing"], entry["engine"])
    panels = sa.head_scores(bridge, doc, [h for h, _ in heads])
    # a zoom as large as the document would repeat the full figure: then half the document
    start, size = window(context, p.zoom_start, min(p.zoom_size, max(2, context // 2)))
    if (start, size) != (p.zoom_start, p.zoom_size):
        log.warning("zoom %d+%d does not fit %d tokens (or is not smaller than them); using %d+%d",
                    p.zoom_start, p.zoom_size, context, start, size)
    meta = {"claim": "P12", "model": model, "corpus": p.corpus, "document": j, "title": tokens.titles[j],
            "n_tokens": context, "zoom_start": start, "zoom_size": size, "scale": attn_scale(bridge.cfg),
            "heads": dict(heads), "processing": entry["processing"]}
    table = sa.scores_table(panels, dict(heads), p.window)
    claim_columns(table, "P12", model)
    write_table(table, smk.output.table, meta)
    sa.write_scores(smk.output.h5, panels, doc, meta)
    tri = [(x.head, role, x.raw, x.masked, x.pattern) for x, (_, role) in zip(panels, heads)][: p.figure_heads]
    where = f"{model}, {p.corpus} document {j} ({context} tokens)"
    if len(tri) < len(panels):
        where += f"; first {len(tri)} of {len(panels)} heads, all in the table"
    score_triptychs(tri, start, size, False, f"P12 {where}: scores and pattern, full", smk.output.full, p.window)
    score_triptychs(tri, start, size, True, f"P12 {where}: {size}x{size} zoom at {start}", smk.output.zoom, p.window)
    rows = sa.anatomy_scorecard(table, model, f"{where}; zoom {size}x{size} at {start}; raw = q·k/{meta['scale']:.4g}",
                                smk.output.zoom)
    write_table(scorecard_rows(rows), smk.output.scorecard)
    log.info("P12 %s: %s; masked vs hook_attn_scores max |diff| %.3g", where, ", ".join(
        f"{r.head_name} ({r.role}) dip {r.dip:.2f} bump {r.bump:.2f}" for r in table.itertuples()),
        table["max_abs_diff_masked_vs_hook"].max())


if __name__ == "__main__":  # a job of its own; a family job imports main (posmech.pipeline.runner)
    run(snakemake, main)  # noqa: F821
