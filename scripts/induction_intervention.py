"""Rule induction_intervention (P16): on a repeat prompt, redirect the sharp head's attention
and scale its output; probabilities of the original and the redirected continuation."""

import yaml

from posmech.analyses import interventions as iv
from posmech.analyses.attention import head_columns
from posmech.analyses.taxonomy import read_chosen_heads
from posmech.core.null import only_claims
from posmech.models.loading import load_model, read_manifest
from posmech.plots import interventions as plots
from posmech.pipeline.runner import run
from posmech.store.tables import scorecard_rows, write_table


def main(smk, log):
    model, entry, s = smk.wildcards.model, smk.params.entry, smk.params.settings
    cfg = s.induction_intervention
    man = read_manifest(smk.input.manifest)
    bridge = load_model(man, entry["device"], entry["dtype"], entry["processing"], entry["engine"])
    heads = read_chosen_heads(smk.input.heads)
    sharp = heads["sharp"][0]
    with open(smk.input.prompt, encoding="utf-8") as f:
        spec = yaml.safe_load(f)
    bos = bridge.tokenizer.bos_token_id if entry["prepend_bos"] else None
    prompt = iv.build_induction_prompt(spec, bridge.tokenizer, bos, int(bridge.cfg.n_ctx), smk.input.prompt)
    # a twin's null computes only the condition P16's claim reads (config twins.claims_only)
    conditions = iv.CLAIMED_CONDITIONS if only_claims() else iv.INDUCTION_CONDITIONS
    with iv.unchanged(bridge):
        rows, pats = iv.induction_intervention(bridge, prompt, sharp, cfg.output_scale, conditions)
    params = {**head_columns(sharp), "output_scale": cfg.output_scale, "prompt_file": cfg.prompt,
              "redirects": [f"{q}->{k}" for q, k in prompt.redirects.items()], "n_prompt_tokens": len(prompt.tokens)}
    df = iv.tidy(rows, "P16", model, params)
    meta = {"words": spec["words"], "positions": prompt.positions, "redirect": spec["redirect"],
            "targets_tokens": prompt.targets, "dropped_variants": prompt.dropped,
            # the conditions computed (a twin's null: only its claim's, config twins.claims_only)
            "conditions": list(conditions)}
    write_table(df, smk.output.table, iv.table_meta(man, entry, s, heads, **meta))
    a, b = prompt.positions["before_a"][0], prompt.positions["c"][1] + 1
    labels = [bridge.tokenizer.decode([int(t)]).replace(" ", "␣") for t in prompt.tokens[a:b]]
    if not only_claims():  # a twin's null draws no figure
        plots.induction_bars(df, pats, (a, b), labels, model, sharp, cfg.output_scale, smk.output.figure)
    redirected = str(spec["words"]["c"]).strip().lower()  # the word the redirect makes the model predict
    write_table(scorecard_rows(iv.induction_scorecard(df, model, smk.output.figure, redirected)), smk.output.scorecard)
    log.info("%s", df[["condition", "target", "probability"]].to_string(index=False))


if __name__ == "__main__":  # a job of its own; a family job imports main (posmech.pipeline.runner)
    run(snakemake, main)  # noqa: F821
