"""Rule prev_knockout (P5): zero attention to the previous position at every period-th query
in the early layers; the sharp head's previous-token mass and pattern before/after."""

from posmech.analyses import interventions as iv
from posmech.analyses.attention import head_columns
from posmech.analyses.taxonomy import read_chosen_heads
from posmech.core.null import only_claims
from posmech.data.tokens import read_tokens
from posmech.models.loading import load_model, read_manifest
from posmech.plots import interventions as plots
from posmech.pipeline.runner import run
from posmech.settings import positions_for
from posmech.store.tables import scorecard_rows, write_table


def main(smk, log):
    model, entry, s = smk.wildcards.model, smk.params.entry, smk.params.settings
    ko = s.prev_knockout
    man = read_manifest(smk.input.manifest)
    bridge = load_model(man, entry["device"], entry["dtype"], entry["processing"], entry["engine"])
    heads = read_chosen_heads(smk.input.heads)
    sharp = heads["sharp"][0]
    layers = iv.knockout_layers(ko.layers, sharp)
    if not layers:
        log.warning("no layer to knock out (sharp head %s is in layer 0): every condition equals intact", sharp)
    toks = read_tokens(smk.input.tokens)
    # min_tokens, zoom resolved for the tokens' context, once (null: scaled with it); the table records them
    s = positions_for(s, int(toks.attrs["n_ctx"]), model, f"the tokens of {smk.input.tokens}")
    docs = iv.select_documents(toks, s.n_documents, s.min_tokens, s.max_tokens)
    # a twin's null computes only the conditions P5's claim reads (config twins.claims_only)
    conditions = iv.CLAIMED_KNOCKOUT_CONDITIONS if only_claims() else iv.KNOCKOUT_CONDITIONS
    with iv.unchanged(bridge):
        rows, zoom = iv.prev_knockout(bridge, docs, sharp, layers, ko.period, ko.phase, s.zoom, s.zoom_start,
                                      conditions)
    params = {**head_columns(sharp), "layers": layers, "period": ko.period, "phase": ko.phase, "corpus": smk.params.corpus}
    df = iv.tidy(rows, "P5", model, params)
    write_table(df, smk.output.table, iv.table_meta(man, entry, s, heads, prev_mass="attention[q, q-1], queries q >= 1",
                                                    conditions=list(conditions)))
    masses = iv.pooled(df[df["query_set"] == "all"], ["condition"]).to_dict()
    if not only_claims():  # a twin's null draws no figure
        plots.knockout_patterns(zoom, masses, model, layers, ko.period, smk.output.figure)
    write_table(scorecard_rows(iv.knockout_scorecard(df, model, smk.output.figure)), smk.output.scorecard)
    log.info("%s prev-token mass %s over %d documents", sharp, {k: round(v, 4) for k, v in masses.items()}, len(docs))


if __name__ == "__main__":  # a job of its own; a family job imports main (posmech.pipeline.runner)
    run(snakemake, main)  # noqa: F821
