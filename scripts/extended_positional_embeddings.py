"""Rule extended_positional_embeddings: repeated-token prompts through the model; write the
token-averaged, position-centred residual stream at every layer (P8) and its agreement."""

from posmech.analyses import geometry as geo
from posmech.core.config import config_hash
from posmech.models.loading import load_model, read_manifest
from posmech.plots import geometry as plots
from posmech.pipeline.runner import run
from posmech.store.tables import scorecard_rows, write_table


def main(smk, log):
    model, entry, s = smk.wildcards.model, smk.params.entry, smk.params.settings
    man = read_manifest(smk.input.manifest)
    bridge = load_model(man, entry["device"], entry["dtype"], entry["processing"], entry["engine"])
    bos = entry["prepend_bos"] and s.bos == "model"
    acc, W_pos, tokens, info = geo.compute_extended(
        bridge, s.n_tokens, s.seed, s.batch_size, bos, entry["n_ctx"]
    )
    attrs = {**info, "model": model, "model_source": man["source"], "resolved_revision": man["resolved_revision"],
             "processing": entry["processing"], "bos_config": s.bos, "model_prepend_bos": entry["prepend_bos"],
             "config_hash": config_hash({"model": entry, "geometry": s.as_dict()})}
    geo.write_extended(smk.output.h5, acc, W_pos, tokens, geo.site_names(info["n_layers"]), attrs)
    ext = geo.read_extended_artifact(smk.output.h5)
    agree = geo.agreement_table(ext, model)
    meta = geo.table_meta(ext, ext.first_token_position, extended_centring=ext.attrs["centring"],
                          tokens_per_second=round(info["tokens_per_second"], 1))
    write_table(agree, smk.output.agreement, meta)
    plots.agreement(agree, f"P8 {model}: per-token extended embeddings vs their average", smk.output.figure)
    write_table(scorecard_rows(geo.extended_scorecard(agree, model, smk.output.agreement)), smk.output.scorecard)
    log.info("layer-0 identity max |diff| %.2e; %.0f tokens/s", agree["max_abs_diff_to_W_pos"].iloc[0],
             info["tokens_per_second"])


if __name__ == "__main__":  # a job of its own; a family job imports main (posmech.pipeline.runner)
    run(snakemake, main)  # noqa: F821
