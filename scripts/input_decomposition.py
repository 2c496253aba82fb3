"""Rule input_decomposition (L2, L3, L5): scores and patterns of the previous-token and
look-back-two heads with position-only, token-only and both inputs."""

from posmech.analyses import attn_only as ao
from posmech.models.loading import load_model, read_manifest
from posmech.plots import attn_only as plots
from posmech.plots import words_figure
from posmech.pipeline.runner import run
from posmech.store.tables import scorecard_rows, write_table


def main(smk, log):
    model, entry, s = smk.wildcards.model, smk.params.entry, smk.params.settings
    man = read_manifest(smk.input.manifest)
    role_rows = ao.read_role_rows(smk.input.heads)
    roles = {r: row["head_name"] for r, row in role_rows.items()}
    missing = {r: ao.role_missing(r, row) for r, row in role_rows.items() if row["head_name"] == ao.NONE}
    bridge = load_model(man, entry["device"], entry["dtype"], entry["processing"], entry["engine"])
    setup = ao.prepare(bridge, s, model, entry)
    # a role no head fills is not measured (its rows say why); the other one still is
    used = {r: ao.parse_head(roles[r]) for r in ("previous", "look_back_two") if roles[r] != ao.NONE}
    rows = ao.input_decomposition(bridge, s, setup, used, progress=f"{model} L2/L3/L5") if used else []
    df = ao.decomposition_table(rows, model)
    bos = setup.bos is not None
    meta = {"claim": "L2,L3,L5", "model": model, "heads": roles, "query": s.query, "bos": bos, "scheme": setup.scheme,
            "resolved_revision": man["resolved_revision"], "processing": entry["processing"], "attn_only_config": s.as_dict()}
    write_table(df, smk.output.table, meta)
    o = smk.output
    if "previous" in missing:
        words_figure(f"L2 · {model}", missing["previous"], o.previous)
        words_figure(f"L3 · {model}", missing["previous"], o.position_only)
    else:
        plots.decomposition_curves(df, roles["previous"], "previous", "L2", s.query, model, bos, o.previous)
        if setup.scheme in ao.NO_POSITION_ONLY:
            words_figure(f"L3 · {model}", ao.NO_POSITION_ONLY[setup.scheme], o.position_only)
        else:
            plots.position_only_pattern(ao.mean_matrix(df, roles["previous"], "position_only", "pattern_mean"),
                                        roles["previous"], model, bos, o.position_only,
                                        ao.POSITION_ONLY_WORDS[setup.scheme])
    if "look_back_two" in missing:
        words_figure(f"L5 · {model}", missing["look_back_two"], o.look_back_two)
    else:
        plots.decomposition_curves(df, roles["look_back_two"], "look_back_two", "L5", s.query, model, bos,
                                   o.look_back_two)
    card = ao.decomposition_scorecard(df, roles, s, bos, model,
                                      {"L2": o.previous, "L3": o.position_only, "L5": o.look_back_two}, missing,
                                      setup.scheme)
    write_table(scorecard_rows(card), o.scorecard)
    log.info("%s", "; ".join(f"{r['claim']} {r['quantity']} {r['value']:.4g}" for r in card if r["value"] is not None))
    for role, why in missing.items():
        log.warning("%s: %s", role, why)


if __name__ == "__main__":  # a job of its own; a family job imports main (posmech.pipeline.runner)
    run(snakemake, main)  # noqa: F821
