"""Rule input_decomposition (L2, L3, L5): scores and patterns of the previous-token and
look-back-two heads with position-only, token-only and both inputs."""

import pandas as pd

from posmech.analyses import attn_only as ao
from posmech.models.loading import load_model, read_manifest
from posmech.plots import attn_only as plots
from posmech.runner import run
from posmech.tables import scorecard_rows, write_table


def main(smk, log):
    model, entry, p = smk.wildcards.model, smk.params.entry, dict(smk.params.cfg)
    man = read_manifest(smk.input.manifest)
    roles = ao.read_roles(smk.input.heads)
    bridge = load_model(man, entry["device"], entry["dtype"], entry["processing"], entry["engine"])
    setup = ao.prepare(bridge, p, model, entry)
    used = {r: ao.parse_head(roles[r]) for r in ("previous", "look_back_two")}
    rows = ao.input_decomposition(bridge, p, setup, used, progress=f"{model} L2/L3/L5")
    df = pd.DataFrame([{"model": model, **r} for r in rows])
    df.insert(1, "model", df.pop("model"))
    bos = setup.bos is not None
    meta = {"claim": "L2,L3,L5", "model": model, "heads": roles, "query": p["query"], "bos": bos,
            "resolved_revision": man["resolved_revision"], "processing": entry["processing"], "attn_only_config": p}
    write_table(df, smk.output.table, meta)
    o = smk.output
    plots.decomposition_curves(df, roles["previous"], "previous", "L2", p["query"], model, bos, o.previous)
    plots.decomposition_curves(df, roles["look_back_two"], "look_back_two", "L5", p["query"], model, bos, o.look_back_two)
    plots.position_only_pattern(ao.mean_matrix(df, roles["previous"], "position_only", "pattern_mean"),
                                roles["previous"], model, bos, o.position_only)
    card = ao.decomposition_scorecard(df, roles, p, bos, model,
                                      {"L2": o.previous, "L3": o.position_only, "L5": o.look_back_two})
    write_table(scorecard_rows(card), o.scorecard)
    log.info("%s", "; ".join(f"{r['claim']} {r['quantity']} {r['value']:.4g}" for r in card))


run(snakemake, main)  # noqa: F821
