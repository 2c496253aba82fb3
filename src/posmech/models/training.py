"""Demo models trained by the pipeline (rule ``train_demo_model``): data mix, the three
architectures, training loop and the head scores measured on the result.

Three architectures (``models.<name>.train.architecture``):

- ``gpt2`` — a Hugging Face ``GPT2LMHeadModel`` (MLPs, learned absolute positions), saved
  as a Hugging Face directory: the path every GPT-2-style model takes.
- ``attn_only`` — an attention-only transformer in TransformerLens parametrisation
  (learned absolute positions added to the residual stream, LayerNorm before each
  attention layer, a final LayerNorm, no MLPs), saved as a *legacy TransformerLens
  checkpoint directory* (TransformerLens ``config.json`` with ``attn_only: true`` + the
  state dict as safetensors): exactly what ``fetch_model`` writes for
  ``NeelNanda/Attn_Only_2L512W_C4_Code`` (``attn-only-2l``), so the offline model goes
  through the same loader (:func:`posmech.models.loading.load_bridge` → native TransformerBridge).
- ``llama`` — a Hugging Face ``LlamaForCausalLM``: rotary positions on every dimension of
  each head (no positional embedding in the residual stream), RMSNorm, SwiGLU MLPs of width
  ``8/3 · d_model`` rounded up to a multiple of 8 (Llama's ratio), no biases, tied
  embeddings, no grouping of keys and values; saved as a Hugging Face directory, so it
  takes the path of any user's Llama-layout model (Llama, Mistral, Qwen2).

Silent attention (``gpt2`` and ``llama``): the attention output projection of each layer of
``silent_attention_layers`` is zero and frozen until step ``silent_attention_steps``, so that
those layers' heads write nothing to the residual stream and the circuit forms above them.

Data mix: a fraction ``repeat_fraction`` of the training sequences are ``[BOS]`` followed
by a segment of uniformly random characters repeated until the context is full (the
second copy is predictable only by induction); the rest are ``[BOS]`` + ``n_ctx − 1``
characters of the training text from a random offset.

Head scores (written to the training summary; all means over held-out data the model never
trained on):

- *held-out previous-token score* of a head: mean attention from query ``n`` to key ``n − 1``
  over queries ``n ≥ 1`` of the held-out text batches (not the analyses' *previous-token
  mass*, ``prev_token_mass`` of heads.csv: the same mean on the analysis documents;
  :mod:`posmech.core.names`);
- *held-out look-back-two score*: mean attention from ``n`` to ``n − 2`` over queries ``n ≥ 2``
  of the same batches (no threshold; the L5 role is decided on random tokens);
- *induction score*: on ``[BOS] + R + R`` (``R`` = ``induction_length`` uniformly random
  characters, fresh seed), mean attention from each query of the second copy to the token
  *after* that query token's previous occurrence (key ``n − len(R) + 1``);
- *P(correct) on repeated random characters*: mean probability the model gives to the
  correct next character at the queries of the second copy (predicting ``R[1:]``); the
  first copy's mean is reported beside it (chance level);
- *composition*: the best induction head's induction score again with the output of the
  previous-token head it reads (the best one in a layer below it) zeroed, and with every
  previous-token head below it scoring at least half as much zeroed (the induction head
  reads them iff its score drops), with P(correct) in the latter case.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from posmech.core.errors import PosmechError
from posmech.models.checkpoints import TRAINED_REVISION
from posmech.core.io import atomic_path, write_json
from posmech.models.loading import (
    BOS_TOKEN,
    HF_SUBDIR,
    MANIFEST,
    UNK_TOKEN,
    hash_weights,
    manifest_architecture,
    manifest_hf_dir,
    record_verified,
    verify_weights,
    weights_fix,
)

LOG = logging.getLogger(__name__)


# --------------------------------------------------------------------------- tokenizer
def build_char_tokenizer(texts: list[str]) -> Any:
    """A character-level fast tokenizer over the characters of ``texts``; id 0 is the
    BOS/EOS token ``<|endoftext|>`` (as in GPT-2), the last id the unknown token
    ``<|unk|>``: a character outside the training text becomes one unknown token (never
    dropped), counted by :func:`posmech.data.tokens.unknown_tokens` when a corpus is tokenized."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    chars = sorted(set("".join(texts)) - {UNK_TOKEN})
    vocab = {BOS_TOKEN: 0, **{c: i + 1 for i, c in enumerate(chars)}, UNK_TOKEN: len(chars) + 1}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK_TOKEN, fuse_unk=False))
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([BOS_TOKEN, UNK_TOKEN])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS_TOKEN, eos_token=BOS_TOKEN, pad_token=BOS_TOKEN, unk_token=UNK_TOKEN
    )


def encode_chars(tok: Any, text: str) -> np.ndarray:
    """``tok(text).input_ids`` of a :func:`build_char_tokenizer` tokenizer as int64, by a
    table lookup per distinct character: the same ids (one per character, the unknown
    token's for a character outside the vocabulary), without the tokenizer's BPE pass over
    the text as one word (~5 CPU s per million characters; the Bible is 4.3 million). A text
    containing a special token's string is left to the tokenizer, which matches it whole."""
    if BOS_TOKEN in text or UNK_TOKEN in text:
        return np.asarray(tok(text).input_ids, dtype=np.int64)
    vocab = tok.get_vocab()
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    distinct, where = np.unique(codes, return_inverse=True)
    ids = np.array([vocab.get(chr(c), vocab[UNK_TOKEN]) for c in distinct], dtype=np.int64)
    return ids[where.reshape(-1)]


