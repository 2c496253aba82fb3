"""Rule findings: the verdict (holds / holds on null / fails / not measurable) of every
model-independent finding of resources/findings.yaml on every model of the run, read against
its random-init twin (results/report/findings.csv)."""

from posmech.verdicts.findings import counts, findings_table, load_findings
from posmech.pipeline.runner import run
from posmech.store.tables import write_table


def main(smk, log):
    findings = load_findings(smk.input.findings, smk.input.schema)
    table = findings_table(findings, dict(smk.params.thresholds), list(smk.input.scorecards), list(smk.params.models),
                           dict(smk.params.not_applicable), dict(smk.params.twins), str(smk.params.twin_weights))
    per_model = counts(table)
    write_table(table, smk.output.table, {"findings": "resources/findings.yaml", "thresholds": dict(smk.params.thresholds),
                                          "counts": per_model, "twin_weights": str(smk.params.twin_weights),
                                          # what each twin read (posmech.pipeline.sweep.twin_reads)
                                          "twin_reads": dict(smk.params.twin_reads)})
    for model, c in per_model.items():
        log.info("%s: %s", model, ", ".join(f"{v} {n}" for v, n in c.items()))
    for model in dict(smk.params.twins).values():
        o = table.loc[table["model"] == model, "origin"]
        log.info("%s against its twin: %d learned, %d holds on null, %d structural", model, (o == "learned").sum(),
                 (o == "on null").sum(), (o == "structural").sum())


if __name__ == "__main__":  # a job of its own; a family job imports main (posmech.pipeline.runner)
    run(snakemake, main)  # noqa: F821
