"""Benchmark: the cost of the intervention hooks (rules prev_knockout, extended_averaging,
repeated_tokens, induction_intervention) against a bare forward pass of the same bridge.

    OMP_NUM_THREADS=1 .venv/bin/python bench/interventions.py --repeats 3

A GPT-2-small-shaped model (12 layers × 12 heads, d_model 768, 1024 positions, random
weights: the cost does not depend on them) in TransformerLens compatibility mode; one
1024-token document per forward pass.  Each condition is timed ``--repeats`` times,
interleaved with the others, best of (CPU time and wall).  Prints JSON; numbers go to
docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=1024)
    args = ap.parse_args()

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from posmech.analyses import interventions as iv
    from posmech.models import handbuilt as hb
    from posmech.models.loading import load_bridge

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = GPT2Config(n_layer=12, n_head=12, n_embd=768, n_positions=1024, vocab_size=50257)
        GPT2LMHeadModel(cfg).save_pretrained(tmp, safe_serialization=True)
        hb.char_tokenizer(256).save_pretrained(tmp)
        t0 = time.perf_counter()
        bridge = load_bridge({"hf_dir": str(Path(tmp)), "name": "bench"}, device="cpu")
        load_s = time.perf_counter() - t0
    T = args.tokens
    doc = np.random.default_rng(0).integers(1, 50257, T)
    doc[0] = 0
    delta = np.random.default_rng(1).normal(size=(T, 768))
    sharp = (4, 11)
    conditions = {
        "bare forward": [],
        "capture sharp head pattern": None,
        "P5 knock-out, layers 0-3 (renormalised)": iv.knockout_hooks(range(4), iv.knockout_rows(T, 5), True),
        "P15 residual shift before layer 4": [iv.residual_shift_hook(4, delta)],
        "P16 redirect + scale": [iv.redirect_hook(4, 11, {500: 498, 400: 399}), iv.scale_head_hook(4, 11, 2.0)],
    }
    best: dict[str, dict[str, float]] = {k: {"cpu_s": np.inf, "wall_s": np.inf} for k in conditions}
    for _ in range(args.repeats):
        for name, hooks in conditions.items():
            c0, w0 = time.process_time(), time.perf_counter()
            if name == "bare forward":
                with torch.inference_mode():
                    bridge(torch.as_tensor(doc[None]))
            else:
                iv.run_hooked(bridge, doc, hooks or [], capture=[sharp])
            best[name]["cpu_s"] = min(best[name]["cpu_s"], time.process_time() - c0)
            best[name]["wall_s"] = min(best[name]["wall_s"], time.perf_counter() - w0)
    bare = best["bare forward"]["cpu_s"]
    out = {"tokens": T, "load_seconds": round(load_s, 2), "repeats": args.repeats,
           "conditions": {k: {**{m: round(v, 3) for m, v in b.items()}, "cpu_vs_bare": round(b["cpu_s"] / bare, 3)}
                          for k, b in best.items()}}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
