"""Benchmark: the score taxa (rule score_taxa, P13) over every head, against the bare
forward passes they ride on.

    OMP_NUM_THREADS=1 .venv/bin/python bench/score_taxa.py [--docs 3] [--repeats 3] [--small]

A GPT-2-small-shaped model (12 layers x 12 heads = 144 heads, d_model 768, 1024 positions,
vocabulary 50257; random weights: the cost does not depend on them), loaded through
posmech.models.loading.load_bridge in compatibility mode like every rule, runs `--docs`
full-context documents (1024 tokens), one per forward pass, in interleaved rounds:

* bare: `bridge(x, return_type=None)`, no hooks;
* taxa: posmech.analyses.anatomy.score_profiles with the config defaults
  (window ±5, 64 query rows per document): per layer, hooks keep q and k, compute only the
  row windows (64 x 11 dot products per head) and check their causal half against the
  bridge's hook_attn_scores;
* taxa (all rows): the same with every query position (1013 rows per document).

Then the features and taxa (row_features + classify_taxa) on the collected rows, alone.
CPU time of this single-threaded process, minimum over the rounds, is the number to quote
(the machine is shared; wall times are printed with the load average).  `--small`: 4 layers,
256 positions.  Numbers go to docs/performance.md.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from geometry import gpt2_small_documents, interleaved_rounds  # noqa: E402  (bench/geometry.py)

from posmech.analyses import anatomy as sa  # noqa: E402
from posmech.settings import defaults  # noqa: E402


def main() -> None:
    args, bridge, docs, (n_layer, n_ctx, d_vocab) = gpt2_small_documents(__doc__.splitlines()[0])
    out: dict[str, sa.ScoreProfiles] = {}

    def bare() -> None:
        with torch.inference_mode():
            for d in docs:
                bridge(torch.as_tensor(d)[None], return_type=None)

    def taxa(rows: int | None) -> None:
        out[str(rows)] = sa.score_profiles(bridge, docs, 5, rows, batch_size=1, progress=False)

    runs = {"bare": bare, "taxa": lambda: taxa(64), "taxa (all rows)": lambda: taxa(None)}
    bare()  # warm-up
    cpu, wall = interleaved_rounds(runs, args.repeats)
    print(f"model: {n_layer} layers x 12 heads, d_model 768, {n_ctx} positions, vocabulary {d_vocab}; "
          f"{args.docs} documents x {args.repeats} rounds; load average {os.getloadavg()[0]:.1f}")
    for k in cpu:
        ratio = f"   ratio to bare: CPU {cpu[k] / cpu['bare']:.3f}, wall {wall[k] / wall['bare']:.3f}" if k != "bare" else ""
        print(f"{k:16s} CPU {cpu[k]:7.2f} s ({cpu[k] / args.docs:.3f} s/doc)   wall {wall[k]:7.2f} s{ratio}")
    for rows in ("64", "None"):
        p = out[rows]
        c0 = time.process_time()
        sa.classify_taxa(sa.row_features(p.windows), defaults("anatomy").taxa)
        c = time.process_time() - c0
        print(f"features + taxa of {p.windows.shape[2]} rows x {p.windows.shape[0] * p.windows.shape[1]} heads "
              f"(rows_per_document {rows}): CPU {c:.2f} s = {100 * c / cpu['bare']:.1f} % of the bare passes")


if __name__ == "__main__":
    main()
