"""Rule contextual_neurons (C2): every layer-0 MLP neuron ranked by the variance of its real
pre-activation explained by the contextual term, over layer0.h5's texts; the top and bottom
contributing tokens (occurring in the contextual corpora) of the configured neurons."""

import pandas as pd

from posmech.analyses import contextual as cx
from posmech.analyses import neurons as nr
from posmech.data.tokens import read_tokens
from posmech.models.loading import read_manifest
from posmech.plots.neurons import contributions_figure
from posmech.pipeline.runner import run
from posmech.plots import write_not_measurable
from posmech.store.tables import scorecard_rows, write_table

#: the columns of the top/bottom tokens table (nr.top_tokens)
TOP_TOKEN_COLUMNS = ["claim", "model", "neuron", "side", "rank", "token_id", "token", "contribution", "corpus_count"]


def main(smk, log):
    model, s, out = smk.wildcards.model, smk.params.settings, smk.output
    corpora = list(smk.params.contextual.corpora)  # resolved: the pattern corpus first
    why = nr.not_measurable(smk.input.extended)
    if why:  # no head for the bag of tokens (rule extended_token_embeddings): C2 is not measurable
        log.warning("%s", why)
        write_not_measurable("C2", model, why, nr.C2_QUANTITIES,
                             {out.table: TOP_TOKEN_COLUMNS,
                              out.ranking: ["claim", "model", "neuron", "explained", "rank"]}, out.figure, out.scorecard)
        return
    man = read_manifest(smk.input.manifest)
    w, ov, tok = nr.load_weights(man, model, entry=smk.params.entry)
    memo = nr.weights_key(man, model, smk.params.entry)  # per text: computed once in this job (nr.memoised)
    dec = cx.read_decomposition(smk.input.h5)
    s = s.recorded(nr.read_extended_attrs(smk.input.extended)["neurons_config"])  # as extended_token_embeddings resolved it
    st = nr.setup_from_artifact(smk.input.extended, dec, w, ov, memo)
    real, context, keys = [], [], nr.content_keys(dec)
    for j, ids in enumerate(dec.token_ids):
        real.append(nr.hook_pre(w, ov, ids, memo))
        context.append(nr.approximate(st, keys, ids)["context"])
        log.info("ranking: text %d of %d", j + 1, len(dec.token_ids))
    ranking = nr.neuron_ranking(real, context, model, s.from_position)
    neurons = nr.resolve_neurons(s.neurons, ranking, s.n_auto, ov.d_mlp, model)
    # a twin's null: no token contribution (extended_token_embeddings computed none, no claim reads them),
    # so no top/bottom tokens and no figure (config twins.claims_only); the ranking, C2's claim, in full
    vocabulary = nr.read_extended_attrs(smk.input.extended).get("vocabulary", "every token") == "every token"
    if vocabulary:
        counts = nr.token_counts([read_tokens(smk.input[c]) for c in corpora], w.d_vocab)
        tc = nr.read_contributions(smk.input.extended, neurons)
        df = nr.top_tokens(tc, counts, neurons, s.n_tokens, s.min_token_count, lambda t: tok.decode([t]), model)
    else:
        df = pd.DataFrame(columns=TOP_TOKEN_COLUMNS)
    meta = {"neurons": neurons, "chosen": "config" if s.neurons else f"the {s.n_auto} best ranked",
            "corpora": corpora, "min_token_count": s.min_token_count,
            "contribution": "token-contribution vector TC_j(x) (extended_tokens.h5 `contributions`)"
            if vocabulary else f"none: the token contributions are {nr.NO_VOCABULARY}"}
    write_table(df, out.table, meta)
    write_table(ranking, out.ranking, {"explained": f"1 - Var(a - t) / Var(a): a = real {ov.hook}{' (the gate)' if ov.gated else ''}, "
                                       "t = contextual term, pooled over positions n >= "
                                       f"{s.from_position} of {len(dec.token_ids)} layer0.h5 texts"})
    if vocabulary:
        contributions_figure(df, ranking, f"C2 {model}: top and bottom token contributions (tokens in "
                             f"{', '.join(corpora)})", out.figure)
    M = len(ranking)
    pct = {int(j): 100.0 * int(ranking.loc[ranking["neuron"] == j, "rank"].iloc[0]) / M for j in neurons}
    card = nr.contextual_scorecard(df, ranking, neurons, model, out.table, out.ranking, vocabulary)
    write_table(scorecard_rows(card), out.scorecard)
    log.info("neurons %s rank percent %s", neurons, pct)


if __name__ == "__main__":  # a job of its own; a family job imports main (posmech.pipeline.runner)
    run(snakemake, main)  # noqa: F821
