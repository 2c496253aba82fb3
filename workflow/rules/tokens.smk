# Tokenize every (model, corpus) pair with the model's tokenizer, cut to its context.


# Cheap (seconds per thousand documents): runs locally also with profiles/slurm.
localrules:
    tokenize,


rule tokenize:
    """Token ids, document ids and positions of a corpus for a model, in HDF5."""
    input:
        corpus=rules.prepare_corpus.output.jsonl,
        manifest=rules.fetch_model.output.manifest,
    output:
        h5="results/{model}/tokens/{corpus}.h5",
    log:
        "logs/tokenize/{model}/{corpus}.log",
    wildcard_constraints:
        # a figureless model tokenizes in its point's job (dynamics.smk)
        model=regex([m for m in MODELS if m not in BUILT_IN_POINTS["tokenize"]]),
        corpus=regex(CORPORA),
    conda:
        "../envs/posmech.yaml"
    params:
        model=tokens_entry,
        corpus=corpus_entry,
    script:
        "../../scripts/tokenize.py"


collect(
    rules.tokenize,
    model=tokenized_models(),
    corpus=selected(config, "tokenize", "corpora"),
)
