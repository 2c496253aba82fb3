"""Rule formation_order (S5): on a swept model, the step at which the sink forms over the step
at which the induction head forms, read from the dynamics table (posmech.verdicts.dynamics,
formation_order_rows)."""

from posmech.pipeline.runner import run
from posmech.store.tables import read_table, scorecard_rows, write_table
from posmech.verdicts.dynamics import formation_order_rows


def main(smk, log):
    model = smk.wildcards.model
    rows = formation_order_rows(read_table(smk.input.dynamics), dict(smk.params.formation), model,
                                artifact=str(smk.input.dynamics))
    write_table(scorecard_rows(rows), smk.output.scorecard)
    log.info("%s", "; ".join(f"{model}: {r['quantity']} = {r['value']} ({r['detail']})" for r in rows))


if __name__ == "__main__":  # a job of its own
    run(snakemake, main)  # noqa: F821
