"""Rule random_token_patterns (L1): mean attention of every head over random-token sequences,
offset masses, and the head roles (previous-token, look-back-two, induction) the other L rules read."""

from posmech.analyses import attn_only as ao
from posmech.models.loading import load_model, read_manifest
from posmech.plots import attn_only as plots
from posmech.pipeline.runner import run
from posmech.store.tables import scorecard_rows, write_table


def main(smk, log):
    model, entry, s = smk.wildcards.model, smk.params.entry, smk.params.settings
    man = read_manifest(smk.input.manifest)
    bridge = load_model(man, entry["device"], entry["dtype"], entry["processing"], entry["engine"])
    setup = ao.prepare(bridge, s, model, entry)
    out = ao.random_token_patterns(bridge, s, setup, progress=f"{model} L1")
    meta = {"claim": "L1", "model": model, "resolved_revision": man["resolved_revision"],
            "processing": entry["processing"], "bos": setup.bos is not None, "attn_only_config": s.as_dict()}
    write_table(ao.claim_table("L1", model, out["patterns"]), smk.output.table, meta)
    write_table(ao.claim_table("L1", model, out["masses"]), smk.output.masses, meta)
    write_table(ao.roles_frame(model, out["roles"]), smk.output.heads, meta)
    # the figure draws each role's best candidate, marked when it is below the role's threshold
    cand = {r["role"]: r["candidate"] for r in out["roles"]}
    roles = {r["role"]: r["head_name"] if r["head_name"] != ao.NONE else f"{r['candidate']} (none: below threshold)"
             for r in out["roles"]}
    shown = {r: cand[r] for r in ("previous", "look_back_two")}
    idx = {r: setup.heads.index(ao.parse_head(h)) for r, h in shown.items()}
    masses = {r: {m["mass"]: m["value"] for m in out["masses"] if m["head_name"] == h} for r, h in shown.items()}
    plots.random_token_patterns({r: out["mean"][i] for r, i in idx.items()}, {r: roles[r] for r in shown}, masses, model,
                                s.n_sequences, setup.bos is not None, smk.output.figure)
    card = ao.random_token_scorecard(out, s, setup, model, smk.output.figure)
    write_table(scorecard_rows(card), smk.output.scorecard)
    log.info("roles: %s", "; ".join(f"{r['role']} {r['head_name']} ({r['source']}, {r['score']:.3f})" for r in out["roles"]))


if __name__ == "__main__":  # a job of its own; a family job imports main (posmech.pipeline.runner)
    run(snakemake, main)  # noqa: F821
