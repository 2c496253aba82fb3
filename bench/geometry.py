"""Benchmark: the positional-geometry rules (P1, P8–P11).

    OMP_NUM_THREADS=1 .venv/bin/python bench/geometry.py [--manifest resources/models/demo/manifest.json]
        [--tokens 100] [--gpt2-prompts 2] [--skip-gpt2]

1. Demo model (``--manifest``; a random model of the demo's shape when it is absent):
   the repeated-token forward passes of ``extended_positional_embeddings`` (reported as
   tokens/s) and, separately, everything else the four rules do (HDF5 write/read, tables,
   scorecards, all seven figures).  Target: under 60 s for the latter.
2. GPT-2-small-shaped arrays ([13, 1024, 768] extended embeddings, random): the same
   analyses, to show the study's cost without the model.
3. GPT-2-small-shaped random model (12 layers, d_model 768, n_ctx 1024): forward
   tokens/s of the repeated-token prompts (``--gpt2-prompts`` prompts of 1024 tokens).

Numbers go to docs/performance.md.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from posmech.analyses import geometry as geo
from posmech.models import handbuilt as hb
from posmech.models.loading import load_bridge, read_manifest
from posmech.plots import geometry as plots
from posmech.store.tables import scorecard_rows, write_table

REPO = Path(__file__).resolve().parents[1]


def random_model_dir(path: Path, n_layer: int, n_head: int, d_model: int, n_ctx: int, d_vocab: int) -> Path:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=d_vocab, n_positions=n_ctx, n_embd=d_model, n_layer=n_layer, n_head=n_head,
                     bos_token_id=0, eos_token_id=0)
    GPT2LMHeadModel(cfg).save_pretrained(path, safe_serialization=True)
    hb.char_tokenizer(d_vocab).save_pretrained(path)
    return path


def gpt2_small_documents(description: str) -> tuple[argparse.Namespace, object, list[np.ndarray], tuple[int, int, int]]:
    """The shared set-up of the forward-pass benchmarks: parse ``--docs``, ``--repeats``,
    ``--small``; one torch thread; a GPT-2-small-shaped random model (12 layers x 12 heads,
    d_model 768, 1024 positions, vocabulary 50257; ``--small``: 4 layers, 256 positions)
    loaded with :func:`posmech.models.load_bridge` (compatibility mode); ``--docs`` random
    full-context documents starting with token 0.  Returns ``(args, bridge, documents,
    (n_layer, n_ctx, d_vocab))``."""
    import torch

    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--docs", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--small", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    n_layer, n_ctx, d_vocab = (4, 256, 50257) if args.small else (12, 1024, 50257)
    with tempfile.TemporaryDirectory() as tmp:
        path = random_model_dir(Path(tmp), n_layer, 12, 768, n_ctx, d_vocab)
        bridge = load_bridge({"name": "bench", "hf_dir": str(path)}, "cpu")
    rng = np.random.default_rng(0)
    docs = [np.concatenate([[0], rng.integers(1, d_vocab, n_ctx - 1)]) for _ in range(args.docs)]
    return args, bridge, docs, (n_layer, n_ctx, d_vocab)


def interleaved_rounds(runs: dict[str, Callable[[], object]], repeats: int) -> tuple[dict[str, float], dict[str, float]]:
    """Run every callable of ``runs`` once per round, ``repeats`` rounds, interleaved (so a
    load change on a shared machine hits all of them alike); ``(cpu, wall)``: the minimum
    CPU and wall seconds of each over the rounds."""
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in runs}
    for _ in range(repeats):
        for name, fn in runs.items():
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            times[name].append((time.process_time() - c0, time.perf_counter() - t0))
    return ({k: min(c for c, _ in v) for k, v in times.items()}, {k: min(w for _, w in v) for k, v in times.items()})


@contextlib.contextmanager
def timed(t: dict[str, tuple[float, float]], name: str) -> Iterator[None]:
    """Record ``t[name] = (wall, CPU)`` seconds of the block."""
    t0, c0 = time.perf_counter(), time.process_time()
    yield
    t[name] = (time.perf_counter() - t0, time.process_time() - c0)


def analyses(ext_path: Path, out: Path, model: str, layer: int = 2) -> dict[str, tuple[float, float]]:
    """What positional_pca, canonical_angles, positional_sparsity and the non-forward part
    of extended_positional_embeddings do; (wall, CPU) seconds per rule."""
    t: dict[str, tuple[float, float]] = {}
    with timed(t, "extended (tables, figure)"):
        ext = geo.read_extended_artifact(ext_path)
        agree = geo.agreement_table(ext, model)
        write_table(agree, out / "agreement.csv")
        plots.agreement(agree, "P8", out / "agreement.png")
        write_table(scorecard_rows(geo.extended_scorecard(agree, model, "x")), out / "sc8.csv")
    with timed(t, "positional_pca"):
        ext = geo.read_extended_artifact(ext_path)
        first, lay = geo.analysis_first(ext, None), geo.helix_layer(ext, layer)
        pcas = geo.all_pcas(ext, first, 10)
        table = geo.pca_table(ext, model, first, 10, pcas)
        write_table(table, out / "pca.csv")
        plots.explained_variance(table, "P1", out / "explained.png")
        h = geo.helices(ext, first, pcas)
        plots.helix(h["W_pos"], h["positions"], "P1", out / "wpos.png")
        plots.helix_grid(h["panels"], h["positions"], "P10", out / "helices.png")
        plots.comparison(geo.comparison_panels(ext, first, lay), ("ext", "W_pos"), "P10", out / "cmp.png")
        write_table(scorecard_rows(geo.pca_scorecard(table, model, lay, "a", "b")), out / "sc1.csv")
    with timed(t, "canonical_angles"):
        ext = geo.read_extended_artifact(ext_path)
        table = geo.angles_table(ext, model, first, 3)
        write_table(table, out / "angles.csv")
        plots.angles(table, "P11", out / "angles.png")
        write_table(scorecard_rows(geo.angles_scorecard(table, model, lay, "x")), out / "sc11.csv")
    with timed(t, "positional_sparsity"):
        ext = geo.read_extended_artifact(ext_path)
        table = geo.sparsity_table(ext, model, first, 1.0)
        write_table(table, out / "sparsity.csv")
        plots.sparsity(table, "P9", out / "sparsity.png")
        write_table(scorecard_rows(geo.sparsity_scorecard(table, model, "x")), out / "sc9.csv")
    return t


def report(title: str, t: dict[str, tuple[float, float]]) -> None:
    print(f"## {title}: wall s, CPU s")
    for k, (w, c) in t.items():
        print(f"  {k:32s} {w:7.2f} {c:7.2f}")
    print(f"  {'total':32s} {sum(w for w, _ in t.values()):7.2f} {sum(c for _, c in t.values()):7.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--manifest", default=str(REPO / "resources/models/demo/manifest.json"))
    ap.add_argument("--tokens", type=int, default=100)
    ap.add_argument("--gpt2-prompts", type=int, default=2)
    ap.add_argument("--skip-gpt2", action="store_true")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench_geometry_"))

    if Path(args.manifest).is_file():
        man, label = read_manifest(args.manifest), f"demo model ({args.manifest})"
    else:
        d = random_model_dir(tmp / "demo_like", 2, 4, 64, 64, 78)
        man, label = {"hf_dir": str(d), "name": "demo_like"}, "random model of the demo's shape"
    bridge = load_bridge(man, device="cpu")
    c0 = time.process_time()
    acc, W_pos, tokens, info = geo.compute_extended(bridge, args.tokens, 0, 16, True)
    print(f"## forward passes, {label}: {info['n_prompts']} prompts x {info['n_ctx']} tokens in "
          f"{info['forward_seconds']:.2f} s = {info['tokens_per_second']:.0f} tokens/s; "
          f"process CPU time {time.process_time() - c0:.2f} s")
    c0, t0 = time.process_time(), time.perf_counter()
    geo.write_extended(tmp / "demo.h5", acc, W_pos, tokens, geo.site_names(info["n_layers"]), info)
    t = {"write extended.h5": (time.perf_counter() - t0, time.process_time() - c0),
         **analyses(tmp / "demo.h5", tmp, "demo")}
    report(f"geometry rules without forward passes, {label}", t)

    rng = np.random.default_rng(0)
    L, P, d = 12, 1024, 768
    big = geo.ExtendedAccumulator(L + 1, P, d, first=1)
    big.S = rng.normal(size=(L + 1, P, d)) * np.linspace(3, 0.1, d)
    big.U = big.S[:, 1:] / np.linalg.norm(big.S[:, 1:], axis=(1, 2), keepdims=True)
    big.q, big.count = np.einsum("lpd,lpd->l", big.S[:, 1:], big.S[:, 1:]), 1
    c0, t0 = time.process_time(), time.perf_counter()
    geo.write_extended(tmp / "gpt2.h5", big, big.S[0], np.arange(100), geo.site_names(L), {})
    t = {"write extended.h5": (time.perf_counter() - t0, time.process_time() - c0),
         **analyses(tmp / "gpt2.h5", tmp, "gpt2-shaped")}
    report("geometry rules without forward passes, GPT-2-small-shaped arrays [13, 1024, 768]", t)

    if not args.skip_gpt2:
        d2 = random_model_dir(tmp / "gpt2_like", 12, 12, 768, 1024, 1000)
        b2 = load_bridge({"hf_dir": str(d2), "name": "gpt2_like"}, device="cpu")
        c0 = time.process_time()
        _, _, _, i2 = geo.compute_extended(b2, args.gpt2_prompts, 0, 1, True)
        cpu = time.process_time() - c0
        print(f"## forward passes, GPT-2-small-shaped random model: {i2['n_prompts']} prompts x {i2['n_ctx']} "
              f"tokens in {i2['forward_seconds']:.2f} s = {i2['tokens_per_second']:.0f} tokens/s "
              f"(100 prompts: ~{100 * i2['n_ctx'] / i2['tokens_per_second']:.0f} s); process CPU time {cpu:.1f} s")


if __name__ == "__main__":
    main()
