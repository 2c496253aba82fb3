"""Benchmark: the diagonal taxonomy's cost over the bare forward passes it rides on.

    OMP_NUM_THREADS=1 .venv/bin/python bench/taxonomy.py [--docs 3] [--repeats 3] [--small]

A GPT-2-small-shaped model (12 layers x 12 heads, d_model 768, 1024 positions, vocabulary
50257; random weights, loaded through posmech.models.loading.load_bridge in compatibility mode
like every rule) runs `--docs` full-context documents (1024 tokens) twice, interleaved
`--repeats` times: bare (`bridge(x, return_type=None)`, no hooks) and with the taxonomy
hooks (posmech.analyses.taxonomy.accumulate_diagonals: one-pass diagonal sums of every head's
pattern inside blocks.L.attn.hook_pattern, plus the head_detector score), and the hooks'
work alone on a synthetic pattern of the same shape.  Target: the
taxonomy costs at most 10 % more than the bare forward passes.  On a shared machine the
CPU time of this single-threaded process is the number to compare (minimum over
repeats); wall times are printed with the load average.  `--small`: 4 layers, 256
positions (a quick check).  Numbers go to docs/performance.md.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from geometry import gpt2_small_documents, interleaved_rounds  # noqa: E402  (bench/geometry.py)

from posmech.analyses.taxonomy import accumulate_diagonals, diagonal_sums  # noqa: E402


def main() -> None:
    args, bridge, docs, (n_layer, n_ctx, d_vocab) = gpt2_small_documents(__doc__.splitlines()[0])

    def bare() -> None:
        with torch.inference_mode():
            for d in docs:
                bridge(torch.as_tensor(d)[None], return_type=None)

    def taxonomy() -> None:
        accumulate_diagonals(bridge, docs, batch_size=1)

    bare()  # warm-up
    cpu, wall = interleaved_rounds({"bare": bare, "taxonomy": taxonomy}, args.repeats)
    print(f"model: {n_layer} layers x 12 heads, d_model 768, {n_ctx} positions, vocabulary {d_vocab}; "
          f"{args.docs} documents x {args.repeats} repeats; load average {os.getloadavg()[0]:.1f}")
    for k in cpu:
        print(f"{k:9s} CPU {cpu[k]:7.2f} s ({cpu[k] / args.docs:.3f} s/doc)   wall {wall[k]:7.2f} s")
    # the hooks' own work, isolated: 12 (n_layers) reductions of a softmax pattern per document
    pat = torch.softmax(torch.randn(1, 12, n_ctx, n_ctx) + torch.triu(torch.full((n_ctx, n_ctx), -torch.inf), 1), -1)
    c0 = time.process_time()
    for _ in range(n_layer * args.docs):
        ds = diagonal_sums(pat)
        det = ds[..., 1] / ds.sum(-1)
        ds[..., 0] -= pat[..., 0, 0]
        ds.sum(0).double().numpy(), det.sum(0).double().numpy()
    hook_cpu = time.process_time() - c0
    print(f"hook work alone: CPU {hook_cpu:.2f} s ({hook_cpu / args.docs:.3f} s/doc) = "
          f"{100 * hook_cpu / cpu['bare']:.1f} % of the bare forward passes")
    print(f"taxonomy overhead: CPU {100 * (cpu['taxonomy'] / cpu['bare'] - 1):+.1f} %, "
          f"wall {100 * (wall['taxonomy'] / wall['bare'] - 1):+.1f} %  (target <= +10 %)")


if __name__ == "__main__":
    main()