# --------------------------------------------------------------------------- data
def text_batch(ids: np.ndarray, rng: np.random.Generator, size: int, n_ctx: int) -> np.ndarray:
    """``[size, n_ctx]`` int64: ``[BOS]`` + ``n_ctx − 1`` consecutive ids from random offsets."""
    starts = rng.integers(0, len(ids) - n_ctx, size=size)
    x = np.stack([ids[s : s + n_ctx - 1] for s in starts])
    return np.concatenate([np.zeros((size, 1), dtype=np.int64), x], axis=1)


def repeat_batch(rng: np.random.Generator, size: int, n_ctx: int, length: int, vocab_size: int) -> np.ndarray:
    """``[size, n_ctx]`` int64: ``[BOS]`` + a segment of ``length`` ids drawn uniformly from
    ``1 .. vocab_size − 1`` (never BOS), repeated until ``n_ctx`` tokens."""
    if length < 1 or length > n_ctx - 1:
        raise PosmechError(f"repeated segment length {length} must be in 1 .. n_ctx − 1 = {n_ctx - 1}")
    seg = rng.integers(1, vocab_size, size=(size, length))
    reps = -(-(n_ctx - 1) // length)
    body = np.tile(seg, (1, reps))[:, : n_ctx - 1]
    return np.concatenate([np.zeros((size, 1), dtype=np.int64), body], axis=1)


def mixed_batch(ids: np.ndarray, rng: np.random.Generator, cfg: dict[str, Any], vocab_size: int) -> np.ndarray:
    """One training batch: ``round(repeat_fraction · batch_size)`` repeated random segments
    (length drawn uniformly from ``repeat_min_length .. repeat_max_length``, one per
    sequence), the rest text windows; rows in a fixed order (repeats first)."""
    size, n_ctx = cfg["batch_size"], cfg["n_ctx"]
    n_rep = int(round(cfg["repeat_fraction"] * size))
    parts = [text_batch(ids, rng, size - n_rep, n_ctx)] if n_rep < size else []
    lo, hi = repeat_lengths(cfg)
    for _ in range(n_rep):
        parts.append(repeat_batch(rng, 1, n_ctx, int(rng.integers(lo, hi + 1)), vocab_size))
    return np.concatenate(parts[::-1], axis=0)


def repeat_lengths(cfg: dict[str, Any]) -> tuple[int, int]:
    """``(min, max)`` repeated-segment length; ``null`` keys → 4 and ``(n_ctx − 1) // 2``."""
    hi = cfg.get("repeat_max_length") or (cfg["n_ctx"] - 1) // 2
    lo = cfg.get("repeat_min_length") or min(4, hi)
    if not 1 <= lo <= hi <= cfg["n_ctx"] - 1:
        raise PosmechError(
            f"config keys `train.repeat_min_length`/`repeat_max_length`: need 1 <= {lo} <= {hi} <= n_ctx − 1 "
            f"= {cfg['n_ctx'] - 1}"
        )
    return lo, hi


# --------------------------------------------------------------------------- attention-only model
def _ln(x: Any, w: Any, b: Any, eps: float = 1e-5) -> Any:
    x = x - x.mean(-1, keepdim=True)
    return x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt() * w + b


class AttnOnly:
    """Factory for the attention-only transformer (TransformerLens parametrisation and
    numerics: LayerNorm eps 1e-5, scores ``q·k / sqrt(d_head)``, causal mask)."""

    @staticmethod
    def build(d_vocab: int, n_ctx: int, d_model: int, n_layers: int, n_heads: int, d_head: int, seed: int) -> Any:
        import torch

        class Model(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                g = torch.Generator().manual_seed(seed)
                std = 0.02

                def p(*shape: int, scale: float = std) -> torch.nn.Parameter:
                    return torch.nn.Parameter(torch.randn(*shape, generator=g) * scale)

                def const(v: float, *shape: int) -> torch.nn.Parameter:
                    return torch.nn.Parameter(torch.full(shape, float(v)))

                self.cfg = dict(d_vocab=d_vocab, n_ctx=n_ctx, d_model=d_model, n_layers=n_layers,
                                n_heads=n_heads, d_head=d_head)
                self.params = torch.nn.ParameterDict({"embed__W_E": p(d_vocab, d_model),
                                                      "pos_embed__W_pos": p(n_ctx, d_model)})
                for layer in range(n_layers):
                    pre = f"blocks__{layer}__"
                    self.params[pre + "ln1__w"] = const(1.0, d_model)
                    self.params[pre + "ln1__b"] = const(0.0, d_model)
                    for m in "QKV":
                        self.params[pre + f"attn__W_{m}"] = p(n_heads, d_model, d_head)
                        self.params[pre + f"attn__b_{m}"] = const(0.0, n_heads, d_head)
                    self.params[pre + "attn__W_O"] = p(n_heads, d_head, d_model, scale=std / math.sqrt(2 * n_layers))
                    self.params[pre + "attn__b_O"] = const(0.0, d_model)
                self.params["ln_final__w"] = const(1.0, d_model)
                self.params["ln_final__b"] = const(0.0, d_model)
                self.params["unembed__W_U"] = p(d_model, d_vocab)
                self.params["unembed__b_U"] = const(0.0, d_vocab)

            def forward(self, x: Any, patterns: list[Any] | None = None, ablate: set[tuple[int, int]] | None = None) -> Any:
                P = self.params
                n = x.shape[1]
                resid = P["embed__W_E"][x] + P["pos_embed__W_pos"][:n]
                mask = torch.triu(torch.ones(n, n, dtype=torch.bool, device=x.device), 1)
                for layer in range(self.cfg["n_layers"]):
                    pre = f"blocks__{layer}__"
                    h = _ln(resid, P[pre + "ln1__w"], P[pre + "ln1__b"])
                    q = torch.einsum("bpd,hde->bhpe", h, P[pre + "attn__W_Q"]) + P[pre + "attn__b_Q"][:, None]
                    k = torch.einsum("bpd,hde->bhpe", h, P[pre + "attn__W_K"]) + P[pre + "attn__b_K"][:, None]
                    v = torch.einsum("bpd,hde->bhpe", h, P[pre + "attn__W_V"]) + P[pre + "attn__b_V"][:, None]
                    s = (q @ k.transpose(-1, -2)) / math.sqrt(self.cfg["d_head"])
                    pat = s.masked_fill(mask, float("-inf")).softmax(-1)
                    if patterns is not None:
                        patterns.append(pat)
                    z = pat @ v  # [b, h, p, e]
                    if ablate:
                        keep = torch.ones(self.cfg["n_heads"], device=x.device)
                        for al, ah in ablate:
                            if al == layer:
                                keep[ah] = 0.0
                        z = z * keep[None, :, None, None]
                    resid = resid + torch.einsum("bhpe,hed->bpd", z, P[pre + "attn__W_O"]) + P[pre + "attn__b_O"]
                h = _ln(resid, P["ln_final__w"], P["ln_final__b"])
                return h @ P["unembed__W_U"] + P["unembed__b_U"]

            def tl_state_dict(self) -> dict[str, Any]:
                return {k.replace("__", "."): v.detach().clone().contiguous() for k, v in self.params.items()}

            def tl_config(self) -> dict[str, Any]:
                c = self.cfg
                return {
                    "d_model": c["d_model"], "n_layers": c["n_layers"], "d_mlp": -1, "d_head": c["d_head"],
                    "n_heads": c["n_heads"], "n_ctx": c["n_ctx"], "d_vocab": c["d_vocab"], "act_fn": "solu_ln",
                    "initializer_range": 0.02,  # std of __init__'s weights (a twin is drawn with it)
                    "attn_only": True, "normalization_type": "LN", "positional_embedding_type": "standard",
                    "shortformer_pos": False, "tokenizer_name": None, "original_architecture": "posmech-demo",
                }

        return Model()


# --------------------------------------------------------------------------- one interface to both
class _Runner:
    """Logits, per-layer patterns ``[b, h, q, k]`` and head ablation for every architecture
    (the Hugging Face ones with eager attention: ``output_attentions`` gives the patterns;
    a head is ablated by zeroing its slice of the attention output projection's input)."""

    def __init__(self, model: Any, arch: str) -> None:
        self.model, self.arch = model, arch

    def logits(self, x: Any) -> Any:
        return self.model(x) if self.arch == "attn_only" else self.model(x).logits


    def run(self, x: Any, ablate: set[tuple[int, int]] | None = None) -> tuple[Any, list[Any]]:
        if self.arch == "attn_only":
            pats: list[Any] = []
            return self.model(x, patterns=pats, ablate=ablate), pats
        handles = []
        c = self.model.config
        d = c.hidden_size // c.num_attention_heads
        for layer, head in ablate or ():

            def pre(mod: Any, args: Any, head: int = head) -> Any:
                z = args[0].clone()
                z[..., head * d : (head + 1) * d] = 0.0
                return (z,)

            handles.append(attention_out_proj(self.model, self.arch, layer).register_forward_pre_hook(pre))
        try:
            out = self.model(x, output_attentions=True)
        finally:
            for h in handles:
                h.remove()
        return out.logits, list(out.attentions)


# --------------------------------------------------------------------------- head scores
def diagonal_scores(runner: _Runner, batches: list[Any], offset: int) -> np.ndarray:
    """Mean attention from query ``n`` to key ``n − offset`` over queries ``n ≥ offset``,
    per head: ``[n_layers, n_heads]`` float64."""
    import torch

    total, count = None, 0
    with torch.inference_mode():
        for x in batches:
            _, att = runner.run(x)
            sub = torch.stack([a.diagonal(offset=-offset, dim1=-2, dim2=-1) for a in att])  # [L, b, h, q-offset]
            s = sub.double().sum(dim=(1, 3))
            total = s if total is None else total + s
            count += sub.shape[1] * sub.shape[3]
    if not count:
        raise PosmechError("head scores: no query positions to average over (context too short)")
    return (total / count).cpu().numpy()


def induction_scores(
    runner: _Runner, x: Any, length: int, ablate: set[tuple[int, int]] | None = None
) -> tuple[np.ndarray, float, float]:
    """On ``x = [BOS] + R + R`` (``R`` of ``length`` tokens): per-head mean attention from
    the second copy's queries to the key after the previous occurrence
    (``[n_layers, n_heads]``), and the mean P(correct next token) on the second copy
    (predicting ``R[1:]``) and on the first (chance level)."""
    import torch

    with torch.inference_mode():
        logits, att = runner.run(x, ablate)
        q = torch.arange(1 + length, 1 + 2 * length)
        k = q - length + 1
        scores = torch.stack([a[:, :, q, k].double().mean(dim=(0, 2)) for a in att]).cpu().numpy()
        probs = logits.double().softmax(-1)
        nxt = x[:, 1:]
        p = probs[:, :-1].gather(-1, nxt[..., None])[..., 0]  # p[:, i] = P(x[i+1] | x[..i])
        second = float(p[:, 1 + length : 2 * length].mean())
        first = float(p[:, 1:length].mean())
    return scores, second, first


def _best(scores: np.ndarray, min_layer: int = 0) -> tuple[int, int]:
    s = np.array(scores, dtype=float)
    s[:min_layer] = -np.inf
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(s)), s.shape))  # type: ignore[return-value]


