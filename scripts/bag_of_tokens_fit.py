"""Rule bag_of_tokens_fit (C3): the bag-of-tokens approximation of the configured neurons'
pre-activations along layer0.h5's texts against the real blocks.0.mlp.hook_pre (one forward
pass per text through the model); Pearson r, FVU, sign agreement, RMSE per neuron and text."""

from posmech.analyses import contextual as cx
from posmech.analyses import neurons as nr
from posmech.models.loading import load_model, read_manifest
from posmech.plots.neurons import fit_figure
from posmech.pipeline.runner import run
from posmech.plots import write_not_measurable
from posmech.store.tables import read_table, scorecard_rows, write_table


def main(smk, log):
    model, s, entry, out = smk.wildcards.model, smk.params.settings, smk.params.entry, smk.output
    man = read_manifest(smk.input.manifest)
    why = nr.not_measurable(smk.input.extended)
    if why:  # no head for the bag of tokens (rule extended_token_embeddings): C3 is not measurable
        log.warning("%s", why)
        write_not_measurable("C3", model, why, nr.C3_QUANTITIES,
                             {out.table: ["claim", "model", "neuron", "text", "corpus", "title", "n_positions",
                                          "pearson_r", "fvu", "sign_agreement", "rmse"]}, out.figure, out.scorecard)
        return
    bridge = load_model(man, entry["device"], entry["dtype"], entry["processing"], entry["engine"])
    w, ov, _ = nr.load_weights(man, model, tokenizer=False, entry=entry, model=bridge)
    dec = cx.read_decomposition(smk.input.h5)
    s = s.recorded(nr.read_extended_attrs(smk.input.extended)["neurons_config"])  # as extended_token_embeddings resolved it
    # per text, the bag-of-tokens sums computed once in this job (contextual_neurons computed them: nr.memoised)
    st = nr.setup_from_artifact(smk.input.extended, dec, w, ov, nr.weights_key(man, model, entry))
    neurons = nr.resolve_neurons(s.neurons, read_table(smk.input.ranking), s.n_auto, ov.d_mlp, model)
    n0 = s.from_position
    df, traces = nr.fit_table(bridge, st, nr.content_keys(dec), dec, neurons, n0, s.ln2, model, log)
    write_table(df, out.table, {"positions": f"n >= {n0}", "ln2": s.ln2, "heads": [int(h) for h in st.heads],
                                "pearson_r": "Pearson correlation of real and approximate pre-activation along the text",
                                "fvu": "sum (a - a_hat)^2 / sum (a - mean a)^2",
                                "sign_agreement": "fraction of positions where sign(a) = sign(a_hat)",
                                "rmse": "root mean square of a - a_hat"})
    fit_figure(traces, f"C3 {model}: {ov.hook}{' (the gate)' if ov.gated else ''}, actual vs bag-of-tokens approximation "
               f"(LN2 {s.ln2}; shaded: n < {n0}, not scored)", out.figure, n0)
    write_table(scorecard_rows(nr.fit_scorecard(df, n0, model, out.table)), out.scorecard)
    med = df.groupby("neuron")["pearson_r"].median()
    log.info("median r per neuron %s", med.to_dict())


if __name__ == "__main__":  # a job of its own; a family job imports main (posmech.pipeline.runner)
    run(snakemake, main)  # noqa: F821
