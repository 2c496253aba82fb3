# Corpora: every configured corpus prepared into one JSON-lines file under resources/.


# Downloads need the internet of the login node; with profiles/slurm they run there.
localrules:
    prepare_corpus,


rule prepare_corpus:
    """Load a corpus (packaged KJV Bible, Hub dataset, or local copy), select documents."""
    output:
        "resources/corpora/{corpus}.jsonl",
    params:
        entry=corpus_entry,
    log:
        "logs/prepare_corpus/{corpus}.log",
    wildcard_constraints:
        corpus=regex(CORPORA),
    script:
        "../../scripts/prepare_corpus.py"
