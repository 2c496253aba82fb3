"""Rule etc_heatmap: log ETC over layers x heads, every configured model side by side (K4)."""

from posmech.analyses import kernels as kn
from posmech.plots import kernels as plots
from posmech.runner import run
from posmech.tables import read_table


def main(smk, log):
    n = smk.params.kernels["etc_heatmap_position"]
    tables = {m: kn.types_at(read_table(path), n) for m, path in zip(smk.params.models, smk.input.tables)}
    plots.etc_heatmap(tables, {m: n for m in tables}, smk.output.figure)
    log.info("models: %s", ", ".join(tables))


run(snakemake, main)  # noqa: F821
