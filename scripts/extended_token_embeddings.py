"""Rule extended_token_embeddings (C1): from layer0.h5 and the K7 classes, the extended
embedding of every token through the contextual heads (calibration denominators) and every
layer-0 MLP neuron's token-contribution vector, stored in extended_tokens.h5 (docs/artifacts.md)."""

from posmech.analyses import contextual as cx
from posmech.analyses import neurons as nr
from posmech.core.null import only_claims
from posmech.models.mlp_layouts import LayoutError
from posmech.models.loading import read_manifest
from posmech.pipeline.runner import run
from posmech.settings import positions_for
from posmech.store.tables import not_measurable_rows, read_table, scorecard_rows, write_table


def main(smk, log):
    model, s, out = smk.wildcards.model, smk.params.settings, smk.output
    man = read_manifest(smk.input.manifest)
    dec = cx.read_decomposition(smk.input.h5)
    # from_position resolved for the model's context (layer0.h5's n_ctx and last destination position),
    # once (null: scaled with it); extended_tokens.h5 records it (neurons_config), which the C rules take
    s = positions_for(s, int(dec.attrs["n_ctx"]), model, max_position=int(dec.positions[-1]))
    try:
        w, ov, _ = nr.load_weights(man, model, tokenizer=False, entry=smk.params.entry)
    except LayoutError as e:  # a block layout without the object (decided from the weights): not measurable
        why = f"contextual neurons: {e}"
    else:
        nr.check_neurons(s.neurons, ov.d_mlp, model)
        classes = read_table(smk.input.classes)
        why = nr.missing_heads(classes, s.heads, s.head_classes)
    if why:  # nothing a model lacks fails the run: an artifact saying why, C1 not measurable
        log.warning("%s", why)
        nr.write_not_measurable(out.h5, why, {"model": model, "model_source": man["source"],
                                              "resolved_revision": man["resolved_revision"], "neurons_config": s.as_dict()})
        write_table(not_measurable_rows("C1", model, why, nr.C1_QUANTITIES, out.h5), out.scorecard)
        return
    heads = nr.select_heads(classes, s.heads, s.head_classes, w.n_heads)
    cal = nr.calibration_index(dec, heads, s.calibration_text, s.from_position)
    text = dec.texts.iloc[cal]
    log.info("heads %s; calibration text %d (%s: %s)", heads, cal, text["corpus"], text["title"])
    # memo: each text's exact layer-0 residual computed once in this job (the neuron rules after it read it too)
    st, ln2 = nr.build_setup(dec, w, ov, heads, cal, s.from_position, s.reference_position, s.ln2_scale,
                             memo=nr.weights_key(man, model, smk.params.entry))
    attrs = {"model": model, "model_source": man["source"], "resolved_revision": man["resolved_revision"],
             "destination_token": dec.attrs["destination_token"], "calibration_index": cal,
             "calibration_corpus": text["corpus"], "calibration_title": text["title"],
             "calibration_doc_index": int(text["doc_index"]), "from_position": s.from_position,
             "ln2_scale_source": "config" if s.ln2_scale is not None else "median", "ln2_scale_summary": ln2,
             "neurons_config": s.as_dict()}
    vocabulary = not only_claims()  # a twin's null: no token's E' or TC, which no claim reads (twins.claims_only)
    info = nr.write_extended(st, nr.content_keys(dec), out.h5, attrs,
                             progress=lambda i, n: log.info("token-contribution vectors: %d of %d tokens", i, n),
                             vocabulary=vocabulary)
    if info["overflow"]:
        log.warning("a token contribution exceeds the float16 range (%g): stored as inf", info["max_abs"])
    card = nr.extended_scorecard(st, ln2, w.d_vocab, ov.d_model, ov.d_mlp, heads, s.from_position,
                                 text["title"], model, out.h5, vocabulary)
    write_table(scorecard_rows(card), out.scorecard)


if __name__ == "__main__":  # a job of its own; a family job imports main (posmech.pipeline.runner)
    run(snakemake, main)  # noqa: F821
