"""Rule layer0_head_classes (K7): duplicate-token score on the texts, ETC and local mass of
the positional pattern, and the class of every layer-0 head by the configured thresholds."""

from posmech.analyses import contextual as cx
from posmech.models.loading import read_manifest
from posmech.plots.contextual import class_figure
from posmech.pipeline.runner import run
from posmech.store.tables import scorecard_rows, write_table

def main(smk, log):
    model, p, out = smk.wildcards.model, smk.params.settings, smk.output
    dec = cx.read_decomposition(smk.input.h5)
    w, _ = cx.load_weights(read_manifest(smk.input.manifest), model, tokenizer=False,
                             entry=smk.params.entry)
    pos = p.recorded(dec.attrs["contextual_config"], dec.attrs["n_ctx"], model)  # as layer0_decomposition resolved them
    mass, excess, count = cx.duplicate_scores(w, float(dec.attrs["ln_scale_used"]), list(dec.token_ids),
                                              pos.max_position)
    keys = ("duplicate_min_excess", "local_min_mass", "uniform_min_fraction")
    thr = {k: getattr(p, k) for k in keys}
    df = cx.head_classes(dec, mass, excess, count, pos.classify_position, p.k0, p.local_window, thr, model)
    meta = {**thr, "local_window": p.local_window, "k0": p.k0, "n": pos.classify_position,
            "destination_token": p.destination_token, "texts": list(dec.texts["title"])}
    write_table(df, out.table, meta)
    class_figure(df, thr, f"K7 {model}: behavioural classes of the layer-0 heads", out.figure)
    card = cx.head_class_scorecard(df, thr, p.local_window, pos.classify_position, count, model, out.table)
    write_table(scorecard_rows(card), out.scorecard)
    log.info("classes: %s", dict(zip(df["head_name"], df["head_class"])))


if __name__ == "__main__":  # a job of its own; a family job imports main (posmech.pipeline.runner)
    run(snakemake, main)  # noqa: F821
