"""Rule layer0_positional_patterns (K6): every layer-0 head's positional pattern for the
fixed destination token and for the pattern text's own token, beside its real attention
row, at the configured positions; ETC and TV distances per head and n."""

from posmech.analyses import contextual as cx
from posmech.models.loading import read_manifest
from posmech.plots.contextual import pattern_grids
from posmech.pipeline.runner import run
from posmech.store.tables import scorecard_rows, write_table


def main(smk, log):
    model, p, out = smk.wildcards.model, smk.params.settings, smk.output
    dec = cx.read_decomposition(smk.input.h5)
    w, tokenizer = cx.load_weights(read_manifest(smk.input.manifest), model, entry=smk.params.entry)
    pos = p.recorded(dec.attrs["contextual_config"], dec.attrs["n_ctx"], model)  # as layer0_decomposition resolved them
    grid = pos.grid
    s, ids, title = float(dec.attrs["ln_scale_used"]), dec.token_ids[0], dec.texts["title"][0]
    grids, df = cx.positional_patterns(w, s, ids, list(pos.positions), int(dec.attrs["destination_id"]),
                                       grid ** 2, p.k0)
    cx.positional_pattern_table(df, model, tokenizer)
    write_table(df, out.table, {"text": title, "corpus": dec.texts["corpus"][0], "k0": p.k0,
                                "destination_token": p.destination_token, "ln_scale_used": s})
    pattern_grids(grids, grid, p.destination_token, {n: tokenizer.decode([int(ids[n])]) for n in grids},
                  f"K6 {model}: layer-0 positional patterns (last {grid ** 2} keys as {grid}x{grid} "
                  f"grids) and the real attention row on {title}", out.figure)
    card = cx.positional_pattern_scorecard(df, list(grids), title, p.destination_token, model, out.figure, out.table)
    write_table(scorecard_rows(card), out.scorecard)
    log.info("n = %s: median TV(fixed, real) %.3f", sorted(grids), float(df["tv_fixed_vs_real"].median()))


if __name__ == "__main__":  # a job of its own; a family job imports main (posmech.pipeline.runner)
    run(snakemake, main)  # noqa: F821
