"""Rule denominator_variance (K9): predicted Var Z_h(n) = sum_i p_h(n, i)^2 Var(c) against
the variance observed over i.i.d. redraws of each text's tokens (positions fixed)."""

import pandas as pd

from posmech.analyses import contextual as cx
from posmech.plots.contextual import variance_figure
from posmech.runner import run
from posmech.tables import read_table, scorecard_rows, write_table


def main(smk, log):
    model, p, out = smk.wildcards.model, dict(smk.params.contextual), smk.output
    dec = cx.read_decomposition(smk.input.h5)
    classes = read_table(smk.input.classes)["head_class"].tolist()
    pos = cx.resolved_positions(p, int(dec.attrs["n_ctx"]), model)
    rows = []
    for j, t in dec.texts.iterrows():
        for n in pos["variance_positions"]:
            r = cx.variance_model(dec, dec.token_ids[j], n, p["n_resamples"], p["seed"] + 1000 * j + n)
            for h, c in enumerate(classes):
                rows.append({"claim": "K9", "model": model, "head_name": cx.head_name(0, h), "head": h,
                             "head_class": c, "text": t["title"], "corpus": t["corpus"], "n": n,
                             **{k: float(v[h]) for k, v in r.items()}})
    df = pd.DataFrame(rows)
    r, slope = cx.loglog_fit(df["predicted"], df["observed"])
    write_table(df, out.table, {"n_resamples": p["n_resamples"], "destination_token": p["destination_token"],
                                "loglog_pearson_r": r, "loglog_slope": slope,
                                "resampling": "keys 1..n-1 redrawn i.i.d. from the text's tokens at 1..n-1"})
    variance_figure(df, dec.positions, dec.log_z_linear[0], classes, dec.texts["title"][0], r, slope,
                    f"K9 {model}: independent model of the softmax denominator", out.figure, p["denominator_from"])
    rows = [{"claim": "K9", "quantity": "variance_model_fit", "value": round(r, 4),
             "detail": f"Pearson r of log10 observed vs log10 predicted Var Z over {len(df)} (text, n, head) rows; "
             f"slope {slope:.3f}", "artifact": out.figure},
            {"claim": "K9", "quantity": "variance_model_loglog_slope", "value": round(slope, 4),
             "detail": "least-squares slope of log10 observed on log10 predicted (1 = the model's scaling)",
             "artifact": out.table}]
    write_table(scorecard_rows([{**x, "model": model} for x in rows]), out.scorecard)
    log.info("log-log r %.3f, slope %.3f over %d rows", r, slope, len(df))


run(snakemake, main)  # noqa: F821
