"""Rule etc_table: Effective Token Count of every (layer, head, n) with its spread over the
query texts and the kernel type (K3, K4, K5); scorecard rows K1–K5."""

from posmech.analyses import kernels as kn
from posmech.pipeline.runner import run
from posmech.store.tables import write_table


def main(smk, log):
    model, out = smk.wildcards.model, smk.output
    ks = kn.read_kernels(smk.input.h5)
    p = smk.params.settings.recorded(ks.attrs["kernels_config"])  # the positions kernels.h5 was computed at
    df = kn.etc_frame(ks, model, p.local_max_fraction, p.uniform_min_fraction)
    n = p.etc_heatmap_position
    meta = {"k0": int(ks.attrs["k0"]), "local_max_fraction": p.local_max_fraction,
            "uniform_min_fraction": p.uniform_min_fraction, "classified_at_n": n,
            "means_corpus": ks.attrs["means_corpus"], "query_texts": ks.titles}
    write_table(df, out.table, meta)
    at = kn.types_at(df, n)
    local = at[at["kernel_type"] == "local"]
    eq = {r.head_name: kn.translation_tv(ks.kernel(r.layer, r.head), ks.positions, int(ks.attrs["k0"]),
                                         p.equivariance_max_offset) for r in local.itertuples()}
    arts = {"table": out.table, "kernels": smk.params.kernels_figure, "heatmap": smk.params.heatmap,
            "profiles": smk.params.profiles}
    write_table(kn.scorecard(df, model, n, arts, eq), out.scorecard)
    log.info("n=%d: %s", n, at["kernel_type"].value_counts().to_dict())


if __name__ == "__main__":  # a job of its own; a family job imports main (posmech.pipeline.runner)
    run(snakemake, main)  # noqa: F821
