"""Rule extended_averaging (P15): replace the residual stream's positional component (the
extended positional embeddings) by its group average just before each chosen head's layer."""

from posmech.analyses import interventions as iv
from posmech.analyses.attention import parse_head
from posmech.analyses.geometry import read_extended_artifact
from posmech.analyses.taxonomy import read_chosen_heads
from posmech.analyses.posembed import group_average
from posmech.data.tokens import read_tokens
from posmech.models.loading import load_model, read_manifest
from posmech.plots import interventions as plots
from posmech.pipeline.runner import run
from posmech.settings import positions_for
from posmech.store.tables import scorecard_rows, write_table


def main(smk, log):
    model, entry, s = smk.wildcards.model, smk.params.entry, smk.params.settings
    k = s.extended_averaging.group_size
    man = read_manifest(smk.input.manifest)
    bridge = load_model(man, entry["device"], entry["dtype"], entry["processing"], entry["engine"])
    heads = read_chosen_heads(smk.input.heads)
    roles = {**{h: "early" for h in heads["early"]}, heads["sharp"][0]: "sharp"}
    ext = read_extended_artifact(smk.input.extended)
    layers = sorted({parse_head(h)[0] for h in roles})
    deltas = {l: iv.extended_shift(ext.extended[l], k, ext.first_token_position, group_average) for l in layers}
    toks = read_tokens(smk.input.tokens)
    # min_tokens, zoom resolved for the tokens' context, once (null: scaled with it); the table records them
    s = positions_for(s, int(toks.attrs["n_ctx"]), model, f"the tokens of {smk.input.tokens}")
    docs = iv.select_documents(toks, s.n_documents, s.min_tokens, s.max_tokens)
    measured = sorted(roles, key=parse_head)  # by layer: the figure reads top (early) to bottom
    with iv.unchanged(bridge):
        rows, zooms = iv.extended_averaging(bridge, docs, measured, deltas, s.zoom, s.zoom_start)
    params = {"group_size": k, "first_averaged_position": ext.first_token_position, "corpus": smk.params.corpus}
    df = iv.tidy(rows, "P15", model, params).assign(role=lambda d: d["head_name"].map(roles))
    write_table(df, smk.output.table, iv.table_meta(man, entry, s, heads, extended_tokens=int(len(ext.tokens))))
    dmg = iv.damage(df)
    plots.extended_patterns(zooms, dmg, model, k, smk.output.figure)
    write_table(scorecard_rows(iv.extended_scorecard(df, model, smk.output.figure)), smk.output.scorecard)
    log.info("damage (relative loss of prev-token mass) %s", {h: round(v, 4) for h, v in dmg.items()})


if __name__ == "__main__":  # a job of its own; a family job imports main (posmech.pipeline.runner)
    run(snakemake, main)  # noqa: F821
