"""Attention sinks and massive activations (claims S1-S4: beyond the seed posts).

**The sink metric** (Gu et al. 2024, "When Attention Sink Emerges in Language Models",
code ``sail-sg/Attention-Sink``, ``eval_sink_open_source.py``, ``compute_attention_sink``):
for one sample of ``T`` tokens, layer ``l`` and head ``h`` with attention pattern
``A[i, k]`` (query ``i``, key ``k``, causal),

    alpha[k] = sum_i A[i, k] / (T - k),

the mean attention key ``k`` receives from the ``T - k`` queries that can see it
(:func:`key_scores`).  The (sample, layer, head) is a *sink* when ``alpha[0] > epsilon``
(their ``epsilon = 0.3``); the *sink ratio* is the share of (sample, layer, head) that are
sinks (:func:`sink_ratio`; they print it in percent, posmech keeps the fraction).  A head
attending uniformly has ``alpha[0] = H_T / T`` (``H_T`` the harmonic number: 0.074 at
``T = 64``, 0.127 at 32), below ``epsilon`` whenever ``T >= 10``
(:func:`uniform_alpha0`): a random-init model has no sink.

On this metric:

* S1: the sink ratio (``sinks.epsilon``, ``sinks.n_tokens``);
* S2 (Xu 2026): the sink ratio of the first ``sinks.early_layers`` layers (0 and 1);
* S3 (ALiBi, arXiv 2603.09616): the share of heads whose mean ``alpha[0]`` over the samples is
  at least ``sinks.first_token_alpha`` (attention almost entirely on the first token), and
  the Spearman rank correlation of each head's mean ``alpha[0]`` with its ALiBi slope
  (:func:`posmech.models.scores.alibi_slopes`); not measurable without ALiBi;
* S4 (Sun et al. 2024, "Massive Activations in Large Language Models"): per sample and layer,
  the residual stream after the block (``blocks.L.hook_resid_post`` ``[T, d_model]``): its
  largest magnitude ``|h|``, where it is (token position, dimension) and its ratio to the
  median magnitude of that sample's hidden state (:class:`SinkCollector`,
  :func:`massive_summary`).

One forward pass (no logits) per batch of samples serves all four: the patterns are reduced
to ``alpha`` inside the hook and never kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from posmech.analyses.attention import head_name, run_collectors
from posmech.core.errors import PosmechError
from posmech.models.scores import alibi_slopes

#: columns of the per-head table (``results/{model}/sinks/sink_heads.csv``)
HEAD_COLUMNS = ["claim", "model", "layer", "head", "head_name", "alpha0_mean", "alpha0_sd", "sink_fraction",
                "is_sink", "first_token", "slope"]
#: columns of the per-(sample, layer) table of residual-stream magnitudes
ACTIVATION_COLUMNS = ["model", "sample", "layer", "top_value", "top_abs", "top_position", "top_dim",
                      "second_dim", "median_abs", "ratio"]
S1_QUANTITIES = ("sink_ratio",)
S2_QUANTITIES = ("early_sink_ratio",)
S3_QUANTITIES = ("first_token_head_share", "alpha0_slope_spearman")
S4_QUANTITIES = ("top_over_median", "massive_dims", "massive_first_token_share")


# --------------------------------------------------------------------------- the metric
def key_scores(pattern: np.ndarray) -> np.ndarray:
    """Gu et al.'s ``alpha[..., k] = sum_i A[..., i, k] / (T - k)`` of patterns ``[..., T, T]``
    (query, key): the mean attention key ``k`` gets from the queries that can see it."""
    A = np.asarray(pattern, dtype=np.float64)
    T = A.shape[-1]
    if A.shape[-2] != T:
        raise PosmechError(f"attention pattern of shape {A.shape}: queries and keys must match")
    return A.sum(axis=-2) / (T - np.arange(T))


def uniform_alpha0(T: int) -> float:
    """``alpha[0]`` of a head attending uniformly over its ``i + 1`` keys: ``H_T / T``."""
    return float(np.sum(1.0 / np.arange(1, T + 1)) / T)


def sink_ratio(alpha0: np.ndarray, epsilon: float) -> float:
    """The share of entries of ``alpha0`` (any shape, e.g. ``[sample, layer, head]``) above
    ``epsilon``; an empty array is an error (an average over nothing)."""
    a = np.asarray(alpha0, dtype=np.float64)
    if a.size == 0:
        raise PosmechError("sink ratio over no (sample, layer, head)")
    return float((a > epsilon).mean())


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rank correlation (average ranks for ties); ``None`` when either side is
    constant (no ranking to correlate)."""
    a, b = pd.Series(np.asarray(x, float)).rank(), pd.Series(np.asarray(y, float)).rank()
    if len(a) < 2 or a.nunique() < 2 or b.nunique() < 2:
        return None
    return float(np.corrcoef(a, b)[0, 1])


