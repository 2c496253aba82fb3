"""Rule checkpoint_model: a checkpoint its model's training saved, as a model of the run."""

from pathlib import Path

from posmech.models.training import install_checkpoint
from posmech.pipeline.runner import run


def main(smk, log):
    name, entry = smk.wildcards.model, smk.params.entry
    m = install_checkpoint(name, entry, smk.input.checkpoints, Path(smk.output.manifest).parent)
    log.info("model %s: checkpoint of %s after %d steps at %s, weights %s", name, entry["checkpoint_of"],
             entry["step"], m["hf_dir"], m["weights_sha256_16"])


if __name__ == "__main__":  # a job of its own; a family job imports main (posmech.pipeline.runner)
    run(snakemake, main)  # noqa: F821
