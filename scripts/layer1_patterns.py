"""Rule layer1_patterns (K10): layer-1 attention rows of every head on the pattern text at
n = max_position, against each head's positional kernel (K1's definition at that n)."""

import json
from pathlib import Path

import numpy as np

from posmech.analyses import kernels as kn
from posmech.analyses import contextual as cx
from posmech.analyses.cache import read_position_means
from posmech.models.loading import load_model, read_manifest
from posmech.plots import words_figure
from posmech.plots.contextual import layer1_figure
from posmech.pipeline.runner import run
from posmech.store.tables import not_measurable_rows, scorecard_rows, write_table


def main(smk, log):
    model, p, entry, out = smk.wildcards.model, smk.params.settings, smk.params.entry, smk.output
    dec = cx.read_decomposition(smk.input.h5)
    n, k0 = int(dec.attrs["max_position"]), int(smk.params.kernels.k0)
    man = read_manifest(smk.input.manifest)
    means, count = read_position_means(smk.input.means, "ln1_out")
    if means.shape[0] < 2:  # nothing a one-layer model lacks fails the run: empty table, K10 not measurable
        why = f"model {model!r} has one layer: K10 needs layer 1"
        log.warning("%s; writing an empty table", why)
        write_table(cx.layer1_table(np.zeros((0, n + 1)), np.zeros((0, n + 1)), n, k0, p.mostly_positional_max_tv,
                                    model), out.table, {"not_measurable": why})
        words_figure(f"K10 {model}", why, out.figure)
        write_table(not_measurable_rows("K10", model, why, cx.LAYER1_QUANTITIES, out.table), out.scorecard)
        return
    kn.check_means(count, n + 1, {}, entry["processing"], "unknown", smk.input.means)
    bridge = load_model(man, entry["device"], entry["dtype"], entry["processing"], entry["engine"])
    rows, x = cx.layer_rows(bridge, dec.token_ids[0], n, 1)
    w = kn.bridge_head_weights(bridge, json.loads((Path(man["hf_dir"]) / "config.json").read_text()))
    kernel = kn.layer_kernels(means[1], x[None, None], [n], w, 1, k0).mean[:, 0]
    df = cx.layer1_table(rows, kernel, n, k0, p.mostly_positional_max_tv, model)
    title = dec.texts["title"][0]
    write_table(df, out.table, {"text": title, "k0": k0, "means_corpus": smk.params.kernels.means_corpus,
                                "mostly_positional_max_tv": p.mostly_positional_max_tv})
    layer1_figure(rows, kernel, df, n, k0, f"K10 {model}: layer-1 attention rows on {title} at n = {n} "
                  "(grey: positional kernel)", out.figure)
    card = cx.layer1_scorecard(df, title, n, p.mostly_positional_max_tv, model, out.figure, out.table)
    write_table(scorecard_rows(card), out.scorecard)
    heads = card[1]["value"]
    log.info("mostly positional: %s", heads)


if __name__ == "__main__":  # a job of its own; a family job imports main (posmech.pipeline.runner)
    run(snakemake, main)  # noqa: F821
