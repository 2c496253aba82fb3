"""Rule denominator_variance (K9): predicted Var Z_h(n) = sum_i p_h(n, i)^2 Var(c) against
the variance observed over i.i.d. redraws of each text's tokens (positions fixed)."""

from posmech.analyses import contextual as cx
from posmech.plots.contextual import variance_figure
from posmech.pipeline.runner import run
from posmech.store.tables import read_table, scorecard_rows, write_table


def main(smk, log):
    model, p, out = smk.wildcards.model, smk.params.settings, smk.output
    dec = cx.read_decomposition(smk.input.h5)
    classes = read_table(smk.input.classes)["head_class"].tolist()
    pos = p.recorded(dec.attrs["contextual_config"], dec.attrs["n_ctx"], model)  # as layer0_decomposition resolved them
    frm = pos.denominator_from
    df = cx.variance_table(dec, classes, list(pos.variance_positions), p.n_resamples, p.seed, frm, model)
    res = df[df["method"] == "resampled"]
    r, slope, _ = cx.loglog_fit_or_reason(res["predicted"], res["observed"])
    wt = df[df["method"] == "within_text"]
    r_within, slope_within, _ = cx.loglog_fit_or_reason(wt["predicted"], wt["observed"])
    write_table(df, out.table, {"n_resamples": p.n_resamples, "destination_token": p.destination_token,
                                "loglog_pearson_r": r, "loglog_slope": slope, "within_text_loglog_pearson_r": r_within,
                                "within_text_loglog_slope": slope_within, "denominator_from": frm,
                                "resampling": "keys 1..n-1 redrawn i.i.d. from the text's tokens at 1..n-1",
                                "within_text": "variance over n >= denominator_from of Z(n) along the text vs the "
                                "mean over those n of sum p^2 Var(c)"})
    variance_figure(df, dec.positions, dec.log_z_linear[0], classes, dec.texts["title"][0], r, slope,
                    f"K9 {model}: independent model of the softmax denominator", out.figure, frm)
    card = cx.variance_scorecard(df, frm, model, out.figure, out.table)
    write_table(scorecard_rows(card), out.scorecard)
    log.info("resampled: log-log r %.3f, slope %.3f over %d rows; within text: r %.3f, slope %.3f", r, slope,
             len(res), r_within, slope_within)


if __name__ == "__main__":  # a job of its own; a family job imports main (posmech.pipeline.runner)
    run(snakemake, main)  # noqa: F821