def positions_and_slopes(cfg: Any) -> tuple[str, np.ndarray | None]:
    """The model's position scheme in words' key (``learned``, ``rotary``, ``alibi``, ...) from
    its TransformerLens ``cfg.positional_embedding_type``, and its ALiBi slopes per head
    (:func:`posmech.models.scores.alibi_slopes`, BLOOM's), ``None`` without ALiBi."""
    kind = str(getattr(cfg, "positional_embedding_type", "standard") or "standard")
    scheme = {"standard": "learned", "shortformer": "learned"}.get(kind, kind)
    return scheme, (alibi_slopes(int(cfg.n_heads)) if scheme == "alibi" else None)


# --------------------------------------------------------------------------- the forward pass
class SinkCollector:
    """A :class:`~posmech.analyses.attention.Collector` of ``alpha[0]`` per (sample, layer,
    head) (``blocks.L.attn.hook_pattern``) and of the largest residual-stream magnitudes
    (``blocks.L.hook_resid_post``): :attr:`alpha0` ``[N, L, H]``, :attr:`alpha` (the mean
    ``alpha[k]`` over samples) ``[L, H, T]`` and :attr:`rows` (one per sample and layer)."""

    def __init__(self, n_layers: int, n_heads: int) -> None:
        self.layers, self.heads = n_layers, n_heads
        self._alpha: list[np.ndarray] = []  # per batch: [B, L, H, T]
        self._batch: dict[int, np.ndarray] = {}
        self.rows: list[dict[str, Any]] = []
        self.n_samples = 0

    def _pattern(self, layer: int) -> Any:
        def hook(pattern: Any, hook: Any) -> None:
            self._batch[layer] = key_scores(pattern.detach().float().cpu().numpy())

        return hook

    def _resid(self, layer: int) -> Any:
        def hook(resid: Any, hook: Any) -> None:
            h = resid.detach().float().cpu().numpy()  # [B, T, d]
            for b in range(h.shape[0]):
                self.rows.append({"sample": self.n_samples + b, "layer": layer, **top_activation(h[b])})

        return hook

    def hooks(self, batch: int, n: int) -> list[tuple[str, Any]]:
        return ([(f"blocks.{l}.attn.hook_pattern", self._pattern(l)) for l in range(self.layers)]
                + [(f"blocks.{l}.hook_resid_post", self._resid(l)) for l in range(self.layers)])

    def done(self, batch: int, n: int) -> None:
        if sorted(self._batch) != list(range(self.layers)):
            raise PosmechError(f"the forward pass fired hook_pattern on layers {sorted(self._batch)}, "
                               f"not on all {self.layers}")
        self._alpha.append(np.stack([self._batch[l] for l in range(self.layers)], axis=1))
        self._batch = {}
        self.n_samples += batch

    @property
    def alpha_all(self) -> np.ndarray:
        """``alpha[k]`` of every (sample, layer, head) ``[N, L, H, T]``."""
        if not self._alpha:
            raise PosmechError("no sample ran: no attention sink to measure")
        return np.concatenate(self._alpha)

    @property
    def alpha0(self) -> np.ndarray:
        return self.alpha_all[..., 0]


def top_activation(h: np.ndarray) -> dict[str, Any]:
    """The largest magnitude of one hidden state ``h`` ``[T, d]``: its signed value, position,
    dimension, the dimension of the largest magnitude elsewhere than that dimension, the median
    magnitude and their ratio (``NaN`` when the median is 0)."""
    a = np.abs(h.astype(np.float64))
    pos, dim = np.unravel_index(int(np.argmax(a)), a.shape)
    per_dim = a.max(axis=0)
    per_dim[dim] = -1.0
    med = float(np.median(a))
    top = float(a[pos, dim])
    return {"top_value": float(h[pos, dim]), "top_abs": top, "top_position": int(pos), "top_dim": int(dim),
            "second_dim": int(np.argmax(per_dim)) if a.shape[1] > 1 else -1, "median_abs": med,
            "ratio": top / med if med > 0 else float("nan")}


