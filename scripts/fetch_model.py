"""Rule fetch_model: snapshot a Hub model or validate a local directory; write its manifest."""

from pathlib import Path

from posmech.core.config import model_kind
from posmech.models.architecture import Architecture
from posmech.models.loading import engine_words, fetch_hub_model, prepare_local_model, read_manifest
from posmech.pipeline.runner import run


def main(smk, log):
    name, entry = smk.wildcards.model, smk.params.entry
    out_dir = Path(smk.output.manifest).parent
    if model_kind(entry) == "local":
        m = prepare_local_model(name, entry, out_dir)
    else:
        log.info("downloading %s (revision %s) from the Hugging Face Hub", entry["source"], entry["revision"])
        m = fetch_hub_model(name, entry, out_dir)
    log.info("model %s: %s at %s (revision %s)", name, m["kind"], m["hf_dir"], m["resolved_revision"])
    # what the analyses will run it as (the manifest's architecture, read from config, weights and code)
    if m.get("architecture"):
        arch = Architecture.from_dict(m["architecture"])
        log.info("architecture of %s: %s; read from %s", name, arch.layout_words,
                 "; ".join(f"{k}: {v}" for k, v in arch.sources.items()))
    # its analyses' own logs name the engine they ran on (their processing; `engine: bridge` if set)
    # (read back: a Hub model's hf_dir is relative to its manifest's directory)
    log.info("forward engine for its analyses, with engine auto: %s",
             engine_words(read_manifest(smk.output.manifest, verify=False)))


if __name__ == "__main__":  # a job of its own; a family job imports main (posmech.pipeline.runner)
    run(snakemake, main)  # noqa: F821
