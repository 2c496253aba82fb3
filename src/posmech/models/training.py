"""The demo model: a small GPT-2-architecture character model trained by the pipeline
(rule ``train_demo_model``), seeded and deterministic on CPU.

Writes a Hugging Face directory and the same manifest as :mod:`posmech.models.loading`, so
every analysis loads it with :func:`posmech.models.loading.load_bridge`.
"""

from __future__ import annotations

import logging
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from posmech.io import atomic_path, write_json
from posmech.models.loading import BOS_TOKEN, HF_SUBDIR, MANIFEST, weights_digest

LOG = logging.getLogger(__name__)


def build_char_tokenizer(texts: list[str]) -> Any:
    """A character-level fast tokenizer over the characters of ``texts``; id 0 is the
    BOS/EOS token ``<|endoftext|>`` (as in GPT-2)."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    chars = sorted(set("".join(texts)))
    vocab = {BOS_TOKEN: 0, **{c: i + 1 for i, c in enumerate(chars)}}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None, fuse_unk=False))
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([BOS_TOKEN])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS_TOKEN, eos_token=BOS_TOKEN, pad_token=BOS_TOKEN, unk_token=None
    )


def _lr_at(step: int, cfg: dict[str, Any]) -> float:
    warm, total = cfg["warmup_steps"], cfg["steps"]
    if step < warm:
        return cfg["lr"] * (step + 1) / warm
    frac = (step - warm) / max(1, total - warm)
    return cfg["lr"] * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def previous_token_scores(model: Any, batches: list[Any]) -> np.ndarray:
    """Mean attention from each query position ``i >= 1`` to key ``i - 1``, per head.

    Returns ``[n_layers, n_heads]`` float64.  ``batches``: int64 tensors ``[batch, pos]``.
    """
    import torch

    total, count = None, 0
    with torch.inference_mode():
        for x in batches:
            att = model(x, output_attentions=True).attentions  # n_layers × [b, h, q, k]
            sub = torch.stack([a.diagonal(offset=-1, dim1=-2, dim2=-1) for a in att])  # [L, b, h, q-1]
            s = sub.double().sum(dim=(1, 3))
            total = s if total is None else total + s
            count += sub.shape[1] * sub.shape[3]
    return (total / count).cpu().numpy()


def train_demo_model(
    docs: list[dict[str, Any]], cfg: dict[str, Any], out_dir: str | os.PathLike[str], name: str = "demo"
) -> dict[str, Any]:
    """Train a small GPT-2-architecture character model on ``docs`` (deterministic on CPU).

    Every ``cfg['heldout_every']``-th document (by position in ``docs``) is held out.
    Training samples are ``[BOS] + (n_ctx - 1)`` characters from a random offset of the
    concatenated training text.  Writes a Hugging Face directory ``out_dir/hf`` and the
    manifest; returns ``{'curve': [...], 'summary': {...}}``.
    """
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(cfg["seed"])
    torch.use_deterministic_algorithms(True)
    k = cfg["heldout_every"]
    train_docs = [d["text"] for i, d in enumerate(docs) if i % k != 0]
    held_docs = [d["text"] for i, d in enumerate(docs) if i % k == 0]
    if not train_docs or not held_docs:
        raise PosmechError(
            f"config key `models.{name}.train`: corpus has {len(docs)} documents, too few to hold out "
            f"every {k}-th; add documents or lower `heldout_every`"
        )
    tok = build_char_tokenizer(train_docs + held_docs)
    n_ctx = cfg["n_ctx"]
    train_ids = np.asarray(tok("\n".join(train_docs)).input_ids, dtype=np.int64)
    held_ids = np.asarray(tok("\n".join(held_docs)).input_ids, dtype=np.int64)
    if len(train_ids) <= n_ctx or len(held_ids) <= n_ctx:
        raise PosmechError(f"config key `models.{name}.train.n_ctx`: {n_ctx} is longer than the corpus text")
    gen = np.random.default_rng(cfg["seed"])

    def batch(ids: np.ndarray, rng: np.random.Generator, size: int) -> torch.Tensor:
        starts = rng.integers(0, len(ids) - n_ctx, size=size)
        x = np.stack([ids[s : s + n_ctx - 1] for s in starts])
        x = np.concatenate([np.zeros((size, 1), dtype=np.int64), x], axis=1)
        return torch.from_numpy(x)

    eval_rng = np.random.default_rng(cfg["seed"] + 1)
    eval_batches = [batch(held_ids, eval_rng, cfg["batch_size"]) for _ in range(cfg["eval_batches"])]
    gcfg = GPT2Config(
        vocab_size=len(tok),
        n_positions=n_ctx,
        n_embd=cfg["d_model"],
        n_layer=cfg["n_layer"],
        n_head=cfg["n_head"],
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
        tie_word_embeddings=True,
    )
    model = GPT2LMHeadModel(gcfg)
    model.loss_type = "ForCausalLM"  # transformers finds no loss type in the class name and warns on every run
    model.config._attn_implementation = "eager"
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"])

    def heldout_loss() -> float:
        model.eval()
        with torch.inference_mode():
            losses = [float(model(x, labels=x).loss) for x in eval_batches]
        model.train()
        return float(np.mean(losses))

    curve: list[dict[str, float]] = []
    t0 = time.perf_counter()
    model.train()
    running = []
    tokens_per_step = cfg["batch_size"] * n_ctx
    for step in range(cfg["steps"]):
        for g in opt.param_groups:
            g["lr"] = _lr_at(step, cfg)
        x = batch(train_ids, gen, cfg["batch_size"])
        loss = model(x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        running.append(loss.item())
        last = step == cfg["steps"] - 1
        if (step + 1) % cfg["eval_every"] == 0 or last:
            elapsed = time.perf_counter() - t0
            row = {
                "step": step + 1,
                "tokens": (step + 1) * tokens_per_step,
                "train_loss": float(np.mean(running)),
                "heldout_loss": heldout_loss(),
                "lr": _lr_at(step, cfg),
                "elapsed_s": round(elapsed, 3),
            }
            running = []
            curve.append(row)
            LOG.info(
                "step %d/%d train %.3f held-out %.3f (%.0f tokens/s)",
                row["step"], cfg["steps"], row["train_loss"], row["heldout_loss"],
                row["tokens"] / max(elapsed, 1e-9),
            )
    train_s = time.perf_counter() - t0
    model.eval()
    scores = previous_token_scores(model, eval_batches)
    best = np.unravel_index(int(np.argmax(scores)), scores.shape)
    summary = {
        "model": name,
        "heldout_loss": curve[-1]["heldout_loss"],
        "heldout_loss_unit": "nats per token (character)",
        "train_seconds": round(train_s, 2),
        "tokens_per_second": round(cfg["steps"] * tokens_per_step / train_s, 1),
        "n_train_documents": len(train_docs),
        "n_heldout_documents": len(held_docs),
        "vocab_size": len(tok),
        "previous_token_scores": scores.round(6).tolist(),
        "best_previous_token_head": f"L{best[0]}H{best[1]}",
        "best_previous_token_score": float(scores[best]),
        "train_config": cfg,
    }
    out = Path(out_dir)
    with atomic_path(out / HF_SUBDIR) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
    manifest = {
        "name": name,
        "kind": "train",
        "source": "train_demo_model",
        "hf_dir": str((out / HF_SUBDIR).resolve()),
        "revision": None,
        "resolved_revision": f"trained:{weights_digest(out / HF_SUBDIR)}",
        "weights_sha256_16": weights_digest(out / HF_SUBDIR),
        "train_config": cfg,
        "heldout_loss": summary["heldout_loss"],
    }
    write_json(out / MANIFEST, manifest)
    return {"curve": curve, "summary": summary}
