"""Benchmark: the L rules (L1-L5) against bare forward passes of the same tokens.

    OMP_NUM_THREADS=1 .venv/bin/python bench/attn_only.py [--repeats 3] [--sequences 500]

An attn-only-2l-shaped model (2 layers x 8 heads, d_model 512, d_head 64, 1024 positions,
vocabulary 48262, LayerNorm, attention only; random weights) is written as a legacy
TransformerLens checkpoint and loaded through posmech.models.load_bridge (compatibility
mode), exactly as the full study loads attn-only-2l.  For each rule's library call
(posmech.analyses.attn_only: random_token_patterns, input_decomposition, bos_induction; the
config/config.yaml settings: 500 sequences of BOS + 12 tokens, batch 100, induction score on
100 x [BOS] R R with |R| = 20, L4 on 500 samples) the same token batches are also run bare
(``bridge(x, return_type=None)``, no hooks).  Rounds are interleaved (bare, rule, bare, rule
...) ``--repeats`` times; on a shared machine the CPU time of this single-threaded process
(minimum over rounds) is the number to compare; wall times are printed with the load average.
Numbers go to docs/performance.md.

    .venv/bin/python bench/attn_only.py --peak

measures instead each rule's peak memory (``ru_maxrss`` of a fresh interpreter that imports,
loads the stand-in and runs the one call, as a job does) against the rule's cluster request
(``posmech.pipeline.cluster.mem_mb`` with the keeps and sequence length of workflow/rules/attn_only.smk),
for docs/cluster.md; the request must lie between the peak and twice it.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from typing import Any
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from posmech.models import handbuilt as hb
from posmech.analyses import attn_only as ao
from posmech.models.loading import load_bridge

SHAPE = {"n_layers": 2, "n_heads": 8, "d_model": 512, "d_head": 64, "n_ctx": 1024, "d_vocab": 48262}


def build(tmp: Path) -> Path:
    """A random attn-only-2l-shaped legacy TransformerLens directory (safetensors)."""
    from safetensors.torch import save_file

    L, H, d, dh, n, V = (SHAPE[k] for k in ("n_layers", "n_heads", "d_model", "d_head", "n_ctx", "d_vocab"))
    g = torch.Generator().manual_seed(0)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.02

    sd = {"embed.W_E": r(V, d), "pos_embed.W_pos": r(n, d), "ln_final.w": torch.ones(d), "ln_final.b": torch.zeros(d),
          "unembed.W_U": r(d, V), "unembed.b_U": torch.zeros(V)}
    for la in range(L):
        sd[f"blocks.{la}.ln1.w"], sd[f"blocks.{la}.ln1.b"] = torch.ones(d), torch.zeros(d)
        for x in "QKV":
            sd[f"blocks.{la}.attn.W_{x}"], sd[f"blocks.{la}.attn.b_{x}"] = r(H, d, dh), torch.zeros(H, dh)
        sd[f"blocks.{la}.attn.W_O"], sd[f"blocks.{la}.attn.b_O"] = r(H, dh, d), torch.zeros(d)
    save_file(sd, str(tmp / "model.safetensors"))
    cfg = {**SHAPE, "d_mlp": -1, "act_fn": "solu_ln", "attn_only": True, "normalization_type": "LN",
           "positional_embedding_type": "standard", "tokenizer_name": None}
    (tmp / "config.json").write_text(json.dumps(cfg))
    hb.char_tokenizer(256).save_pretrained(tmp)  # 255 non-special ids to draw from
    return tmp


#: each rule's memory request as workflow/rules/attn_only.smk declares it: keeps, sequence keys
REQUESTS = {
    "random_token_patterns": (("patterns", "residuals"), ("n_tokens", "induction_score.half_length")),
    "input_decomposition": (("patterns", "residuals"), ("n_tokens",)),
    "bos_induction": (("patterns", "residuals", "last_logits"), ("bos_induction.n_random",)),
}


def peaks(sequences: int) -> None:
    """Each rule in its own fresh interpreter (``--only RULE``): peak RSS vs the request."""
    import subprocess
    import sys

    from posmech.pipeline.cluster import KNOWN_HUB_MODELS, mem_mb

    shape = KNOWN_HUB_MODELS["neelnanda/attn_only_2l512w_c4_code"]
    p = params(sequences)
    lengths = p.sequence_lengths(True)
    for rule, (keeps, keys) in REQUESTS.items():
        out = subprocess.run([sys.executable, __file__, "--only", rule, "--sequences", str(sequences)],
                             capture_output=True, text=True, check=True).stdout
        peak = float(out.split("peak_mb")[-1].split()[0])
        n = max(lengths[f"attn_only.{k}"] for k in keys)
        req = mem_mb(shape, "float32", p.batch_size, keeps=keeps, n_tokens=n)
        print(f"{rule:22s} peak RSS {peak:7.0f} MB   request {req:6d} MB ({n} tokens, batch {p.batch_size})  "
              f"request / peak {req / peak:4.2f}")


def params(sequences: int) -> Any:
    """config/config.yaml's attn_only settings (the study's), with ``sequences`` sequences."""
    from posmech.settings import defaults

    return defaults("attn_only", n_sequences=sequences, bos=True, induction_score={"half_length": 20},
                    bos_induction={"n_samples": sequences, "n_random": 7})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sequences", type=int, default=500)
    ap.add_argument("--peak", action="store_true", help="peak memory of each rule vs its cluster request")
    ap.add_argument("--only", help="run this rule's call once and print its peak RSS (used by --peak)")
    args = ap.parse_args()
    if args.peak:
        peaks(args.sequences)
        return
    torch.set_num_threads(1)
    p = params(args.sequences)
    with tempfile.TemporaryDirectory() as tmp:
        bridge = load_bridge({"name": "bench", "hf_dir": str(build(Path(tmp)))}, "cpu")
    setup = ao.prepare(bridge, p, "bench", {"prepend_bos": True}, need_bos=True)
    roles = {"previous": (0, 0), "look_back_two": (0, 1)}
    x = ao.random_tokens(setup.vocab, p.n_sequences, p.n_tokens, setup.bos, p.seed)
    xr = ao.repeated_tokens(setup.vocab, 100, 20, setup.bos, p.seed + 1)
    draws = ao.distinct_tokens(setup.vocab, p.bos_induction.n_samples, 9, p.seed + 2)
    x4 = [ao.induction_sequences(draws, b)[0] for b in (setup.bos, None)]

    def bare(*arrays: np.ndarray) -> Callable[[], None]:
        def fn() -> None:
            with torch.inference_mode():
                for a in arrays:
                    for s in range(0, len(a), p.batch_size):
                        bridge(torch.as_tensor(a[s : s + p.batch_size]), return_type=None)
        return fn

    rules = {
        # L1 runs every head on x and on the repeated sequences
        "random_token_patterns": (lambda: ao.random_token_patterns(bridge, p, setup, progress=""), bare(x, xr)),
        # both + token-only on x, position-only on one sequence
        "input_decomposition": (lambda: ao.input_decomposition(bridge, p, setup, roles, progress=""),
                                bare(x, x[:1], x)),
        "bos_induction": (lambda: ao.bos_induction(bridge, p, setup, (1, 0), progress=""), bare(*x4)),
    }
    if args.only:
        import resource

        rules[args.only][0]()
        print(f"peak_mb {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f}")
        return
    for fn, ref in rules.values():  # warm-up
        ref()
        fn()
    times: dict[str, dict[str, list[tuple[float, float]]]] = {r: {"bare": [], "rule": []} for r in rules}
    for _ in range(args.repeats):
        for r, (fn, ref) in rules.items():
            for kind, f in (("bare", ref), ("rule", fn)):
                t0, c0 = time.perf_counter(), time.process_time()
                f()
                times[r][kind].append((time.process_time() - c0, time.perf_counter() - t0))
    print(f"model: attn-only-2l shape {SHAPE}, random weights; {args.sequences} sequences; "
          f"{args.repeats} interleaved rounds; load average {os.getloadavg()[0]:.1f}")
    for r, t in times.items():
        cb, cr = min(c for c, _ in t["bare"]), min(c for c, _ in t["rule"])
        wb, wr = min(w for _, w in t["bare"]), min(w for _, w in t["rule"])
        print(f"{r:22s} bare CPU {cb:6.2f} s  rule CPU {cr:6.2f} s  ratio {cr / cb:5.2f}   "
              f"(wall {wb:6.2f} / {wr:6.2f} s, ratio {wr / wb:5.2f})")


if __name__ == "__main__":
    main()
