"""Rule cache_activations: one forward pass over a tokenized corpus, streamed to HDF5."""

from posmech.analyses.cache import cache_activations, load_capture
from posmech.core.config import config_hash
from posmech.data.tokens import read_tokens
from posmech.models.loading import read_manifest, weights_identity
from posmech.core.progress import Progress
from posmech.pipeline.runner import run


def main(smk, log):
    man = read_manifest(smk.input.manifest)
    model, corpus, settings = smk.params.model, smk.params.corpus, smk.params.settings
    tokens = read_tokens(smk.input.tokens)
    capture = load_capture(man, model["device"], model["dtype"], model["processing"], settings.engine)
    attrs = {
        "model": smk.wildcards.model,
        "model_source": man["source"],
        "resolved_revision": man["resolved_revision"],
        "weights_sha256_16": man.get("weights_sha256_16", "unknown"),
        # the full sha256 of every weights file (verified at load): part of the fingerprint
        "weights_hash": weights_identity(man),
        "processing": model["processing"],
        "model_dtype": model["dtype"],
        "device": str(capture.device),
        "corpus": smk.wildcards.corpus,
        "corpus_config": corpus,
        "cache_config": settings.as_dict(),
        "config_hash": config_hash({"model": model, "corpus": corpus, "cache": settings.as_dict()}),
        "tokens_config_hash": tokens.attrs.get("config_hash", "unknown"),
        "prepend_bos": bool(tokens.attrs.get("prepend_bos", True)),
    }
    progress = Progress(None, "documents")

    def report(done, n):
        progress.total = n
        progress.update(done)

    s = cache_activations(capture, tokens, smk.output[0], settings, attrs, progress=report, keep=True)
    log.info("cached %d documents, %d tokens (resumed after %d documents), %.0f tokens/s",
             s["n_documents"], s["n_tokens"], s["resumed_from"], s["tokens_per_second"])


if __name__ == "__main__":  # a job of its own; a family job imports main (posmech.pipeline.runner)
    run(snakemake, main)  # noqa: F821
