"""Rule build_twin: a model's random-init twin (posmech.models.twin) and its manifest."""

from pathlib import Path

from posmech.models.twin import build_twin
from posmech.pipeline.runner import run


def main(smk, log):
    name, entry = smk.wildcards.model, smk.params.entry
    m = build_twin(name, entry, smk.input.parent, Path(smk.output.manifest).parent)
    log.info("model %s: twin of %s (twins.weights %s, seed %d) at %s, weights %s", name, entry["twin_of"],
             m["twin_weights"], entry["seed"], m["hf_dir"], m["weights_sha256_16"])


if __name__ == "__main__":  # a job of its own; a family job imports main (posmech.pipeline.runner)
    run(snakemake, main)  # noqa: F821