def samples_of(tokens: Any, n_samples: int, n_tokens: int, model_ctx: int | None) -> tuple[list[np.ndarray], int]:
    """The first ``n_samples`` documents of ``tokens`` (a :class:`posmech.data.tokens.TokenSet`)
    with at least ``T`` tokens, cut to ``T``: ``sinks.n_tokens``, or the model's context when
    shorter (the model's own ``n_ctx`` and the one its tokens were cut for, ``models.<name>.n_ctx``
    where the config sets it, e.g. for BLOOM, whose config records none): ``(samples, T)``."""
    from posmech.data.tokens import context_documents

    limits = [n_tokens] + [int(c) for c in (model_ctx, tokens.attrs.get("n_ctx")) if c]
    T = min(limits)
    try:
        docs, T, _ = context_documents(tokens, n_samples, T, "sinks")
    except PosmechError as err:
        raise PosmechError(f"config key `sinks.n_tokens`: {err} (samples of T = {T} tokens: lower `sinks.n_tokens` "
                           "or use a corpus with longer documents)") from None
    return docs, T


def run_sinks(bridge: Any, samples: Sequence[np.ndarray], batch_size: int = 8,
              progress: bool = True) -> SinkCollector:
    """One forward pass per batch of ``samples`` (token ids ``[T]`` each, equal lengths) with
    the :class:`SinkCollector`'s hooks."""
    if not samples:
        raise PosmechError("no sample to measure attention sinks on (config key `sinks.n_samples`)")
    col = SinkCollector(int(bridge.cfg.n_layers), int(bridge.cfg.n_heads))
    run_collectors(bridge, [(s, [col]) for s in samples], batch_size, progress)
    return col


# --------------------------------------------------------------------------- tables
def head_table(alpha0: np.ndarray, model: str, epsilon: float, first_token_alpha: float,
               slopes: np.ndarray | None = None) -> pd.DataFrame:
    """Per head, from ``alpha0`` ``[N, L, H]``: the mean and sd of ``alpha[0]`` over the samples,
    the share of samples where it is above ``epsilon`` (``sink_fraction``), ``is_sink`` (the
    mean above ``epsilon``: the head's role in heads.csv), ``first_token`` (the mean at least
    ``first_token_alpha``, S3) and the head's ALiBi ``slope`` (empty without ALiBi)."""
    N, L, H = alpha0.shape
    if N == 0:
        raise PosmechError("no sample: no per-head sink score")
    mean, sd, frac = alpha0.mean(0), alpha0.std(0), (alpha0 > epsilon).mean(0)
    rows = [{"claim": "S1", "model": model, "layer": l, "head": h, "head_name": head_name(l, h),
             "alpha0_mean": float(mean[l, h]), "alpha0_sd": float(sd[l, h]), "sink_fraction": float(frac[l, h]),
             "is_sink": bool(mean[l, h] > epsilon), "first_token": bool(mean[l, h] >= first_token_alpha),
             "slope": None if slopes is None else float(slopes[h])}
            for l in range(L) for h in range(H)]
    return pd.DataFrame(rows, columns=HEAD_COLUMNS)


