"""Rule head_table: results/{model}/heads.csv, every head's roles from the per-head tables
of the analyses the model is in (posmech.verdicts.heads)."""

from posmech.core.failures import failure_of
from posmech.verdicts.heads import head_table
from posmech.pipeline.runner import run
from posmech.store.tables import read_meta, read_table, write_table


def main(smk, log):
    model = smk.wildcards.model
    # a failed analysis's table (a failure record, posmech.core.failures) adds no column
    tables = {k: read_table(v) for k, v in smk.input.items() if k in ("taxonomy", "chosen", "taxa", "etc", "classes",
                                                                     "roles", "masses", "sinks") and failure_of(v) is None}
    # the n of the kernel types: the one etc.csv classified at (kernels.etc_heatmap_position,
    # null: scaled with the model's context)
    n = int(read_meta(smk.input.etc)["classified_at_n"]) if "etc" in tables else smk.params.n
    df = head_table(model, n=n, **tables)
    write_table(df, smk.output.table, {"model": model, "sources": sorted(tables), "etc_position": n})
    log.info("%d heads from %s", len(df), ", ".join(sorted(tables)))


if __name__ == "__main__":  # a job of its own; a family job imports main (posmech.pipeline.runner)
    run(snakemake, main)  # noqa: F821
