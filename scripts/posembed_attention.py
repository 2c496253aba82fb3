"""Rule posembed_attention: the chosen heads' attention window on a document, intact vs
W_pos averaged in groups of k (P4): metrics table, patterns (HDF5), figure."""

import numpy as np

from posmech.analyses.taxonomy import read_chosen_heads
from posmech.analyses.posembed import attention_scorecard, attention_table, posembed_attention
from posmech.data.tokens import read_tokens
from posmech.store.hdf5 import artifact_writer, describe
from posmech.models.loading import load_model, read_manifest
from posmech.plots.posembed import attention_figure
from posmech.pipeline.runner import run
from posmech.store.tables import scorecard_rows, write_table


def main(smk, log):
    model, entry, p = smk.wildcards.model, smk.params.entry, smk.params.settings
    chosen = read_chosen_heads(smk.input.heads)
    heads = chosen["sharp"] + chosen["early"]
    tokens = read_tokens(smk.input.tokens)
    long_enough = np.flatnonzero(tokens.lengths() >= p.start + p.size)
    j = int(long_enough[p.document]) if p.document < len(long_enough) else int(np.argmax(tokens.lengths()))
    bridge = load_model(read_manifest(smk.input.manifest), entry["device"], entry["dtype"], entry["processing"], entry["engine"])
    df, panels, (start, size) = posembed_attention(bridge, tokens.doc(j), heads, p.start, p.size, p.k)
    attention_table(df, chosen, model)
    meta = {"claim": "P4", "model": model, "corpus": p.corpus, "document": j, "title": tokens.titles[j]}
    write_table(df, smk.output.table, meta)
    with artifact_writer(smk.output.patterns, "posembed_attention", "posembed_attention",
                         {**meta, "heads": heads, "k": p.k, "window_start": start, "window_size": size}) as f:
        for head, intact, averaged in panels:
            f.create_dataset(f"{head}/intact", data=intact)
            f.create_dataset(f"{head}/averaged", data=averaged)
            describe(f, {f"{head}/intact": f"[window, window] float64 {head}'s attention (query x key) on positions "
                                           f"{start}.. of the document, intact model",
                         f"{head}/averaged": f"[window, window] float64 the same with W_pos averaged in groups of {p.k}"})
    attention_figure(panels, start, p.k, model, smk.output.figure)
    write_table(scorecard_rows(attention_scorecard(df, p.k, start, size, model, smk.output.figure)),
                smk.output.scorecard)
    log.info("document %d, window %d+%d: %s", j, start, size,
             "; ".join(f"{r.head_name} cos {r.cosine_similarity:.3f}" for r in df.itertuples()))


if __name__ == "__main__":  # a job of its own; a family job imports main (posmech.pipeline.runner)
    run(snakemake, main)  # noqa: F821
