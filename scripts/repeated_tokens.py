"""Rule repeated_tokens (P14): the sharp head's previous-token attention where the previous
token equals the current one vs elsewhere, on web-text documents."""

from posmech.analyses import interventions as iv
from posmech.analyses.attention import head_columns
from posmech.analyses.taxonomy import read_chosen_heads
from posmech.data.tokens import read_tokens
from posmech.models.loading import load_model, read_manifest
from posmech.plots import interventions as plots
from posmech.pipeline.runner import run
from posmech.settings import positions_for
from posmech.store.tables import scorecard_rows, write_table


def main(smk, log):
    model, entry, s = smk.wildcards.model, smk.params.entry, smk.params.settings
    man = read_manifest(smk.input.manifest)
    bridge = load_model(man, entry["device"], entry["dtype"], entry["processing"], entry["engine"])
    heads = read_chosen_heads(smk.input.heads)
    sharp = heads["sharp"][0]
    toks = read_tokens(smk.input.tokens)
    # min_tokens, zoom resolved for the tokens' context, once (null: scaled with it); the table records them
    s = positions_for(s, int(toks.attrs["n_ctx"]), model, f"the tokens of {smk.input.tokens}")
    docs = iv.select_documents(toks, s.n_documents, s.min_tokens, s.max_tokens)
    with iv.unchanged(bridge):
        rows, zoom = iv.repeated_tokens(bridge, docs, sharp, s.zoom, s.repeated_tokens.context)
    df = iv.tidy(rows, "P14", model, {**head_columns(sharp), "corpus": smk.params.corpus})
    write_table(df, smk.output.table, iv.table_meta(man, entry, s, heads))
    plots.repeated_tokens(df, zoom, model, smk.output.figure)
    card = iv.repeated_scorecard(df, model, smk.output.figure)
    write_table(scorecard_rows(card), smk.output.scorecard)
    log.info("%s: %s", sharp, "; ".join(f"{r['quantity']} {r['value']:.4f}" for r in card))


if __name__ == "__main__":  # a job of its own; a family job imports main (posmech.pipeline.runner)
    run(snakemake, main)  # noqa: F821
