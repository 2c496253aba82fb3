"""Rule rotary_frequencies: which rotary frequency pairs carry each head's q·k (P17, P18):
per-head, per-pair table, figure, scorecard."""

import numpy as np

from posmech.analyses import rotary as ro
from posmech.data.tokens import context_documents, read_tokens
from posmech.models.loading import load_model, read_manifest
from posmech.pipeline.runner import run
from posmech.plots.rotary import frequency_figure
from posmech.store.tables import scorecard_rows, write_table


def main(smk, log):
    model, entry, p = smk.wildcards.model, smk.params.entry, smk.params.settings
    tokens = read_tokens(smk.input.tokens)
    context = min(p.context, int(tokens.attrs.get("n_ctx") or p.context))
    docs, context, index = context_documents(tokens, p.n_documents, context, "rotary_frequencies")
    bridge = load_model(read_manifest(smk.input.manifest), entry["device"], entry["dtype"], entry["processing"], entry["engine"])
    fu = ro.frequency_usage(bridge, np.stack(docs), p.batch_size)
    rows = ro.frequency_scorecard(fu, model, p.band_fraction, p.min_previous_token_score, smk.output.figure)
    meta = {"claim": "P17, P18", "model": model, "corpus": p.corpus, "documents": index, "n_tokens": context,
            "band_fraction": p.band_fraction, "max_pattern_diff": fu.max_pattern_diff}
    write_table(ro.frequency_table(fu, model), smk.output.table, meta)
    band = ro.band_size(fu.n_pairs, p.band_fraction) if fu.n_pairs >= 2 else 0  # one pair: no bands
    frequency_figure(fu, model, band, f"{model}, {len(docs)} documents of "
                     f"{context} tokens ({p.corpus})", smk.output.figure)
    write_table(scorecard_rows(rows), smk.output.scorecard)
    log.info("%s", "; ".join(f"{r['claim']} {r['value']} ({r['detail']})" for r in rows))


if __name__ == "__main__":  # a job of its own
    run(snakemake, main)  # noqa: F821
