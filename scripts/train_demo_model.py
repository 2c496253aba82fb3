"""Rule train_demo_model: train an offline demo model; write curve, figure, summary."""

from pathlib import Path

import pandas as pd

from posmech.core.io import atomic_path, read_jsonl, write_json
from posmech.models.training import train_demo_model
from posmech.plots import training_curve
from posmech.pipeline.runner import run


def main(smk, log):
    name = smk.wildcards.model
    docs = read_jsonl(smk.input.corpus)
    result = train_demo_model(docs, smk.params.entry["train"], Path(smk.output.manifest).parent, name)
    curve = pd.DataFrame(result["curve"]).assign(model=name)
    with atomic_path(smk.output.curve) as tmp:
        curve.to_csv(tmp, index=False)
    training_curve(curve, result["summary"], smk.output.figure)
    write_json(smk.output.summary, result["summary"])
    s = result["summary"]
    log.info(
        "held-out loss %.3f; previous-token head %s (%.3f), in layer >= 1 %s (%.3f); look-back-two head %s "
        "(%.3f); induction head %s (%.3f; %.3f with %s zeroed); P(correct) on repeated random characters "
        "%.3f (first copy %.3f); %.1f CPU s",
        s["heldout_loss"], s["best_previous_token_head"], s["best_previous_token_score"],
        s["best_previous_token_head_layer_ge_1"], s["best_previous_token_score_layer_ge_1"],
        s["best_look_back_two_head"], s["best_look_back_two_score"], s["best_induction_head"],
        s["best_induction_score"], s["induction_score_with_read_head_ablated"], s["induction_reads_head"],
        s["p_correct_repeated"], s["p_correct_first_copy"], s["train_cpu_seconds"],
    )


if __name__ == "__main__":  # a job of its own; a family job imports main (posmech.pipeline.runner)
    run(snakemake, main)  # noqa: F821
