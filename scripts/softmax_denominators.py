"""Rule softmax_denominators (K8): Z_h(n) against n with the destination token fixed, per
text, linear and exact LayerNorm; which contextual heads vary most across texts."""

from posmech.analyses import contextual as cx
from posmech.plots.contextual import denominator_figure
from posmech.pipeline.runner import run
from posmech.store.tables import read_table, scorecard_rows, write_table


def main(smk, log):
    model, p, out = smk.wildcards.model, smk.params.settings, smk.output
    dec = cx.read_decomposition(smk.input.h5)
    classes = read_table(smk.input.classes)["head_class"].tolist()
    # denominator_from as layer0_decomposition resolved it (null: scaled with the model's context)
    pos, frm = dec.positions, p.recorded(dec.attrs["contextual_config"], dec.attrs["n_ctx"], model).denominator_from
    spread = {k: cx.denominator_spread(getattr(dec, f"log_z_{k}"), pos, frm) for k in ("linear", "exact")}
    df = cx.denominator_table(dec, classes, spread, frm, model)
    write_table(df, out.table, {"destination_token": p.destination_token, "denominator_from": frm,
                                "positions": [int(pos[0]), int(pos[-1])],
                                "spread": "mean over n >= denominator_from of the std over texts of log Z_h(n)"})
    denominator_figure(pos, dec.log_z_linear, dec.log_z_exact, list(dec.texts["title"]), classes,
                       f"K8 {model}: softmax denominator Z_h(n), destination {p.destination_token!r} "
                       "(solid: linear LN, dotted: exact)", out.figure)
    card = cx.denominator_scorecard(spread, classes, p.n_most_varying, len(dec.texts), frm, model, out.figure,
                                    out.table)
    write_table(scorecard_rows(card), out.scorecard)
    top = {"linear": card[0]["value"], "exact": card[1]["value"]}
    log.info("most varying (linear): %s; (exact): %s", top["linear"], top["exact"])


if __name__ == "__main__":  # a job of its own; a family job imports main (posmech.pipeline.runner)
    run(snakemake, main)  # noqa: F821
