"""Benchmark: positional kernels and ETC of a GPT-2-small-shaped model (12 x 12 heads,
d_model 768, d_head 64, 1024 positions) from position-wise means, no model forward pass.

    OMP_NUM_THREADS=1 .venv/bin/python bench/kernels.py [--texts 8]

Two query sets: the study's (`config/config.yaml`: every n in 2..100 plus 100, 200, 400,
600, 800, 1000; computed and written to kernels.h5 like the rule does) and every n in
2..1023 (computed only: the full [12, 12, 1022, 1024] kernels would be 1.2 GB of float32
per stored array).  Target: under 30 s for n up to 1024.  On a shared machine the CPU time (single
thread) is the number to compare; the wall time is printed with the load average.  Numbers go to docs/performance.md.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from posmech.analyses import kernels as kn


def gpt2_small_like(rng: np.random.Generator, texts: int, positions: np.ndarray):
    L, H, d, dh, P = 12, 12, 768, 64, 1024
    unit = lambda a: (a - a.mean(-1, keepdims=True)) / a.std(-1, keepdims=True)  # noqa: E731 - like ln1 output
    means = unit(rng.normal(size=(L, P, d)))
    x = unit(rng.normal(size=(texts, L, len(positions), d)))
    w = kn.HeadWeights(
        rng.normal(0, 0.05, (L, H, d, dh)), rng.normal(0, 0.1, (L, H, dh)),
        rng.normal(0, 0.05, (L, H, d, dh)), rng.normal(0, 0.1, (L, H, dh)),
        np.full(L, math.sqrt(dh)), np.zeros(L, dtype=np.int64),
    )
    return means, x, w


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--texts", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    study = kn.query_positions(2, 100, [100, 200, 400, 600, 800, 1000])
    every = np.arange(2, 1024)
    for name, pos, write in (("study (n in 2..100 + 6 more, K=1001)", study, True),
                             ("every n in 2..1023 (K=1024)", every, False)):
        means, x, w = gpt2_small_like(rng, args.texts, pos)
        t0, c0 = time.perf_counter(), time.process_time()
        if write:
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "kernels.h5"
                chapters = {"doc_index": np.arange(args.texts), "title": ["t"] * args.texts, "length": [1024] * args.texts}
                kn.write_kernels(path, kn.model_kernels(means, x, pos, w, 2), 12, 12, pos, chapters,
                                 np.ones(1024, dtype=np.int64), {"model": "bench"})
                t1 = time.perf_counter()
                df = kn.etc_frame(kn.read_kernels(path), "bench", 0.02, 0.5)
                size = path.stat().st_size / 2**20
        else:
            etc = [lk.etc for lk in kn.model_kernels(means, x, pos, w, 2)]
            t1 = time.perf_counter()
            size, df = 0.0, etc
        t2, c2 = time.perf_counter(), time.process_time()
        print(f"{name}: {len(pos)} queries x {args.texts} texts x 144 heads: kernels {t1 - t0:.1f} s"
              f"{' (incl. writing kernels.h5, %.0f MiB)' % size if write else ''}, ETC table {t2 - t1:.2f} s, "
              f"total {t2 - t0:.1f} s wall, {c2 - c0:.1f} s CPU (load average {os.getloadavg()[0]:.1f})", flush=True)


if __name__ == "__main__":
    main()
