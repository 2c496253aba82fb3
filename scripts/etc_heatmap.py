"""Rule etc_heatmap: log ETC over layers x heads, every configured model side by side (K4)."""

from posmech.analyses import kernels as kn
from posmech.plots import kernels as plots
from posmech.pipeline.runner import run
from posmech.store.tables import read_meta, read_table


def main(smk, log):
    # each model's n: the one its etc.csv classified at (kernels.etc_heatmap_position, null:
    # scaled with that model's context)
    ns = {m: int(read_meta(path)["classified_at_n"]) for m, path in zip(smk.params.models, smk.input.tables)}
    tables = {m: kn.types_at(read_table(path), ns[m]) for m, path in zip(smk.params.models, smk.input.tables)}
    plots.etc_heatmap(tables, ns, smk.output.figure)
    log.info("models: %s", ", ".join(tables))


if __name__ == "__main__":  # a job of its own; a family job imports main (posmech.pipeline.runner)
    run(snakemake, main)  # noqa: F821
