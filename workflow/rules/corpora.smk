# Corpora: every configured corpus prepared into one JSON-lines file under resources/.


# Downloads need the internet of the login node; with profiles/slurm they run there.
localrules:
    prepare_corpus,


rule prepare_corpus:
    """Load a corpus (packaged KJV Bible, Hub dataset, or local copy), select documents."""
    output:
        jsonl="resources/corpora/{corpus}.jsonl",
    log:
        "logs/prepare_corpus/{corpus}.log",
    wildcard_constraints:
        corpus=regex(CORPORA),
    conda:
        "../envs/posmech.yaml"
    params:
        entry=corpus_entry,
    script:
        "../../scripts/prepare_corpus.py"


collect(rules.prepare_corpus, corpus=CORPORA)
