"""Rule train_demo_model: train the offline-default model; write curve, figure, summary."""

from pathlib import Path

import pandas as pd

from posmech.io import atomic_path, read_jsonl, write_json
from posmech.models.training import train_demo_model
from posmech.plots import training_curve
from posmech.runner import run


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
        "held-out loss %.3f; best previous-token head %s (mean attention to previous position %.3f)",
        s["heldout_loss"], s["best_previous_token_head"], s["best_previous_token_score"],
    )


run(snakemake, main)  # noqa: F821