def sink_scorecard(alpha0: np.ndarray, heads: pd.DataFrame, model: str, epsilon: float, early_layers: int,
                   positions: str, artifact: str, n_tokens: int | None = None) -> list[dict[str, Any]]:
    """The S1-S3 scorecard rows. S1 and S2 have no value when the samples' ``n_tokens`` are so
    few that a uniform head's ``alpha[0] = H_T / T`` is not below ``epsilon`` (a model whose
    context is that short: every head would count); S2 none when the model has no layer after
    the early ones (nothing but early layers: the finding would read "no sink at all"); S3 none
    without ALiBi slopes, or when the heads' mean ``alpha[0]`` or slopes are all equal."""
    N, L, H = alpha0.shape
    if n_tokens is not None and uniform_alpha0(n_tokens) >= epsilon:
        why = (f"samples of {n_tokens} tokens (the model's context): a uniform head's alpha[0] = H_T / T = "
               f"{uniform_alpha0(n_tokens):.3f} is not below epsilon {epsilon:g}, so every head would be a sink")
        return [{"claim": c, "model": model, "quantity": q, "value": None, "detail": why, "artifact": artifact}
                for c, qs in (("S1", S1_QUANTITIES), ("S2", S2_QUANTITIES), ("S3", S3_QUANTITIES)) for q in qs]
    rows = [{"claim": "S1", "model": model, "quantity": "sink_ratio", "value": sink_ratio(alpha0, epsilon),
             "detail": f"share of {N} samples x {L} layers x {H} heads with alpha[0] > {epsilon:g}",
             "artifact": artifact}]
    if L <= early_layers:
        rows.append({"claim": "S2", "model": model, "quantity": "early_sink_ratio", "value": None,
                     "detail": f"the model has {L} layers: layers 0-{early_layers - 1} (sinks.early_layers) are all of "
                               "it, no later layer to hold the sinks; S1 reads the whole model",
                     "artifact": artifact})
    else:
        rows.append({"claim": "S2", "model": model, "quantity": "early_sink_ratio",
                     "value": sink_ratio(alpha0[:, :early_layers], epsilon),
                     "detail": f"layers 0-{early_layers - 1} of {L}: share of (sample, head) with alpha[0] > {epsilon:g}",
                     "artifact": artifact})
    if positions != "alibi":
        why = f"no ALiBi slopes: {positions} positions"
        rows += [{"claim": "S3", "model": model, "quantity": q, "value": None, "detail": why, "artifact": artifact}
                 for q in S3_QUANTITIES]
        return rows
    share = float(heads["first_token"].mean())
    rho = spearman(heads["alpha0_mean"], heads["slope"])
    rows.append({"claim": "S3", "model": model, "quantity": "first_token_head_share", "value": share,
                 "detail": f"{int(heads['first_token'].sum())} of {len(heads)} heads", "artifact": artifact})
    rows.append({"claim": "S3", "model": model, "quantity": "alpha0_slope_spearman", "value": rho,
                 "detail": ("Spearman of each head's mean alpha[0] with its ALiBi slope (larger slope: steeper)"
                            if rho is not None else "every head's mean alpha[0] (or slope) is the same: no ranking"),
                 "artifact": artifact})
    return rows


def activation_table(rows: list[dict[str, Any]], model: str) -> pd.DataFrame:
    """The per-(sample, layer) records of :class:`SinkCollector` as a table."""
    df = pd.DataFrame([{"model": model, **r} for r in rows], columns=ACTIVATION_COLUMNS)
    return df.sort_values(["sample", "layer"], kind="stable").reset_index(drop=True)


def massive_summary(acts: pd.DataFrame) -> pd.DataFrame:
    """Per layer: the median over samples of the top-over-median ratio, the most frequent
    top dimension and its share of the samples, the share of samples whose top magnitude is
    on token 0, the median top magnitude and median magnitude (samples whose median
    magnitude is 0 have no ratio and are left out of its median)."""
    out = []
    for layer, g in acts.groupby("layer", sort=True):
        dims = g["top_dim"].value_counts()
        ratio = g["ratio"].dropna()
        out.append({"layer": int(layer), "n_samples": len(g), "ratio_median": float(ratio.median()) if len(ratio) else None,
                    "top_dim": int(dims.index[0]), "top_dim_share": float(dims.iloc[0] / len(g)),
                    "first_token_share": float((g["top_position"] == 0).mean()),
                    "top_abs_median": float(g["top_abs"].median()), "median_abs_median": float(g["median_abs"].median())})
    return pd.DataFrame(out)


def massive_scorecard(summary: pd.DataFrame, model: str, artifact: str) -> list[dict[str, Any]]:
    """S4 rows: the largest per-layer median ratio (``top_over_median``), the dimensions
    holding the top magnitude in that layer (``massive_dims``: its most frequent top
    dimension) and the share of samples whose top magnitude is on the first token there."""
    rated = summary.dropna(subset=["ratio_median"])
    if rated.empty:
        why = "the median magnitude of the residual stream is 0 in every layer: no ratio to it"
        return [{"claim": "S4", "model": model, "quantity": q, "value": None, "detail": why, "artifact": artifact}
                for q in S4_QUANTITIES]
    best = rated.loc[rated["ratio_median"].idxmax()]
    layer = int(best["layer"])
    where = f"layer {layer} (largest median over {int(best['n_samples'])} samples of max|h| / median|h|)"
    return [
        {"claim": "S4", "model": model, "quantity": "top_over_median", "value": float(best["ratio_median"]),
         "detail": where, "artifact": artifact},
        {"claim": "S4", "model": model, "quantity": "massive_dims", "value": [int(best["top_dim"])],
         "detail": f"{where}: the top magnitude's dimension in {best['top_dim_share']:.0%} of the samples",
         "artifact": artifact},
        {"claim": "S4", "model": model, "quantity": "massive_first_token_share",
         "value": float(best["first_token_share"]), "detail": f"{where}: share of samples with it on token 0",
         "artifact": artifact},
    ]