def head_scores(runner: _Runner, held: list[Any], cfg: dict[str, Any], vocab_size: int) -> dict[str, Any]:
    """Every score of the module docstring, per head and for the best heads."""
    import torch

    prev = diagonal_scores(runner, held, 1)
    two = diagonal_scores(runner, held, 2)
    length = cfg["induction_length"]
    rng = np.random.default_rng(cfg["seed"] + 2)
    rep = repeat_batch(rng, cfg["induction_samples"], 1 + 2 * length, length, vocab_size)
    x = torch.from_numpy(rep)
    ind, p_second, p_first = induction_scores(runner, x, length)
    n_layers = prev.shape[0]
    ih = _best(ind, min_layer=1) if n_layers > 1 else _best(ind)
    # the previous-token head that the induction head reads: the best one below it
    ph = _best(prev[: ih[0]]) if ih[0] > 0 else _best(prev)
    # every previous-token head below the induction head with at least half the best one's score
    below = max(ih[0], 1)
    group = sorted({ph} | {(int(a), int(b)) for a, b in zip(*np.nonzero(prev[:below] >= 0.5 * prev[ph]))})
    ind_one, _, _ = induction_scores(runner, x, length, ablate={ph})
    ind_ablated, p_ablated, _ = induction_scores(runner, x, length, ablate=set(group))
    name = lambda lh: f"L{lh[0]}H{lh[1]}"  # noqa: E731
    best_prev = _best(prev)
    best_prev_upper = _best(prev, min_layer=1) if n_layers > 1 else best_prev
    best_two = _best(two)
    return {
        "previous_token_scores": prev.round(6).tolist(),
        "look_back_two_scores": two.round(6).tolist(),
        "induction_scores": ind.round(6).tolist(),
        "best_previous_token_head": name(best_prev),
        "best_previous_token_score": float(prev[best_prev]),
        "best_previous_token_head_layer_ge_1": name(best_prev_upper),
        "best_previous_token_score_layer_ge_1": float(prev[best_prev_upper]),
        "best_look_back_two_head": name(best_two),
        "best_look_back_two_score": float(two[best_two]),
        "best_induction_head": name(ih),
        "best_induction_score": float(ind[ih]),
        "induction_reads_head": name(ph),
        "induction_reads_head_previous_token_score": float(prev[ph]),
        "induction_score_with_read_head_ablated": float(ind_one[ih]),
        "previous_token_heads_below": [name(h) for h in group],
        "induction_score_with_previous_token_heads_ablated": float(ind_ablated[ih]),
        "p_correct_repeated": p_second,
        "p_correct_repeated_ablated": p_ablated,
        "p_correct_first_copy": p_first,
        "induction_length": length,
        "induction_samples": cfg["induction_samples"],
    }


