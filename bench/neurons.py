"""Benchmark: the contextual-neuron rules (C1-C3) on a GPT-2-small-shaped model with random
weights (12 layers x 12 heads, d_model 768, d_mlp 3072, 50257 tokens, 1024 positions), as a
ratio to one bare forward pass per text, and the peak memory of the C1 artifact.

    OMP_NUM_THREADS=1 .venv/bin/python bench/neurons.py [--texts 2] [--rounds 2]

Set-up (not timed): layer0.h5 of the texts (rule layer0_decomposition).  Per round,
interleaved (machine load hits all alike): one bare forward pass of the Hugging Face model per
text (1023 tokens, inference mode), then the library work of each rule as its script calls it:
C1 `extended_token_embeddings` (LN2 scale over the texts, the extended embeddings and the
token-contribution vectors of all 50257 tokens x 3072 neurons, written float16 to HDF5),
C2 `contextual_neurons` (the real layer-0 pre-activations and the contextual term of every
neuron along every text, the ranking; reading 4 neurons' columns), C3 `bag_of_tokens_fit`
(the approximation along every text; its real pre-activations are one forward pass per text,
the baseline).  Six contextual heads (the post's 0, 2, 6, 8, 9, 10).  Reported: CPU time
(process time; the machine is shared) per stage, its ratio to the forward passes of the same
round (median over rounds), and the peak of memory allocated by numpy/Python during C1
(tracemalloc) against the size of the float32 token x neuron matrix.  Numbers go to
docs/performance.md.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import tracemalloc
from pathlib import Path

import numpy as np

from posmech.analyses import contextual as cx
from posmech.analyses import neurons as nr
from contextual import bare_forwards, cpu, random_gpt2_and_texts  # noqa: E402  (bench/contextual.py)

HEADS = [0, 2, 6, 8, 9, 10]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--texts", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    model, texts, tokens, entries = random_gpt2_and_texts(args.texts)
    w, ov = cx.weights_from_hf(model, "gpt2-random"), nr.ov_from_hf(model, "gpt2-random")
    stages: dict[str, list[float]] = {}
    walls: dict[str, list[float]] = {}
    peaks = []
    with tempfile.TemporaryDirectory() as tmp:
        l0 = Path(tmp) / "layer0.h5"
        cx.build_decomposition(w, 262, " the", tokens, entries, 1022, None, l0, {})
        dec = cx.read_decomposition(l0)
        for r in range(args.rounds):
            _, c_fwd, w_fwd = cpu(bare_forwards, model, texts)
            path = Path(tmp) / f"extended_{r}.h5"

            def c1():
                st, _ = nr.build_setup(dec, w, ov, HEADS, 0, 100, None)
                nr.write_extended(st, nr.content_keys(dec), path, {})

            tracemalloc.start()
            _, c_c1, w_c1 = cpu(c1)
            peaks.append(tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()
            st = nr.setup_from_artifact(path, dec, w, ov)

            def c2():
                keys = nr.content_keys(dec)
                real = [nr.hook_pre(w, ov, t) for t in dec.token_ids]
                ctx = [nr.approximate(st, keys, t)["context"] for t in dec.token_ids]
                nr.neuron_ranking(real, ctx, "m", 100)
                nr.read_contributions(path, [300, 704, 1621, 1710])

            _, c_c2, w_c2 = cpu(c2)
            def c3():
                keys = nr.content_keys(dec)
                return [nr.approximate(st, keys, t)["pre"] for t in dec.token_ids]

            _, c_c3, w_c3 = cpu(c3)
            for k, c, wall in (("forward", c_fwd, w_fwd), ("C1", c_c1, w_c1), ("C2", c_c2, w_c2),
                               ("C3", c_c3, w_c3)):
                stages.setdefault(k, []).append(c)
                walls.setdefault(k, []).append(wall)
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.1f}s" for k, v in stages.items())
                  + f", C1 peak {peaks[-1] / 2**20:.0f} MiB", flush=True)
        size = os.path.getsize(path)
    fwd = np.array(stages["forward"])
    print(f"\n{args.texts} texts of 1023 tokens, {args.rounds} rounds, OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')}, load average {os.getloadavg()[0]:.1f}")
    print("| stage | CPU time (median) | ratio to the bare forward passes (median over rounds) | wall (median) |")
    print("|---|---|---|---|")
    for k, v in stages.items():
        print(f"| {k} | {np.median(v):.2f} s | {np.median(np.array(v) / fwd):.2f} | {np.median(walls[k]):.2f} s |")
    print(f"C1 peak traced memory {max(peaks) / 2**20:.0f} MiB (float32 50257 x 3072 matrix: "
          f"{50257 * 3072 * 4 / 2**20:.0f} MiB); extended_tokens.h5 {size / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
