"""Rule sinks, analysis attention_sinks (S1-S3): Gu et al.'s alpha[0] per sample, layer and
head on T-token samples, the sink ratio, the early layers' sink ratio and, on ALiBi models,
the first-token heads against their slopes; the residual stream's largest magnitudes (S4)."""

from posmech.analyses import sinks as sk
from posmech.data.tokens import read_tokens
from posmech.models.loading import load_model, read_manifest
from posmech.pipeline.runner import run
from posmech.plots import sinks as plots
from posmech.store.tables import scorecard_rows, write_table


def main(smk, log):
    model, entry, s, out = smk.wildcards.model, smk.params.entry, smk.params.settings, smk.output
    man = read_manifest(smk.input.manifest)
    tokens = read_tokens(smk.input.tokens)
    bridge = load_model(man, entry["device"], entry["dtype"], entry["processing"], entry["engine"])
    samples, T = sk.samples_of(tokens, s.n_samples, s.n_tokens, bridge.cfg.n_ctx)
    if len(samples) < s.n_samples:
        log.warning("sinks: only %d of %d documents of corpus %s have %d tokens; using them", len(samples),
                    s.n_samples, s.corpus, T)
    col = sk.run_sinks(bridge, samples, s.batch_size)
    positions, slopes = sk.positions_and_slopes(bridge.cfg)
    heads = sk.head_table(col.alpha0, model, s.epsilon, s.first_token_alpha, slopes)
    meta = {"claim": "S1,S2,S3", "model": model, "corpus": s.corpus, "n_samples": len(samples), "n_tokens": T,
            "epsilon": s.epsilon, "uniform_alpha0": sk.uniform_alpha0(T), "positions": positions,
            "prepend_bos": bool(tokens.attrs.get("prepend_bos", True)), "sinks_config": s.as_dict(),
            "resolved_revision": man["resolved_revision"], "processing": entry["processing"]}
    write_table(heads, out.table, meta)
    write_table(sk.activation_table(col.rows, model), out.activations, {**meta, "claim": "S4"})
    card = sk.sink_scorecard(col.alpha0, heads, model, s.epsilon, s.early_layers, positions, out.table, T)
    plots.sink_heads(heads, col.alpha_all.mean(0), card, f"S1-S3 {model}: alpha[0] per head (T = {T})", out.figure)
    write_table(scorecard_rows(card), out.scorecard)
    log.info("%s", "; ".join(f"{r['quantity']} {r['value']}" for r in card))


if __name__ == "__main__":  # a job of its own; a family job imports main (posmech.pipeline.runner)
    run(snakemake, main)  # noqa: F821
