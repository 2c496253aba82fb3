"""Rule positional_kernels: every head's positional kernel from cached position-wise
means (p_i) and post-ln1 embeddings of Bible chapters (x_n); writes kernels.h5 (K1, K5)."""

import json
from pathlib import Path

from posmech.analyses import kernels as kn
from posmech.analyses.cache import read_position_means
from posmech.core.config import config_hash
from posmech.data.tokens import read_tokens
from posmech.store.hdf5 import attr_json, open_artifact
from posmech.models.loading import analysis_context, load_model, read_manifest
from posmech.pipeline.runner import run
from posmech.settings import positions_for


def main(smk, log):
    man, entry = read_manifest(smk.input.manifest), smk.params.entry
    # the query positions resolved for the model's context, once (null: scaled with it); kernels.h5
    # records them (kernels_config), and the K rules reading it take those (Settings.recorded)
    where = f"models.{smk.wildcards.model}.n_ctx" if entry.get("n_ctx") else f"{man['hf_dir']}/config.json"
    settings = positions_for(smk.params.settings, analysis_context(smk.wildcards.model, entry, man["hf_dir"]),
                             smk.wildcards.model, where)
    means, count = read_position_means(smk.input.means, "ln1_out")
    with open_artifact(smk.input.means) as f:
        cache_attrs = {k: attr_json(f, k) for k in ("processing", "weights_sha256_16", "corpus") if k in f.attrs}
    n_keys = max(*settings.etc_positions, settings.heatmap_max_position) + 1
    kn.check_means(count, n_keys, cache_attrs, entry["processing"], man.get("weights_sha256_16", "unknown"),
                   smk.input.means)
    tokens = read_tokens(smk.input.tokens)
    bridge = load_model(man, entry["device"], entry["dtype"], entry["processing"], entry["engine"])
    hf_config = json.loads((Path(man["hf_dir"]) / "config.json").read_text())
    attrs = {
        "model": smk.wildcards.model, "model_source": man["source"], "resolved_revision": man["resolved_revision"],
        "processing": entry["processing"], "means_corpus": settings.means_corpus, "means_file": smk.input.means,
        "query_corpus": settings.query_corpus, "kernels_config": settings.as_dict(),
        "config_hash": config_hash({"model": entry, "kernels": settings.as_dict()}),
    }
    s = kn.build_kernels(bridge, hf_config, means, count, tokens, settings, smk.output.h5, attrs)
    log.info("%d layers x %d heads, %d query positions, texts: %s", s["n_layers"], s["n_heads"], s["n_queries"],
             ", ".join(s["texts"]))


if __name__ == "__main__":  # a job of its own; a family job imports main (posmech.pipeline.runner)
    run(snakemake, main)  # noqa: F821
