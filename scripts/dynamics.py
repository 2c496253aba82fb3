"""Rule dynamics: the followed quantities of every sweep point (posmech.verdicts.dynamics),
results/report/dynamics.csv and its figure."""

from posmech.verdicts.dynamics import dynamics_table, read_heads
from posmech.verdicts.findings import findings_table, load_findings
from posmech.plots.dynamics import dynamics_figure
from posmech.pipeline.runner import run
from posmech.store.tables import write_table


def main(smk, log):
    points = list(smk.params.points)
    findings = findings_table(load_findings(smk.input.findings, smk.input.schema), dict(smk.params.thresholds),
                              list(smk.input.scorecards), [p["checkpoint"] for p in points],
                              dict(smk.params.not_applicable), twins=None)  # plain verdicts: no null
    heads = read_heads(list(smk.input.heads))
    table = dynamics_table(points, findings, list(smk.params.claims), list(smk.params.heads), heads)
    write_table(table, smk.output.table, {"definitions": "posmech.verdicts.dynamics (module docstring)",
                                          "claims": list(smk.params.claims), "heads": list(smk.params.heads),
                                          "formation": [[k, list(v)] for k, v in dict(smk.params.formation).items()],  # in order
                                          "thresholds": dict(smk.params.thresholds)})
    dynamics_figure(table, smk.output.figure)
    for model, g in table.groupby("model", sort=False):
        log.info("%s: %d checkpoints, %d rows", model, g["checkpoint"].nunique(), len(g))


if __name__ == "__main__":  # a job of its own; a family job imports main (posmech.pipeline.runner)
    run(snakemake, main)  # noqa: F821
