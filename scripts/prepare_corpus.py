"""Rule prepare_corpus: load and select a corpus, write it as JSON lines."""

from posmech.data.corpora import load_corpus
from posmech.core.io import write_jsonl
from posmech.pipeline.runner import run


def main(smk, log):
    docs = load_corpus(smk.params.entry, smk.wildcards.corpus)
    n = write_jsonl(smk.output[0], docs)
    log.info("wrote %d documents to %s", n, smk.output[0])


if __name__ == "__main__":  # a job of its own; a family job imports main (posmech.pipeline.runner)
    run(snakemake, main)  # noqa: F821
