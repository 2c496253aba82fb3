"""Rule sinks, analysis massive_activations (S4): per layer, the median over samples of the
largest residual-stream magnitude over the median magnitude, its dimension and how often it is
on the first token (Sun et al. 2024), from attention_sinks' pass."""

from posmech.analyses import sinks as sk
from posmech.pipeline.runner import run
from posmech.plots import sinks as plots
from posmech.store.tables import read_table, scorecard_rows, write_table


def main(smk, log):
    model, out = smk.wildcards.model, smk.output
    acts = read_table(smk.input.activations)
    summary = sk.massive_summary(acts)
    meta = {"claim": "S4", "model": model, "n_samples": int(acts["sample"].nunique()),
            "n_tokens": acts.attrs.get("n_tokens"), "hook": "blocks.L.hook_resid_post"}
    write_table(summary, out.table, meta)
    plots.massive_activations(acts, summary, f"S4 {model}: largest |h| over median |h| per layer", out.figure)
    card = sk.massive_scorecard(summary, model, out.table)
    write_table(scorecard_rows(card), out.scorecard)
    log.info("%s", "; ".join(f"{r['quantity']} {r['value']}" for r in card))


if __name__ == "__main__":  # a job of its own; a family job imports main (posmech.pipeline.runner)
    run(snakemake, main)  # noqa: F821
