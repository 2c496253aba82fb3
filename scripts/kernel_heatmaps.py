"""Rule kernel_heatmaps: query x key heatmaps of the layer-0 and selected later heads (K2),
and the kernel at n with its spread over query texts (K5)."""

from posmech.analyses import kernels as kn
from posmech.analyses.attention import head_name
from posmech.plots import kernels as plots
from posmech.pipeline.runner import run
from posmech.store.tables import read_table


def main(smk, log):
    model, out = smk.wildcards.model, smk.output
    ks = kn.read_kernels(smk.input.h5)
    p = smk.params.settings.recorded(ks.attrs["kernels_config"])  # the positions kernels.h5 was computed at
    at = kn.types_at(read_table(smk.input.table), p.etc_heatmap_position)
    types = dict(zip(at["head_name"], at["kernel_type"]))
    k0, n_max = int(ks.attrs["k0"]), p.heatmap_max_position
    layer0 = [head_name(0, h) for h in range(ks.n_heads)]
    later = kn.pick_heads(at, p.selected_heads)
    idx = lambda name: tuple(int(v) for v in name[1:].split("H"))  # noqa: E731
    first = ks.positions[None, :] - ks.n_keys + 1  # [L, Q] first key in the softmax (k0, or a window's)
    windowed = bool((first != k0).any())
    for heads, path, what in ((layer0, out.layer0, "layer-0 heads"), (later, out.selected, "selected heads")):
        kernels = {h: ks.kernel(*idx(h)) for h in heads}
        plots.kernel_heatmaps(kernels, ks.positions, k0, n_max, f"K2 {model}: positional kernels of {what} "
                              f"(mean over {len(ks.titles)} Bible texts)", path, types,
                              {h: first[idx(h)[0]] for h in heads} if windowed else None)
    n = p.etc_heatmap_position
    q = int(list(ks.positions).index(n))
    profiles = {h: (ks.kernel(*idx(h))[q], ks.kernel(*idx(h), which="kernel_std")[q]) for h in layer0 + later}
    plots.kernel_profiles(profiles, n, k0, len(ks.titles), out.profiles, types)
    log.info("selected later heads: %s", ", ".join(later))


if __name__ == "__main__":  # a job of its own; a family job imports main (posmech.pipeline.runner)
    run(snakemake, main)  # noqa: F821
