"""Benchmark: one forward pass, engine by engine — CPU seconds of a 1x1024 pass on the
GPT-2-small-shaped stand-in that bench/study.py builds (run it first), 2 threads, median of 3
interleaved rounds: Hugging Face with and without the LM head, the TransformerBridge in
compatibility mode, the posmech engine (posmech.models.lens) with and without hooked patterns
and with an early stop, and the activation cache's capture.

    export PYTHONPATH=$PWD/src; .venv/bin/python bench/engine.py [/tmp/posmech-study/gpt2-random]
"""
import os
import sys
import time

import numpy as np
import torch

torch.set_num_threads(2)
from transformers import AutoModelForCausalLM
from posmech.models.loading import load_model, load_bridge
from posmech.cache import load_capture
D = sys.argv[1] if len(sys.argv) > 1 else "/tmp/posmech-study/gpt2-random"
man = {"hf_dir": D, "name": "x"}
hf = AutoModelForCausalLM.from_pretrained(D).eval()
lens = load_model(man, "cpu", "float32", "compatibility", "posmech")
br = load_bridge(man, "cpu", "float32", "compatibility")
cap = load_capture(man, "cpu", "float32", "compatibility")
x = torch.as_tensor(np.random.default_rng(0).integers(0, 50000, size=(1, 1024)))
pat = lambda L: [(f"blocks.{l}.attn.hook_pattern", lambda t, hook: None) for l in range(L)]
runs = {
  "HF forward with logits (the issue's floor)": lambda: hf(x, use_cache=False),
  "HF body, no LM head (bench/study.py's floor)": lambda: hf.transformer(x, use_cache=False),
  "bridge (compatibility), logits": lambda: br(x),
  "bridge, every layer's pattern hooked, no logits": lambda: br.run_with_hooks(x, fwd_hooks=pat(12), return_type=None),
  "engine, logits": lambda: lens(x),
  "engine, every layer's pattern hooked, no logits": lambda: lens.run_with_hooks(x, fwd_hooks=pat(12), return_type=None),
  "engine, layers 0-3 hooked (P5-style), no logits": lambda: lens.run_with_hooks(x, fwd_hooks=pat(4), return_type=None),
  "cache capture (posmech engine, resid_pre + ln1_out)": lambda: cap(x.numpy(), ("resid_pre", "ln1_out")),
}
res = {k: [] for k in runs}
with torch.inference_mode():
    for f in runs.values(): f()
    for r in range(3):
        for k, f in runs.items():
            t = time.process_time(); f(); res[k].append(time.process_time() - t)
print(f"load average {os.getloadavg()[0]:.2f}")
base = np.median(res["HF forward with logits (the issue's floor)"])
for k, v in res.items():
    print(f"| {k} | {np.median(v):.2f} | {np.median(v) / base:.2f} |")
