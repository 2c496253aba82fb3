"""Rule tokenize: tokenize a corpus with a model's tokenizer, cut to its context, write HDF5."""

from posmech.core.config import config_hash
from posmech.data.tokens import tokenize_documents, unknown_tokens, write_tokens
from posmech.core.io import read_jsonl
from posmech.models.loading import analysis_context, load_tokenizer, read_manifest
from posmech.pipeline.runner import run


def main(smk, log):
    man = read_manifest(smk.input.manifest)
    model, corpus = smk.params.model, smk.params.corpus
    tok = load_tokenizer(man["hf_dir"])
    n_ctx = analysis_context(smk.wildcards.model, model, man["hf_dir"])
    docs = read_jsonl(smk.input.corpus)
    ids, kept = tokenize_documents(docs, tok, n_ctx, model["prepend_bos"], corpus["min_tokens"])
    n_unk, docs_unk = unknown_tokens(ids, tok)
    if n_unk:
        log.warning("%d characters/tokens in %d documents are outside the tokenizer's vocabulary: "
                    "each became the unknown token %r", n_unk, docs_unk, tok.unk_token)
    attrs = {
        "n_unknown_tokens": n_unk,
        "n_documents_with_unknown_tokens": docs_unk,
        "model": smk.wildcards.model,
        "model_source": man["source"],
        "resolved_revision": man["resolved_revision"],
        "corpus": smk.wildcards.corpus,
        "corpus_config": corpus,
        "config_hash": config_hash({"model": model, "corpus": corpus}),
        "n_ctx": n_ctx,
        "prepend_bos": model["prepend_bos"],
        "bos_token_id": tok.bos_token_id if tok.bos_token_id is not None else -1,
    }
    write_tokens(smk.output[0], ids, [docs[j] for j in kept], attrs)
    log.info("%d of %d documents, %d tokens (n_ctx %d), %d unknown", len(ids), len(docs), sum(map(len, ids)),
             n_ctx, n_unk)


if __name__ == "__main__":  # a job of its own; a family job imports main (posmech.pipeline.runner)
    run(snakemake, main)  # noqa: F821
