"""Rule layer0_head_classes (K7): duplicate-token score on the texts, ETC and local mass of
the positional pattern, and the class of every layer-0 head by the configured thresholds."""

from posmech.analyses import contextual as cx
from posmech.models.loading import read_manifest
from posmech.plots.contextual import class_figure
from posmech.runner import run
from posmech.tables import scorecard_rows, write_table

NAMES = {"detokenization": "detokenization_heads", "contextual": "contextual_heads",
         "duplicate_token": "duplicate_token_heads", "other": "other_heads"}


def main(smk, log):
    model, p, out = smk.wildcards.model, dict(smk.params.contextual), smk.output
    dec = cx.read_decomposition(smk.input.h5)
    w, _ = cx.load_weights(read_manifest(smk.input.manifest), model, tokenizer=False)
    pos = cx.resolved_positions(p, w.n_ctx, model)
    mass, excess, count = cx.duplicate_scores(w, float(dec.attrs["ln_scale_used"]), list(dec.token_ids),
                                              pos["max_position"])
    keys = ("duplicate_min_excess", "local_min_mass", "uniform_min_fraction")
    thr = {k: p[k] for k in keys}
    df = cx.head_classes(dec, mass, excess, count, pos["classify_position"], p["k0"], p["local_window"], thr, model)
    meta = {**thr, "local_window": p["local_window"], "k0": p["k0"], "n": pos["classify_position"],
            "destination_token": p["destination_token"], "texts": list(dec.texts["title"])}
    write_table(df, out.table, meta)
    class_figure(df, thr, f"K7 {model}: behavioural classes of the layer-0 heads", out.figure)
    rows = [{"claim": "K7", "quantity": q, "value": df[df["head_class"] == c]["head_name"].tolist(),
             "detail": f"thresholds {thr}, local window {p['local_window']}, n = {pos['classify_position']}; "
             f"duplicate score over {count} destinations with an earlier copy", "artifact": out.table}
            for c, q in NAMES.items()]
    write_table(scorecard_rows([{**r, "model": model} for r in rows]), out.scorecard)
    log.info("classes: %s", dict(zip(df["head_name"], df["head_class"])))


run(snakemake, main)  # noqa: F821