# --------------------------------------------------------------------------- training
def lr_at(step: int, cfg: dict[str, Any]) -> float:
    """Linear warm-up to ``lr`` over ``warmup_steps``, then cosine decay to 10 % of ``lr``."""
    warm, total = cfg["warmup_steps"], cfg["steps"]
    if step < warm:
        return cfg["lr"] * (step + 1) / warm
    frac = (step - warm) / max(1, total - warm)
    return cfg["lr"] * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


#: the architectures saved as Hugging Face directories (``attn_only``: a legacy TransformerLens one)
HF_ARCHITECTURES = ("gpt2", "llama")

TRAIN_DEFAULTS: dict[str, Any] = {
    "architecture": "gpt2", "n_layer": 2, "n_head": 4, "d_model": 64, "n_ctx": 64, "steps": 1500,
    "batch_size": 32, "lr": 0.006, "weight_decay": 0.01, "warmup_steps": 100, "heldout_every": 20,
    "eval_every": 100, "eval_batches": 8, "seed": 0, "repeat_fraction": 0.0, "repeat_min_length": None,
    "repeat_max_length": None, "induction_length": None, "induction_samples": 64, "threads": None,
    "silent_attention_layers": [], "silent_attention_steps": None, "checkpoints": [],
}

#: where a training job saves its checkpoints, beside its model (``step<N>/hf``; rule
#: ``checkpoint_model`` makes each the model ``<model>@step<N>``, posmech.models.checkpoints)
CHECKPOINTS_SUBDIR = "checkpoints"
#: beside each saved checkpoint's ``hf/`` (``checkpoints/step<N>/``): the sha256 of its weights
#: files, recorded by the training when it saves them (``step``, ``weights_sha256`` ``{file:
#: sha256}``, ``weights_sha256_16``); rule ``checkpoint_model`` and the check before any job
#: compare the bytes with it (:func:`saved_checkpoint_manifest`)
CHECKPOINT_RECORD = "weights.sha256.json"


