"""Benchmark: the layer-0 contextual-head rules (K6-K9) on a GPT-2-small-shaped model with
random weights (12 layers x 12 heads, d_model 768, 50257 tokens, 1024 positions), as a ratio
to one bare forward pass per text used.

    OMP_NUM_THREADS=1 .venv/bin/python bench/contextual.py [--texts 6] [--rounds 3]

Per round, interleaved (so machine load hits both alike): one bare forward pass of the
Hugging Face model per text (1023 tokens, no hooks, inference mode), then the library work
of each rule as the scripts call it with the study's config (`config/config.yaml`):
`layer0_decomposition` (LN scale over the texts' tokens, factors incl. the 50257-token
content keys, every text's denominators at n = 1..1022, written to layer0.h5),
`layer0_positional_patterns` (K6 at n = 399, 699, 1022), `layer0_head_classes` (the
duplicate-token score over every destination of every text), `denominator_variance` (K9,
200 redraws at n = 100, 400, 1000).  K8 only reads layer0.h5 (milliseconds) and K10 is one
forward pass of the pattern text.  Reported: CPU time (process time; the machine is shared)
per stage and its ratio to the forward passes of the same round, median over rounds.
Numbers go to docs/performance.md.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from posmech.analyses import contextual as cx
from posmech.data.tokens import TokenSet


def cpu(fn, *a, **k):
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn(*a, **k)
    return out, time.process_time() - c0, time.perf_counter() - t0


def random_gpt2():
    """A GPT-2-small-shaped Hugging Face model (12 layers x 12 heads, d_model 768, 1024
    positions, 50257 tokens) with random weights (seed 0, eager attention), in eval mode.
    Shared by bench/study.py."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config()
    cfg._attn_implementation = "eager"
    return GPT2LMHeadModel(cfg).eval()


def bare_forwards(model, texts) -> None:
    """The floor: one bare forward of each text (first 1023 tokens), no logits, no hooks."""
    import torch

    with torch.inference_mode():
        for t in texts:
            model.transformer(torch.as_tensor(t[:1023])[None], use_cache=False)


def random_gpt2_and_texts(n_texts: int):
    """A GPT-2-small-shaped model with random weights (seed 0, eager attention) and ``n_texts``
    texts of BOS + 1022 Zipf-distributed tokens (duplicates as frequent as in text), as the
    model, the id arrays, a TokenSet and the layer-0 file's text entries.  Shared by
    bench/neurons.py."""
    model = random_gpt2()
    cfg = model.config
    rng = np.random.default_rng(0)
    probs = 1.0 / np.arange(1, cfg.vocab_size + 1)
    texts = [np.concatenate([[50256], rng.choice(cfg.vocab_size, 1022, p=probs / probs.sum())])
             for _ in range(n_texts)]
    tokens = TokenSet(np.concatenate(texts).astype(np.int32), np.arange(0, 1023 * (n_texts + 1), 1023), {},
                      [f"t{j}" for j in range(n_texts)])
    entries = [{"corpus": "c", "doc_index": j, "title": f"t{j}", "ids": t} for j, t in enumerate(texts)]
    return model, texts, tokens, entries


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--texts", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    model, texts, tokens, entries = random_gpt2_and_texts(args.texts)
    w = cx.weights_from_hf(model, "gpt2-random")
    stages: dict[str, list[float]] = {}
    walls: dict[str, list[float]] = {}
    for r in range(args.rounds):
        _, c_fwd, w_fwd = cpu(bare_forwards, model, texts)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "layer0.h5"
            _, c_dec, w_dec = cpu(cx.build_decomposition, w, 262, " the", tokens, entries, 1022, None, path, {})
            dec = cx.read_decomposition(path)
            s = float(dec.attrs["ln_scale_used"])
            _, c_k6, w_k6 = cpu(cx.positional_patterns, w, s, dec.token_ids[0], [399, 699, 1022], 262, 400, 1)
            _, c_k7, w_k7 = cpu(cx.duplicate_scores, w, s, list(dec.token_ids), 1022)
            _, c_k9, w_k9 = cpu(lambda: [cx.variance_model(dec, dec.token_ids[j], n, 200, 0)
                                         for j in range(args.texts) for n in (100, 400, 1000)])
        for k, c, wall in (("forward", c_fwd, w_fwd), ("decomposition", c_dec, w_dec), ("K6", c_k6, w_k6),
                           ("K7", c_k7, w_k7), ("K9", c_k9, w_k9)):
            stages.setdefault(k, []).append(c)
            walls.setdefault(k, []).append(wall)
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.1f}s" for k, v in stages.items()), flush=True)
    fwd = np.array(stages["forward"])
    print(f"\n{args.texts} texts of 1023 tokens, {args.rounds} rounds, OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')}, load average {os.getloadavg()[0]:.1f}")
    print("| stage | CPU time (median) | ratio to the bare forward passes (median over rounds) | wall (median) |")
    print("|---|---|---|---|")
    for k, v in stages.items():
        ratio = np.median(np.array(v) / fwd)
        print(f"| {k} | {np.median(v):.2f} s | {ratio:.2f} | {np.median(walls[k]):.2f} s |")
    total = sum(np.array(v) for k, v in stages.items() if k != "forward")
    print(f"| all K6-K9 library work | {np.median(total):.2f} s | {np.median(total / fwd):.2f} | |")


if __name__ == "__main__":
    main()
