"""Benchmark: one forward pass, engine by engine — CPU seconds (time.process_time) of a 1x1024
pass, 2 threads, median of 3 interleaved rounds.

Without ``--arch``: on the GPT-2-small-shaped stand-in that bench/study.py builds (run it
first) or the model directory given: Hugging Face with and without the LM head, the
TransformerBridge in compatibility mode, the posmech engine (posmech.models.lens) with and
without hooked patterns and with an early stop, and the activation cache's capture.

With ``--arch A [A ...]`` (opt, gpt_neox, llama, bloom, gpt2, gpt_neo, gptj, phi, gemma2,
falcon, gpt_bigcode, mpt, or ``all``): for each family a GPT-2-small-sized random model (12 layers,
d_model 768, 12 heads, MLP 3072, vocabulary 50257, context 1024; Llama and Gemma 2 with 4
key/value heads, grouped-query attention; Falcon and GPT-BigCode multi-query; GPT-J with 32 of
64 head dimensions rotated, Phi half, GPT-NeoX a quarter; MPT with 16 heads of 48, ALiBi's
slopes BLOOM's only for a power-of-two head count) built from its ``transformers`` config
and saved under /tmp/posmech-bench/<arch> (no Hub, a character tokenizer beside it): the bare
Hugging Face forward with logits (its default attention), the engine ``load_model`` runs for the
family with logits, the same engine with every layer's pattern hooked (no logits), and each
engine figure's ratio to the Hugging Face forward. The engine is posmech's
(``posmech.models.lens``, raw processing) where it runs the family, else the TransformerBridge
in the compatibility mode the analyses use by default (its column says which). ``--layers``
and ``--ctx`` shrink the model and the pass (defaults 12 and 1024) on a loaded machine.

    export PYTHONPATH=$PWD/src; .venv/bin/python bench/engine.py [/tmp/posmech-study/gpt2-random]
    export PYTHONPATH=$PWD/src; .venv/bin/python bench/engine.py --arch all [--layers 4 --ctx 512]
"""
import argparse
import os
import shutil
import time
from pathlib import Path

import numpy as np
import torch

torch.set_num_threads(2)
from transformers import AutoModelForCausalLM  # noqa: E402

from posmech.analyses.cache import load_capture  # noqa: E402
from posmech.models.lens import from_hf_dir  # noqa: E402
from posmech.models.loading import load_bridge, load_model  # noqa: E402

ARCHS = ("opt", "gpt_neox", "llama", "bloom", "gpt2", "gpt_neo", "gptj", "phi", "gemma2", "falcon", "gpt_bigcode",
         "mpt")
L, D, H, M, V, CTX = 12, 768, 12, 3072, 50257, 1024