def _save_checkpoint(model: Any, tok: Any, cfg: dict[str, Any], ckpt_dir: Path, step: int) -> None:
    """Save the weights after ``step`` in ``ckpt_dir/step<N>/hf`` and record their hashes
    beside it (:data:`CHECKPOINT_RECORD`, and the verified-hash cache, so that the first check
    is a stat)."""
    step_dir = ckpt_dir / TRAINED_REVISION.format(step)
    _save(model, tok, cfg, step_dir / HF_SUBDIR)
    full, digest = hash_weights(step_dir / HF_SUBDIR)
    write_json(step_dir / CHECKPOINT_RECORD, {"step": step, "weights_sha256": full, "weights_sha256_16": digest})
    record_verified(step_dir, step_dir / HF_SUBDIR, full)


def saved_checkpoint_manifest(model: str, step: int, checkpoints_dir: str | os.PathLike[str],
                              require_record: bool = True) -> dict[str, Any] | None:
    """The checkpoint ``step`` that the training of ``model`` saved in ``checkpoints_dir``, as
    a manifest :func:`posmech.models.loading.verify_weights` checks (kind ``saved_checkpoint``:
    its fix retrains the model): ``None`` when the training saved no such checkpoint; a
    :class:`PosmechError` when it saved one without a readable hash record (nothing to check
    its bytes against), unless the record is absent and not ``require_record`` (then ``None``:
    a training before the record existed, whose checkpoint no job may copy again)."""
    from posmech.models.checkpoints import checkpoint_name

    rev = TRAINED_REVISION.format(step)
    step_dir = Path(checkpoints_dir) / rev
    record = step_dir / CHECKPOINT_RECORD
    if not (step_dir / HF_SUBDIR).is_dir():
        return None
    manifest = {"name": checkpoint_name(model, rev), "kind": "saved_checkpoint", "checkpoint_of": model,
                "step": step, "hf_dir": str((step_dir / HF_SUBDIR).resolve()), "manifest_path": str(record),
                "recorded_in": f"the training's record {os.path.relpath(record)!r}"}
    if not require_record and not record.exists():
        return None
    try:
        rec = json.loads(record.read_text())
        full = rec["weights_sha256"]
        if not isinstance(full, dict) or not full:
            raise ValueError("no weights_sha256")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise PosmechError(
            f"model {manifest['name']!r}: the checkpoint the training of {model!r} saved in "
            f"{os.path.relpath(step_dir / HF_SUBDIR)!r} has no readable record of its hashes, "
            f"{os.path.relpath(record)!r} ({'missing' if isinstance(err, FileNotFoundError) else err}: saved by a "
            f"posmech that did not record them yet, or removed since), so its bytes cannot be checked. "
            f"Fix: {weights_fix(manifest)}") from None
    return {**manifest, "weights_sha256": full, "weights_sha256_16": rec.get("weights_sha256_16")}


