"""Rule attention_statistics: one forward pass over the web-text documents for the diagonal
taxonomy (P6, P7) and, for the anatomy models, the score taxa (P13); a document both
sections use runs once (posmech.analyses.taxonomy.statistics)."""

from posmech.analyses.taxonomy import statistics as st
from posmech.analyses.anatomy import long_documents
from posmech.analyses.taxonomy import full_context_documents
from posmech.data.tokens import read_tokens
from posmech.models.loading import load_model, read_manifest
from posmech.pipeline.runner import run


def main(smk, log):
    model, entry, t, a = smk.wildcards.model, smk.params.entry, smk.params.settings, smk.params.anatomy
    man = read_manifest(smk.input.manifest)
    tokens = read_tokens(smk.input.tokens)
    docs_t, ctx_t = full_context_documents(tokens, t.n_documents, t.context)
    if len(docs_t) < t.n_documents:
        log.warning("taxonomy: only %d of %d documents of corpus %s have %d tokens; using them", len(docs_t),
                    t.n_documents, t.corpus, ctx_t)
    docs_a, opts, ctx_a = None, None, None
    if a is not None:
        if smk.input.anatomy_tokens != smk.input.tokens:  # the same corpus (the default): read once
            tokens = read_tokens(smk.input.anatomy_tokens)
        docs_a, ctx_a, _ = long_documents(tokens, a.n_documents, a.context)
        if len(docs_a) < a.n_documents:
            log.warning("anatomy: only %d of %d documents have %d tokens; using them", len(docs_a), a.n_documents,
                        ctx_a)
        opts = st.ProfileOptions.of(a)
    bridge = load_model(man, entry["device"], entry["dtype"], entry["processing"], entry["engine"])
    stats, profiles, shared = st.attention_statistics(bridge, docs_t, t.batch_size, t.exclude_first_query,
                                                      docs_a, opts)
    attrs = {"model": model, "taxonomy_corpus": t.corpus, "taxonomy_context": ctx_t,
             "exclude_first_query": t.exclude_first_query, "n_shared_documents": shared,
             "anatomy_corpus": None if a is None else a.corpus, "anatomy_context": ctx_a,
             "rows_per_document": None if a is None else a.rows_per_document,
             "first_query": None if a is None else a.first_query,
             "resolved_revision": man["resolved_revision"], "processing": entry["processing"]}
    st.write_statistics(smk.output.h5, stats, profiles, attrs)
    log.info("%d taxonomy documents%s; %d run once for both", stats.n_documents,
             "" if profiles is None else f", {profiles.n_documents} anatomy documents", shared)


if __name__ == "__main__":  # a job of its own; a family job imports main (posmech.pipeline.runner)
    run(snakemake, main)  # noqa: F821
