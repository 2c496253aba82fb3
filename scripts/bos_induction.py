"""Rule bos_induction (L4): P([B]) at the final [A] of [BOS] A B R1..R7 A vs A B R1..R7 A, and
the induction head's attention row at that query."""

from posmech.analyses import attn_only as ao
from posmech.models.loading import load_model, read_manifest
from posmech.plots import attn_only as plots
from posmech.pipeline.runner import run
from posmech.plots import write_not_measurable
from posmech.store.tables import scorecard_rows, write_table


def main(smk, log):
    model, entry, s = smk.wildcards.model, smk.params.entry, smk.params.settings
    man = read_manifest(smk.input.manifest)
    role = ao.read_role_rows(smk.input.heads)["induction"]
    head = role["head_name"]
    if head == ao.NONE:  # no induction head: L4 is not measurable, the run goes on
        why = ao.role_missing("induction", role)
        log.warning("%s", why)
        write_not_measurable("L4", model, why, ao.BOS_INDUCTION_QUANTITIES,
                             {smk.output.table: ["claim", "model", "layer", "head", "head_name", "condition",
                                                 "quantity", "key_label",
                                                 "key_position", "value", "sd", "n_samples"]},
                             smk.output.figure, smk.output.scorecard)
        return
    bridge = load_model(man, entry["device"], entry["dtype"], entry["processing"], entry["engine"])
    setup = ao.prepare(bridge, s, model, entry, need_bos=True)
    rows, _ = ao.bos_induction(bridge, s, setup, ao.parse_head(head), progress=f"{model} L4")
    layer, h = ao.parse_head(head)
    df = ao.claim_table("L4", model, rows, layer=layer, head=h, head_name=head)
    meta = {"claim": "L4", "model": model, "induction_head": head, "resolved_revision": man["resolved_revision"],
            "processing": entry["processing"], "attn_only_config": s.as_dict()}
    write_table(df, smk.output.table, meta)
    plots.bos_induction(df, head, model, smk.output.figure)
    card = ao.bos_induction_scorecard(rows, head, model, smk.output.figure)
    write_table(scorecard_rows(card), smk.output.scorecard)
    log.info("%s", "; ".join(f"{r['quantity']} {r['value']:.4g}" for r in card))


if __name__ == "__main__":  # a job of its own; a family job imports main (posmech.pipeline.runner)
    run(snakemake, main)  # noqa: F821