def _build_model(cfg: dict[str, Any], vocab_size: int) -> Any:
    import torch

    silent = cfg.get("silent_attention_layers") or []
    if silent and (cfg["architecture"] not in HF_ARCHITECTURES or max(silent) >= cfg["n_layer"]):
        raise PosmechError(
            f"config key `train.silent_attention_layers`: {silent} needs architecture gpt2 or llama and layers "
            f"< n_layer = {cfg['n_layer']}"
        )

    if cfg["architecture"] == "attn_only":
        if cfg["d_model"] % cfg["n_head"]:
            raise PosmechError(f"config key `train.d_model`: {cfg['d_model']} is not a multiple of n_head {cfg['n_head']}")
        return AttnOnly.build(vocab_size, cfg["n_ctx"], cfg["d_model"], cfg["n_layer"], cfg["n_head"],
                              cfg["d_model"] // cfg["n_head"], cfg["seed"])
    if cfg["architecture"] == "llama":
        return _silence(_build_llama(cfg, vocab_size), cfg)
    if cfg["architecture"] != "gpt2":
        raise PosmechError(
            f"config key `train.architecture`: {cfg['architecture']!r}; expected gpt2, attn_only or llama")
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(cfg["seed"])
    gcfg = GPT2Config(
        vocab_size=vocab_size, n_positions=cfg["n_ctx"], n_embd=cfg["d_model"], n_layer=cfg["n_layer"],
        n_head=cfg["n_head"], resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
        eos_token_id=0, tie_word_embeddings=True,
    )
    model = GPT2LMHeadModel(gcfg)
    model.loss_type = "ForCausalLM"  # transformers finds no loss type in the class name and warns when asked for a loss
    model.config._attn_implementation = "eager"
    return _silence(model, cfg)


def attention_out_proj(model: Any, arch: str, layer: int) -> Any:
    """The attention output projection of ``layer`` of a Hugging Face demo model (``gpt2``:
    ``c_proj``, ``llama``: ``o_proj``): its input is the heads' outputs side by side."""
    if arch == "gpt2":
        return model.transformer.h[layer].attn.c_proj
    return model.model.layers[layer].self_attn.o_proj


def _silence(model: Any, cfg: dict[str, Any]) -> Any:
    """Zero and freeze the attention output projection (weight and bias, if any) of each layer
    of ``silent_attention_layers`` (until step ``silent_attention_steps``, if set): the layer's
    heads write nothing to the residual stream."""
    import torch

    for layer in cfg.get("silent_attention_layers") or []:
        for p in attention_out_proj(model, cfg["architecture"], layer).parameters():
            with torch.no_grad():
                p.zero_()
            p.requires_grad_(False)
    return model


def llama_mlp_width(d_model: int) -> int:
    """SwiGLU width of the ``llama`` demo architecture: ``8/3 · d_model`` (Llama's ratio,
    the parameter count of a 4·d_model GELU MLP) rounded up to a multiple of 8."""
    width = -(-8 * d_model // 3)
    return -(-width // 8) * 8


def train_work(cfg: dict[str, Any]) -> float:
    """The work of a training, to order trainings by length (not a time): ``steps × batch_size
    × n_ctx`` tokens times the parameters of the transformer blocks, ``n_layer`` × (attention
    ``4 · d_model²`` + MLP: ``8 · d_model²`` for ``gpt2``, ``3 · d_model · w`` for ``llama``
    with ``w`` its SwiGLU width, none for ``attn_only``); ``cfg``: a ``train`` section
    (:data:`TRAIN_DEFAULTS` fill the rest)."""
    c = {**TRAIN_DEFAULTS, **cfg}
    d = int(c["d_model"])
    mlp = {"gpt2": 8 * d * d, "llama": 3 * d * llama_mlp_width(d), "attn_only": 0}[c["architecture"]]
    return float(c["steps"]) * c["batch_size"] * c["n_ctx"] * c["n_layer"] * (4 * d * d + mlp)


def _build_llama(cfg: dict[str, Any], vocab_size: int) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if cfg["d_model"] % cfg["n_head"] or (cfg["d_model"] // cfg["n_head"]) % 2:
        raise PosmechError(
            f"config key `train.d_model`: {cfg['d_model']} must be a multiple of n_head {cfg['n_head']} with an even "
            "head width (rotary rotates pairs of dimensions)")
    torch.manual_seed(cfg["seed"])
    lcfg = LlamaConfig(
        vocab_size=vocab_size, hidden_size=cfg["d_model"], intermediate_size=llama_mlp_width(cfg["d_model"]),
        num_hidden_layers=cfg["n_layer"], num_attention_heads=cfg["n_head"], num_key_value_heads=cfg["n_head"],
        max_position_embeddings=cfg["n_ctx"], bos_token_id=0, eos_token_id=0, pad_token_id=0,
        tie_word_embeddings=True, attention_dropout=0.0, use_cache=False,
    )
    lcfg._attn_implementation = "eager"  # output_attentions gives the patterns of the head scores
    return LlamaForCausalLM(lcfg)


def _save(model: Any, tok: Any, cfg: dict[str, Any], hf_dir: Path) -> None:
    import json

    from safetensors.torch import save_file

    with atomic_path(hf_dir) as tmp:
        if cfg["architecture"] in HF_ARCHITECTURES:
            model.save_pretrained(tmp, safe_serialization=True)
        else:
            Path(tmp).mkdir(parents=True, exist_ok=True)
            save_file(model.tl_state_dict(), str(Path(tmp) / "model.safetensors"))
            (Path(tmp) / "config.json").write_text(json.dumps(model.tl_config(), indent=2))
        tok.save_pretrained(tmp)


def train_demo_model(
    docs: list[dict[str, Any]], cfg: dict[str, Any], out_dir: str | os.PathLike[str], name: str = "demo"
) -> dict[str, Any]:
    """Train a small character model on ``docs`` (deterministic on CPU); see the module
    docstring for the architectures, the data mix and the scores.

    Every ``cfg['heldout_every']``-th document (by position in ``docs``) is held out.
    Writes the model directory ``out_dir/hf`` and the manifest; returns
    ``{'curve': [...], 'summary': {...}}``.
    """
    import torch


    cfg = {**TRAIN_DEFAULTS, **cfg}
    if cfg["induction_length"] is None:
        cfg["induction_length"] = (cfg["n_ctx"] - 1) // 2
    if not 2 <= cfg["induction_length"] <= (cfg["n_ctx"] - 1) // 2:
        raise PosmechError(
            f"config key `models.{name}.train.induction_length`: {cfg['induction_length']} must be in "
            f"2 .. (n_ctx − 1) // 2 = {(cfg['n_ctx'] - 1) // 2}"
        )
    if cfg["repeat_fraction"] > 0:
        repeat_lengths(cfg)
    if cfg["threads"]:
        torch.set_num_threads(int(cfg["threads"]))
    torch.manual_seed(cfg["seed"])
    torch.use_deterministic_algorithms(True)
    # ... without filling every new tensor with NaN first (the default under deterministic
    # algorithms, a guard for kernels that read memory they never wrote): ~170-300 fills a
    # step here; the trained weights are bit-identical either way
    torch.utils.deterministic.fill_uninitialized_memory = False
    k = cfg["heldout_every"]
    train_docs = [d["text"] for i, d in enumerate(docs) if i % k != 0]
    held_docs = [d["text"] for i, d in enumerate(docs) if i % k == 0]
    if not train_docs or not held_docs:
        raise PosmechError(
            f"config key `models.{name}.train`: corpus has {len(docs)} documents, too few to hold out "
            f"every {k}-th; add documents or lower `heldout_every`"
        )
    tok = build_char_tokenizer(train_docs + held_docs)
    V = len(tok)
    n_ctx = cfg["n_ctx"]
    train_ids = encode_chars(tok, "\n".join(train_docs))
    held_ids = encode_chars(tok, "\n".join(held_docs))
    if len(train_ids) <= n_ctx or len(held_ids) <= n_ctx:
        raise PosmechError(f"config key `models.{name}.train.n_ctx`: {n_ctx} is longer than the corpus text")
    gen = np.random.default_rng(cfg["seed"])
    eval_rng = np.random.default_rng(cfg["seed"] + 1)
    eval_batches = [
        torch.from_numpy(text_batch(held_ids, eval_rng, cfg["batch_size"], n_ctx)) for _ in range(cfg["eval_batches"])
    ]
    model = _build_model(cfg, V)
    runner = _Runner(model, cfg["architecture"])
    # foreach: one multi-tensor call per update instead of a Python loop over the ~20-30
    # parameters (the default on CPU); the same arithmetic, bit-identical weights
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"], foreach=True)

    def loss_of(x: Any) -> Any:
        logits = runner.logits(x)
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, V), x[:, 1:].reshape(-1))

    def heldout_loss() -> float:
        model.eval()
        with torch.inference_mode():
            losses = [float(loss_of(x)) for x in eval_batches]
        model.train()
        return float(np.mean(losses))

    curve: list[dict[str, float]] = []
    t0, c0 = time.perf_counter(), time.process_time()
    model.train()
    running = []
    tokens_per_step = cfg["batch_size"] * n_ctx
    saves = {int(s) for s in cfg.get("checkpoints") or []}
    ckpt_dir = Path(out_dir) / CHECKPOINTS_SUBDIR
    ckpt_dir.mkdir(parents=True, exist_ok=True)  # the job's output, empty without checkpoints
    if 0 in saves:  # the initialisation
        _save_checkpoint(model, tok, cfg, ckpt_dir, 0)
    for step in range(cfg["steps"]):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        if step == cfg.get("silent_attention_steps") and cfg.get("silent_attention_layers"):
            for layer in cfg["silent_attention_layers"]:  # the layers' attention may now learn to write
                for p in attention_out_proj(model, cfg["architecture"], layer).parameters():
                    p.requires_grad_(True)
        x = torch.from_numpy(mixed_batch(train_ids, gen, cfg, V))
        loss = loss_of(x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()
        running.append(loss.item())
        if step + 1 in saves:  # the weights after this step (saving reads them, changes nothing)
            _save_checkpoint(model, tok, cfg, ckpt_dir, step + 1)
            LOG.info("checkpoint: step %d saved", step + 1)
        last = step == cfg["steps"] - 1
        if (step + 1) % cfg["eval_every"] == 0 or last:
            elapsed = time.perf_counter() - t0
            row = {
                "step": step + 1,
                "tokens": (step + 1) * tokens_per_step,
                "train_loss": float(np.mean(running)),
                "heldout_loss": heldout_loss(),
                "lr": lr_at(step, cfg),
                "elapsed_s": round(elapsed, 3),
            }
            running = []
            curve.append(row)
            LOG.info(
                "step %d/%d train %.3f held-out %.3f (%.0f tokens/s)",
                row["step"], cfg["steps"], row["train_loss"], row["heldout_loss"],
                row["tokens"] / max(elapsed, 1e-9),
            )
    train_s, train_cpu = time.perf_counter() - t0, time.process_time() - c0
    model.eval()
    scores = head_scores(runner, eval_batches, cfg, V)
    summary = {
        "model": name,
        "architecture": cfg["architecture"],
        "heldout_loss": curve[-1]["heldout_loss"],
        "heldout_loss_unit": "nats per token (character)",
        "train_seconds": round(train_s, 2),
        "train_cpu_seconds": round(train_cpu, 2),
        "tokens_per_second": round(cfg["steps"] * tokens_per_step / train_s, 1),
        "n_train_documents": len(train_docs),
        "n_heldout_documents": len(held_docs),
        "vocab_size": V,
        **scores,
        "score_definitions": SCORE_DEFINITIONS,
        "train_config": cfg,
    }
    out = Path(out_dir)
    _save(model, tok, cfg, out / HF_SUBDIR)
    write_trained_manifest(out, name, cfg, {"kind": "train", "revision": None,
                                            "heldout_loss": summary["heldout_loss"]})
    return {"curve": curve, "summary": summary}


def write_trained_manifest(out: Path, name: str, cfg: dict[str, Any], fields: dict[str, Any],
                           hashes: tuple[dict[str, str], str] | None = None) -> dict[str, Any]:
    """Hash the weights of ``out/hf`` (or take ``hashes``, :func:`hash_weights` of those very
    files) and write the manifest of a model the pipeline trained (``fields``: its kind,
    revision and what else it records); returns the manifest."""
    full, digest = hashes if hashes is not None else hash_weights(out / HF_SUBDIR)
    manifest = {
        "name": name,
        "kind": fields["kind"],
        "source": "train_demo_model",
        "hf_dir": manifest_hf_dir(out / HF_SUBDIR, out),
        "revision": fields["revision"],
        "resolved_revision": f"trained:{digest}",
        "weights_sha256_16": digest,
        "weights_sha256": full,
        "train_config": cfg,
        **{k: v for k, v in fields.items() if k not in ("kind", "revision")},
        "architecture": manifest_architecture(out / HF_SUBDIR, name),
    }
    write_json(out / MANIFEST, manifest)
    record_verified(out, out / HF_SUBDIR, full)
    return manifest


def install_checkpoint(name: str, entry: dict[str, Any], checkpoints_dir: str | os.PathLike[str],
                       out_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Make the checkpoint a training job saved (``checkpoints_dir/step<N>/hf``) the model
    ``name`` (``<model>@step<N>``, config ``entry``: ``checkpoint_of``, ``step``, ``train``):
    its weights checked against the hashes the training recorded when it saved them
    (:data:`CHECKPOINT_RECORD`), copied to ``out_dir/hf``, the copy checked against them too,
    and its manifest (kind ``checkpoint``, revision ``step<N>``, the model it is a checkpoint
    of) written with them. A damaged or unrecorded checkpoint is a :class:`PosmechError`
    naming the file and the fix (train the model again), and nothing is installed. Returns
    the manifest."""
    import shutil

    rev = TRAINED_REVISION.format(entry["step"])
    src = Path(checkpoints_dir) / rev / HF_SUBDIR
    saved = saved_checkpoint_manifest(entry["checkpoint_of"], int(entry["step"]), checkpoints_dir)
    if saved is None:
        raise PosmechError(
            f"model {name}: the training of `models.{entry['checkpoint_of']}` saved no checkpoint {rev} "
            f"({src} is missing); rerun it: snakemake --forcerun train_demo_model")
    verify_weights(saved)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / HF_SUBDIR) as tmp:
        shutil.copytree(src, tmp)
        full, digest = hash_weights(tmp)
        if full != saved["weights_sha256"]:  # the copy is not what was checked (a disk or copy error)
            raise PosmechError(
                f"model {name}: the copy of {str(src)!r} has weights sha256 {full}, not those in "
                f"{saved['recorded_in']} ({saved['weights_sha256']}): a disk or copy error; nothing was "
                "installed: rerun")
    cfg = {**TRAIN_DEFAULTS, **entry["train"]}
    return write_trained_manifest(out, name, cfg, {"kind": "checkpoint", "revision": rev,
                                                   "checkpoint_of": entry["checkpoint_of"], "step": entry["step"]},
                                  hashes=(full, digest))


SCORE_DEFINITIONS = {
    "previous_token_scores": "per head [layer][head]: the held-out previous-token score, mean attention from query n "
    "to key n-1 over queries n>=1 of the held-out text batches (not heads.csv's prev_token_mass, the previous-token "
    "mass on the analysis documents)",
    "look_back_two_scores": "per head: the held-out look-back-two score, mean attention from query n to key n-2 over "
    "queries n>=2 of the same batches",
    "induction_scores": "per head: on [BOS]+R+R (R: induction_length uniform random characters, "
    "induction_samples sequences), mean attention from each query of the second copy to the token after "
    "its previous occurrence",
    "best_induction_head": "largest induction score in a layer >= 1",
    "induction_reads_head": "the best previous-token head in a layer below the best induction head",
    "induction_score_with_read_head_ablated": "the best induction head's induction score with the output "
    "of induction_reads_head zeroed",
    "previous_token_heads_below": "induction_reads_head and every head below the induction head's layer with at "
    "least half its held-out previous-token score",
    "induction_score_with_previous_token_heads_ablated": "the best induction head's induction score with the "
    "outputs of all previous_token_heads_below zeroed; p_correct_repeated_ablated is P(correct) then",
    "p_correct_repeated": "mean probability of the correct next character at the queries of the second copy "
    "(predicting R[1:])",
    "p_correct_first_copy": "the same on the first copy (not predictable: chance level)",
}
