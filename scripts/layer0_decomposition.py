"""Rule layer0_decomposition: measure blocks.0.ln1.hook_scale, split every layer-0 score
into positional + content parts and store the factors and every text's softmax
denominators (linear and exact LayerNorm) in layer0.h5 (K6-K9, read by C1-C3)."""

from posmech.analyses import contextual as cx
from posmech.core.config import config_hash
from posmech.data.tokens import read_tokens
from posmech.models.loading import read_manifest
from posmech.plots.contextual import ln_scale_figure
from posmech.pipeline.runner import run
from posmech.settings import positions_for
from posmech.store.tables import scorecard_rows, write_table


def main(smk, log):
    model, p, out = smk.wildcards.model, smk.params.settings, smk.output
    man = read_manifest(smk.input.manifest)
    w, tokenizer = cx.load_weights(man, model, entry=smk.params.entry)
    # the positions resolved for the model's context, once (null: scaled with it); layer0.h5 records the
    # section as configured (contextual_config) and that context (n_ctx): its readers get the same values
    pos = positions_for(p, w.n_ctx, model)
    dest = cx.single_token(tokenizer, p.destination_token, "contextual.destination_token")
    texts = cx.choose_texts({c: read_tokens(smk.input[c]) for c in p.corpora}, p.n_per_corpus,
                            pos.max_position + 1, p.seed, "contextual.max_position")
    log.info("%d texts: %s", len(texts), "; ".join(f"{t['corpus']}:{t['title']}" for t in texts))
    attrs = {"model": model, "model_source": man["source"], "resolved_revision": man["resolved_revision"],
             "scale_corpus": p.scale_corpus, "contextual_config": p.as_dict(),
             "config_hash": config_hash({"model": smk.params.entry, "contextual": p.as_dict()})}
    s = cx.build_decomposition(w, dest, p.destination_token, read_tokens(smk.input[p.scale_corpus]), texts,
                               pos.max_position, p.ln_scale, out.h5, attrs,
                               lambda i, n: log.info("denominators: text %d of %d", i, n))
    dec = cx.read_decomposition(out.h5)
    ln_scale_figure(dec.ln_scale, s["ln_scale_used"], model, p.scale_corpus, out.figure)
    card = cx.decomposition_scorecard(s, dec.ln_scale["n_tokens"], p.scale_corpus, p.destination_token, model,
                                      out.figure, out.h5)
    write_table(scorecard_rows(card), out.scorecard)
    log.info("LN scale used %.4f; median TV(linear, exact) %.4g", s["ln_scale_used"], s["tv_median"])


if __name__ == "__main__":  # a job of its own; a family job imports main (posmech.pipeline.runner)
    run(snakemake, main)  # noqa: F821