def build(arch: str, d: Path) -> Path:
    """A GPT-2-small-sized random model of family ``arch`` saved in ``d``, with the character
    tokenizer of the hand-built models (the bridge loads one; the passes read ids only)."""
    import transformers as tf

    from posmech.models.handbuilt import char_tokenizer

    common = {"vocab_size": V, "bos_token_id": 0, "eos_token_id": 0}
    cfg = {
        "gpt2": lambda: tf.GPT2Config(n_embd=D, n_layer=L, n_head=H, n_positions=CTX, **common),
        "gpt_neo": lambda: tf.GPTNeoConfig(hidden_size=D, num_layers=L, num_heads=H, max_position_embeddings=CTX,
                                           attention_types=[[["global", "local"], L // 2]], window_size=256, **common),
        "opt": lambda: tf.OPTConfig(hidden_size=D, num_hidden_layers=L, num_attention_heads=H, ffn_dim=M,
                                    max_position_embeddings=CTX, word_embed_proj_dim=D, **common),
        "gpt_neox": lambda: tf.GPTNeoXConfig(hidden_size=D, num_hidden_layers=L, num_attention_heads=H,
                                             intermediate_size=M, max_position_embeddings=CTX, rotary_pct=0.25,
                                             **common),
        "llama": lambda: tf.LlamaConfig(hidden_size=D, num_hidden_layers=L, num_attention_heads=H,
                                        num_key_value_heads=4, intermediate_size=M, max_position_embeddings=CTX,
                                        **common),
        "bloom": lambda: tf.BloomConfig(hidden_size=D, n_layer=L, n_head=H, seq_length=CTX, **common),
        "gptj": lambda: tf.GPTJConfig(n_embd=D, n_layer=L, n_head=H, n_inner=M, n_positions=CTX, rotary_dim=32,
                                      **common),
        "phi": lambda: tf.PhiConfig(hidden_size=D, num_hidden_layers=L, num_attention_heads=H, intermediate_size=M,
                                    max_position_embeddings=CTX, partial_rotary_factor=0.5, **common),
        "gemma2": lambda: tf.Gemma2Config(hidden_size=D, num_hidden_layers=L, num_attention_heads=H,
                                          num_key_value_heads=4, head_dim=D // H, intermediate_size=M,
                                          max_position_embeddings=CTX, query_pre_attn_scalar=D // H,
                                          sliding_window=CTX // 2, **common),
        "falcon": lambda: tf.FalconConfig(hidden_size=D, num_hidden_layers=L, num_attention_heads=H, multi_query=True,
                                          new_decoder_architecture=False, parallel_attn=True, alibi=False,
                                          max_position_embeddings=CTX, **common),
        "gpt_bigcode": lambda: tf.GPTBigCodeConfig(n_embd=D, n_layer=L, n_head=H, n_inner=M, n_positions=CTX,
                                                   multi_query=True, **common),
        # ALiBi (BLOOM's slopes need a power-of-two head count: MPT's own differ otherwise, which
        # the engine refuses); the MLP is 4·d_model whatever expansion_ratio says
        "mpt": lambda: tf.MptConfig(d_model=D, n_layers=L, n_heads=16, max_seq_len=CTX, **common),
    }[arch]()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(d, safe_serialization=True)
    char_tokenizer(96).save_pretrained(d)
    return d


def measure(runs: dict, rounds: int = 3, warm: dict | None = None) -> dict:
    """Median CPU seconds of each run over ``rounds`` interleaved rounds, after one warm-up
    call of each (``warm``: cheaper warm-up calls, e.g. on a short input)."""
    res = {k: [] for k in runs}
    with torch.inference_mode():
        for f in (warm or runs).values():
            f()
        for _ in range(rounds):
            for k, f in runs.items():
                t = time.process_time()
                f()
                res[k].append(time.process_time() - t)
    return {k: float(np.median(v)) for k, v in res.items()}


pat = lambda n: [(f"blocks.{i}.attn.hook_pattern", lambda t, hook: None) for i in range(n)]  # noqa: E731


def per_arch(archs: list[str]) -> None:
    from posmech.models.lens import Lens

    x = torch.as_tensor(np.random.default_rng(0).integers(0, V, size=(1, CTX)))
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average at start {os.getloadavg()[0]:.2f}; "
          f"{L} layers, d_model {D}, a 1x{CTX} pass")
    print("| family | engine | HF forward, logits (s) | engine, logits (s) | ratio | engine, every pattern hooked (s) "
          "| ratio |")
    print("|---|---|---|---|---|---|---|")
    for arch in archs:
        d = Path("/tmp/posmech-bench") / f"{arch}-{L}x{CTX}"
        if not (d / "config.json").exists():
            build(arch, d)
        man = {"hf_dir": str(d), "name": arch}
        hf = AutoModelForCausalLM.from_pretrained(d).eval()
        # what load_model runs for the directory: the posmech engine (raw), else the bridge (compatibility)
        model = load_model(man, "cpu", "float32", "compatibility")
        if isinstance(model, Lens):
            model = from_hf_dir(d, None, "raw")
        which = "posmech" if isinstance(model, Lens) else "bridge"
        runs = lambda x: {"hf": lambda: hf(x, use_cache=False), "engine": lambda: model(x),  # noqa: E731
                          "hooked": lambda: model.run_with_hooks(x, fwd_hooks=pat(L), return_type=None)}
        t = measure(runs(x), warm=runs(x[:, :64]))  # warm-up on 64 tokens: the machine is shared
        print(f"| {arch} | {which} | {t['hf']:.2f} | {t['engine']:.2f} | {t['engine'] / t['hf']:.2f} | "
              f"{t['hooked']:.2f} | {t['hooked'] / t['hf']:.2f} |", flush=True)
        del hf, model
    print(f"load average at end {os.getloadavg()[0]:.2f}")


def single(D_: str) -> None:
    man = {"hf_dir": D_, "name": "x"}
    hf = AutoModelForCausalLM.from_pretrained(D_).eval()
    lens = load_model(man, "cpu", "float32", "compatibility", "posmech")
    br = load_bridge(man, "cpu", "float32", "compatibility")
    cap = load_capture(man, "cpu", "float32", "compatibility")
    x = torch.as_tensor(np.random.default_rng(0).integers(0, 50000, size=(1, 1024)))
    runs = {
      "HF forward with logits (the issue's floor)": lambda: hf(x, use_cache=False),
      "HF body, no LM head (bench/study.py's floor)": lambda: hf.transformer(x, use_cache=False),
      "bridge (compatibility), logits": lambda: br(x),
      "bridge, every layer's pattern hooked, no logits": lambda: br.run_with_hooks(x, fwd_hooks=pat(12),
                                                                                    return_type=None),
      "engine, logits": lambda: lens(x),
      "engine, every layer's pattern hooked, no logits": lambda: lens.run_with_hooks(x, fwd_hooks=pat(12),
                                                                                      return_type=None),
      "engine, layers 0-3 hooked (P5-style), no logits": lambda: lens.run_with_hooks(x, fwd_hooks=pat(4),
                                                                                      return_type=None),
      "cache capture (posmech engine, resid_pre + ln1_out)": lambda: cap(x.numpy(), ("resid_pre", "ln1_out")),
    }
    res = measure(runs)
    print(f"load average {os.getloadavg()[0]:.2f}")
    base = res["HF forward with logits (the issue's floor)"]
    for k, v in res.items():
        print(f"| {k} | {v:.2f} | {v / base:.2f} |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir", nargs="?", default="/tmp/posmech-study/gpt2-random")
    ap.add_argument("--arch", nargs="+", choices=(*ARCHS, "all"), help="per-family random models instead")
    ap.add_argument("--keep", action="store_true", help="keep the per-family models in /tmp/posmech-bench")
    ap.add_argument("--layers", type=int, default=L, help="layers of the per-family models (default 12)")
    ap.add_argument("--ctx", type=int, default=CTX, help="context and pass length of the per-family models (1024)")
    a = ap.parse_args()
    L, CTX = a.layers, a.ctx
    if a.arch:
        per_arch(list(ARCHS) if "all" in a.arch else a.arch)
        if not a.keep:
            shutil.rmtree("/tmp/posmech-bench", ignore_errors=True)
    else:
        single(a.model_dir)
