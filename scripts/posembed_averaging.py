"""Rule posembed_averaging: W_pos averaged in groups of k; held-out loss (P2) and the
repeat-string prompt probabilities (P3), the model restored bitwise after each k."""

from posmech.analyses.posembed import (averaging_scorecard, averaging_table, heldout_documents, max_unchanged_k,
                                  posembed_averaging, read_doc_index)
from posmech.data.prompts import load_prompts
from posmech.data.tokens import read_tokens
from posmech.core.io import file_sha256, read_jsonl
from posmech.models.loading import load_model, read_manifest
from posmech.plots.posembed import averaging_figure
from posmech.pipeline.runner import run
from posmech.store.tables import scorecard_rows, write_table


def main(smk, log):
    model, entry, p = smk.wildcards.model, smk.params.entry, smk.params.settings
    man = read_manifest(smk.input.manifest)
    corpus_index = [d["doc_index"] for d in read_jsonl(smk.input.corpus)]
    docs, how = heldout_documents(read_tokens(smk.input.tokens), read_doc_index(smk.input.tokens), corpus_index,
                                  man, p.corpus, p.n_documents)
    prompts = load_prompts(smk.input.prompts, list(p.prompt_ids))
    ks = sorted({1, *p.ks})
    bridge = load_model(man, entry["device"], entry["dtype"], entry["processing"], entry["engine"])
    df = posembed_averaging(bridge, ks, docs, prompts, entry["prepend_bos"])
    best = max_unchanged_k(df, p.loss_tolerance, p.probability_tolerance)
    averaging_table(df, model)
    meta = {"claim": "P2,P3", "model": model, "corpus": p.corpus, "documents": how, "n_documents": len(docs),
            "prompts": p.prompts, "prompts_sha256": file_sha256(smk.input.prompts), "max_unchanged_k": best,
            "loss_tolerance": p.loss_tolerance, "probability_tolerance": p.probability_tolerance}
    write_table(df, smk.output.table, meta)
    averaging_figure(df, model, smk.output.figure)
    targets = {pr.id: next(iter(pr.targets)) for pr in prompts}  # the string's first word: the expected continuation
    card = averaging_scorecard(df, best, targets, p.loss_tolerance, p.probability_tolerance, model,
                               smk.output.figure, smk.output.table)
    write_table(scorecard_rows(card), smk.output.scorecard)
    log.info("k grid %s on %d documents; largest unchanged k: %d", ks, len(docs), best)


if __name__ == "__main__":  # a job of its own; a family job imports main (posmech.pipeline.runner)
    run(snakemake, main)  # noqa: F821
