"""Benchmark: the activation cache (rule ``cache_activations``) against a bare Hugging Face
forward pass and against the notebook approach (``run_with_cache`` of every hook, kept in
memory), on randomly initialised models (speed does not depend on the weights).

    OMP_NUM_THREADS=1 .venv/bin/python bench/cache.py --shape gpt2-small
    OMP_NUM_THREADS=1 .venv/bin/python bench/cache.py --shape demo

Three measurements, each in a fresh subprocess (so peak RSS is that run's own):

1. throughput on the same tokens and batch size: tokens/s of ``cache_activations``
   (forward pass + hooks + HDF5 writes + float64 running means + checkpoints, the whole
   call) vs ``model.transformer(x)`` (HF, no LM head: the baseline) and ``model(x)`` (HF
   with logits), and the cache engine's own forward pass with its hooks but nothing
   stored (``engine``: what the cache costs beyond its forward pass).  ``--repeats``
   rounds, each running all four back to back (order alternating between rounds); the
   summary gives the ratio of the best times and the median of the per-round ratios,
   for wall and CPU time;
2. peak RSS of ``cache_activations`` at ``--rss-docs`` documents (default 16 and 256):
   memory must not grow with the number of documents;
3. the notebook approach at ``--notebook-docs`` documents: time and peak RSS, against the
   cache at the same documents.

Prints a JSON summary (``--json-out`` also writes it).  Numbers go to docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SHAPES = {
    "gpt2-small": {"n_layer": 12, "n_head": 12, "n_embd": 768, "n_positions": 1024, "vocab_size": 50257},
    "demo": {"n_layer": 2, "n_head": 4, "n_embd": 64, "n_positions": 64, "vocab_size": 80},
}


def build_model(shape: str, out: Path) -> Path:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from posmech.models import handbuilt as hb

    torch.manual_seed(0)
    m = GPT2LMHeadModel(GPT2Config(**SHAPES[shape]))
    m.save_pretrained(out, safe_serialization=True)
    hb.char_tokenizer(80).save_pretrained(out)
    return out


def tokens(shape: str, n_docs: int, doc_len: int, seed: int = 0):
    from posmech.data.tokens import TokenSet

    rng = np.random.default_rng(seed)
    flat = rng.integers(1, SHAPES[shape]["vocab_size"], size=n_docs * doc_len).astype(np.int32)
    flat[::doc_len] = 0
    off = np.arange(n_docs + 1, dtype=np.int64) * doc_len
    return TokenSet(flat, off, {"config_hash": "bench"}, [""] * n_docs)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


CONFIGS = {"gpt2-small": "config/config.yaml", "demo": "config/demo.yaml"}


def cache_settings(shape: str, batch_size: int | None):
    """The ``cache:`` section of the config the shape stands for (chunking, dtype, hooks,
    checkpoints), with ``batch_size`` overridden when given."""
    import yaml

    from posmech.settings import defaults

    root = Path(__file__).resolve().parent.parent
    cfg = yaml.safe_load((root / CONFIGS[shape]).read_text()).get("cache") or {}
    settings = defaults("cache", **cfg).replace(n_documents=None)
    return settings if batch_size is None else settings.replace(batch_size=batch_size)


def worker(args: argparse.Namespace) -> dict:
    import statistics

    import torch

    from posmech.analyses.cache import cache_activations, load_capture
    from posmech.models.loading import load_bridge, load_hf

    torch.set_num_threads(1)
    man = {"hf_dir": args.model_dir, "name": args.shape}
    if args.mode == "rss-notebook":
        bridge = load_bridge(man, device="cpu")
    else:
        model = load_capture(man, "cpu", "float32", "compatibility", args.engine)
    ts = tokens(args.shape, args.docs, args.doc_len)
    settings = cache_settings(args.shape, args.batch_size)
    n_tok = int(ts.offsets[-1])
    bs = settings.batch_size
    batches = [torch.as_tensor(ts.flat[ts.offsets[i]: ts.offsets[min(i + bs, args.docs)]]
                               .reshape(-1, args.doc_len), dtype=torch.long)
               for i in range(0, args.docs, bs)]
    out = Path(args.tmp) / "acts.h5"
    rss_loaded = peak_rss_mb()

    cpu: dict[str, list[float]] = {"hf": [], "hf_lm": [], "engine": [], "cache": []}

    def run_cache() -> float:
        out.unlink(missing_ok=True)
        t0, c0 = time.perf_counter(), time.process_time()
        cache_activations(model, ts, out, settings, {"model": args.shape})
        cpu["cache"].append(time.process_time() - c0)
        return time.perf_counter() - t0

    if args.mode == "throughput":
        hf, _ = load_hf(man)

        def run_hf(lm: bool) -> float:
            t0, c0 = time.perf_counter(), time.process_time()
            with torch.inference_mode():
                for x in batches:
                    hf(x) if lm else hf.transformer(x)
            cpu["hf_lm" if lm else "hf"].append(time.process_time() - c0)
            return time.perf_counter() - t0

        def run_engine() -> float:
            t0, c0 = time.perf_counter(), time.process_time()
            for x in batches:
                model(x.numpy(), settings.hooks)
            cpu["engine"].append(time.process_time() - c0)
            return time.perf_counter() - t0

        runs = {"hf": lambda: run_hf(False), "hf_lm": lambda: run_hf(True), "engine": run_engine, "cache": run_cache}
        for fn in runs.values():  # warm-up
            fn()
        for v in cpu.values():
            v.clear()
        times: dict[str, list[float]] = {k: [] for k in runs}
        for r in range(args.repeats):
            for k in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
                times[k].append(runs[k]())

        def ratios(t: dict[str, list[float]], ref: str) -> dict[str, dict[str, float]]:
            return {k: {"best": min(t[ref]) / min(v),
                        "median_paired": statistics.median(a / b for a, b in zip(t[ref], v))}
                    for k, v in t.items() if k != ref}

        tps = {k: n_tok / min(v) for k, v in times.items()}
        cps = {k: n_tok / min(v) for k, v in cpu.items()}
        return {"mode": "throughput", "tokens": n_tok, "settings": settings.fingerprint_fields(),
                "times_s": times, "cpu_s": cpu, "tokens_per_s": tps, "tokens_per_cpu_s": cps,
                "load_average": os.getloadavg()[0],
                # ratio = tokens/s of the row / tokens/s of the reference = t_ref / t_row
                "wall_ratio_vs_hf": ratios(times, "hf"), "cpu_ratio_vs_hf": ratios(cpu, "hf"),
                "wall_ratio_vs_engine": ratios(times, "engine")["cache"],
                "cpu_ratio_vs_engine": ratios(cpu, "engine")["cache"],
                "file_mb": out.stat().st_size / 2**20}
    if args.mode == "rss-cache":
        secs = run_cache()
        return {"mode": "rss-cache", "docs": args.docs, "tokens": n_tok, "seconds": secs, "cpu_s": cpu["cache"][0],
                "peak_rss_mb": peak_rss_mb(), "rss_after_load_mb": rss_loaded, "file_mb": out.stat().st_size / 2**20}
    if args.mode == "rss-notebook":
        kept = []
        t0, c0 = time.perf_counter(), time.process_time()
        with torch.inference_mode():
            for x in batches:
                _, cache = bridge.run_with_cache(x)
                kept.append(cache)
        secs, cpu_s = time.perf_counter() - t0, time.process_time() - c0
        n_hooks = len(kept[0].keys()) if kept else 0
        return {"mode": "rss-notebook", "docs": args.docs, "tokens": n_tok, "seconds": secs, "cpu_s": cpu_s,
                "hooks": n_hooks,
                "peak_rss_mb": peak_rss_mb(), "rss_after_load_mb": rss_loaded}
    raise SystemExit(f"unknown mode {args.mode}")


def sub(args: argparse.Namespace, mode: str, docs: int, doc_len: int) -> dict:
    cmd = [sys.executable, __file__, "--worker", "--mode", mode, "--shape", args.shape, "--model-dir",
           args.model_dir, "--tmp", args.tmp, "--docs", str(docs), "--doc-len", str(doc_len),
           *(["--batch-size", str(args.batch_size)] if args.batch_size else []), "--repeats", str(args.repeats), "--engine", args.engine]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(proc.stderr[-3000:])
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    print(json.dumps(res), file=sys.stderr)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="gpt2-small")
    ap.add_argument("--docs", type=int, default=8, help="documents of the throughput run")
    ap.add_argument("--doc-len", type=int, default=None, help="tokens per document (default: 256, demo 64)")
    ap.add_argument("--batch-size", type=int, default=None, help="default: cache.batch_size of the shape's config")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rss-docs", type=int, nargs=2, default=[16, 256])
    ap.add_argument("--rss-doc-len", type=int, default=64)
    ap.add_argument("--notebook-docs", type=int, default=16)
    ap.add_argument("--engine", choices=["auto", "posmech", "bridge"], default="auto", help="cache.engine")
    ap.add_argument("--parts", nargs="+", choices=["throughput", "rss", "notebook"],
                    default=["throughput", "rss", "notebook"])
    ap.add_argument("--json-out")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    ap.add_argument("--tmp", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.doc_len is None:
        args.doc_len = 64 if args.shape == "demo" else 256
    if args.worker:
        print(json.dumps(worker(args)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        args.tmp = tmp
        args.model_dir = str(build_model(args.shape, Path(tmp) / "model"))
        res = {"shape": args.shape, "batch_size": args.batch_size, "engine": args.engine,
               "command": " ".join(sys.argv)}
        if "throughput" in args.parts:
            res["throughput"] = sub(args, "throughput", args.docs, args.doc_len)
        if "rss" in args.parts:
            res["rss"] = [sub(args, "rss-cache", n, args.rss_doc_len) for n in args.rss_docs]
            lo, hi = res["rss"]
            res["rss_growth"] = hi["peak_rss_mb"] / lo["peak_rss_mb"] - 1
        if "notebook" in args.parts:
            nb = sub(args, "rss-notebook", args.notebook_docs, args.rss_doc_len)
            same = sub(args, "rss-cache", args.notebook_docs, args.rss_doc_len)
            res["notebook"] = {"notebook": nb, "cache": same, "time_ratio_cache_over_notebook": same["seconds"] / nb["seconds"],
                               "cpu_ratio_cache_over_notebook": same["cpu_s"] / nb["cpu_s"],
                               "extra_rss_mb_notebook": nb["peak_rss_mb"] - nb["rss_after_load_mb"],
                               "extra_rss_mb_cache": same["peak_rss_mb"] - same["rss_after_load_mb"]}
    print(json.dumps(res, indent=2))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
