"""Claims K8 and K9 on the layer-0 decomposition: the softmax denominators of layer-0 heads
(rule ``softmax_denominators``) and the independent model of their variance (rule
``denominator_variance``), with their scorecard rows."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from posmech.analyses.attention import head_name
from posmech.analyses.contextual.decomposition import Layer0File
from posmech.core.errors import PosmechError


# --------------------------------------------------------------------------- K8
def denominator_spread(log_z: np.ndarray, positions: np.ndarray, from_n: int) -> np.ndarray:
    """How much a head's denominator varies across texts: the mean over destination
    positions ``n ≥ from_n`` of the standard deviation over texts of ``log Z_h(n)``
    (``log_z [T, H, N]`` → ``[H]``).  Fewer than two texts or no position: an error."""
    sel = np.asarray(positions) >= from_n
    if log_z.shape[0] < 2 or not sel.any():
        raise PosmechError(f"the denominator spread needs at least 2 texts and a position >= {from_n} "
                           "(`contextual.texts`, `contextual.denominator_from`)")
    return log_z[:, :, sel].std(axis=0).mean(axis=-1)


def most_varying(spread: np.ndarray, classes: Sequence[str], top: int) -> list[str]:
    """The ``top`` contextual heads with the largest spread (names, largest first)."""
    idx = [h for h in np.argsort(-spread) if classes[h] == "contextual"]
    return [head_name(0, int(h)) for h in idx[:top]]


#: the K7 classes whose heads are "broad" in K8's and the C claims' findings: the contextual
#: heads and "other" (the post: head 11 "behaves similarly to the contextual attention heads")
BROAD_CLASSES = ("contextual", "other")


def broad_spread_row(spread: np.ndarray, classes: Sequence[str], model: str, artifact: str) -> dict[str, Any]:
    """K8's finding row ``broad_max_spread``: the largest :func:`denominator_spread` among the
    broad layer-0 heads (:data:`BROAD_CLASSES`); no value, and why, when there is none."""
    broad = [h for h, c in enumerate(classes) if c in BROAD_CLASSES]
    row = {"claim": "K8", "model": model, "quantity": "broad_max_spread", "artifact": artifact}
    if not broad:
        return {**row, "value": None, "detail": "no layer-0 head is contextual or other (K7 classes: "
                + ", ".join(f"{head_name(0, h)} {c}" for h, c in enumerate(classes)) + ")"}
    h = max(broad, key=lambda i: spread[i])
    return {**row, "value": float(spread[h]),
            "detail": f"{head_name(0, h)} ({classes[h]}): std over texts of log Z, mean over destination positions; "
                      f"broad heads {', '.join(head_name(0, i) for i in broad)}"}


# --------------------------------------------------------------------------- K9
def denominator_table(dec: Layer0File, classes: Sequence[str], spread: dict[str, np.ndarray], from_n: int,
                      model: str) -> pd.DataFrame:
    """K8's table: one row per (text of ``dec``, layer-0 head ``h`` of class ``classes[h]``) with
    ``claim, model, layer, head, head_name, head_class, text`` (its title), ``corpus`` and, over
    the positions ``n >= from_n``: ``mean_log_z_linear`` / ``mean_log_z_exact`` (the mean of
    log Z_h(n), the softmax denominator with the destination token fixed, LayerNorm 1 linear /
    exact), ``std_log_z_linear_over_n`` (the std of the linear log Z_h(n) over n),
    ``spread_linear`` / ``spread_exact`` (the head's :func:`denominator_spread`, ``spread``:
    the mean over n of the std over texts of log Z_h(n); the same in every text's row) and
    ``tv_linear_exact_mean`` (the mean total variation distance of the linear and exact
    patterns)."""
    sel = dec.positions >= from_n
    rows = []
    for j, t in dec.texts.iterrows():
        for h, c in enumerate(classes):
            rows.append({"claim": "K8", "model": model, "layer": 0, "head": h, "head_name": head_name(0, h),
                         "head_class": c,
                         "text": t["title"], "corpus": t["corpus"],
                         "mean_log_z_linear": float(dec.log_z_linear[j, h, sel].mean()),
                         "mean_log_z_exact": float(dec.log_z_exact[j, h, sel].mean()),
                         "std_log_z_linear_over_n": float(dec.log_z_linear[j, h, sel].std()),
                         "spread_linear": float(spread["linear"][h]), "spread_exact": float(spread["exact"][h]),
                         "tv_linear_exact_mean": float(dec.tv_linear_exact[j, h, sel].mean())})
    return pd.DataFrame(rows)


def resampled_variance(p: np.ndarray, c_pop: np.ndarray, weights: np.ndarray, n_resamples: int,
                       rng: np.random.Generator, fixed: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The independent model of the denominator against resampling.

    ``p [H, m]``: positional-pattern weights of the ``m`` resampled keys; ``c_pop [H, U]``:
    content factors of the ``U`` token types of the population, drawn i.i.d. with
    probabilities ``weights [U]``; ``fixed [H]``: the part of ``Z`` from keys that are not
    resampled.  Predicted ``Var Z = Σ p² · Var(c)`` (``Var`` under ``weights``); observed:
    the sample variance (ddof 1) of ``Z`` over ``n_resamples`` draws, with its standard
    error ``var·sqrt(2/(R−1))`` (normal approximation).  Returns arrays ``[H]``."""
    weights = np.asarray(weights, dtype=float) / np.sum(weights)
    mean_c = c_pop @ weights
    var_c = np.square(c_pop - mean_c[:, None]) @ weights
    sum_p2 = np.square(p).sum(axis=-1)
    draws = rng.choice(len(weights), size=(n_resamples, p.shape[-1]), p=weights)  # [R, m]
    z = np.einsum("hm,hrm->hr", p, c_pop[:, draws]) + (0.0 if fixed is None else np.asarray(fixed)[:, None])
    obs = z.var(axis=-1, ddof=1)
    return {"sum_p2": sum_p2, "var_c": var_c, "predicted": sum_p2 * var_c, "observed": obs,
            "observed_se": obs * math.sqrt(2.0 / (n_resamples - 1)), "mean_z": z.mean(axis=-1)}


def variance_model(dec: Layer0File, ids: np.ndarray, n: int, n_resamples: int, seed: int) -> dict[str, np.ndarray]:
    """K9 on one text at destination position ``n`` (fixed destination token): keys
    ``1..n−1`` are redrawn i.i.d. from the text's own tokens at ``1..n−1`` (positions fixed;
    BOS at 0 and the destination at ``n`` kept), see :func:`resampled_variance`."""
    ids = np.asarray(ids, dtype=np.int64)
    if n < 2 or len(ids) < n:
        raise PosmechError(f"variance position {n} needs a text of at least {n} tokens and n >= 2 "
                           "(`contextual.variance_positions`)")
    p = dec.pattern(n)  # [H, n+1]
    scale = float(dec.attrs["attn_scale"])
    pop, counts = np.unique(ids[1:n], return_counts=True)
    q = dec.query[:, n]  # [H, dh]
    c_pop = np.exp(np.einsum("he,hue->hu", q, dec.content_key(pop)) / scale)
    ends = np.array([ids[0], int(dec.attrs["destination_id"])])
    c_ends = np.exp(np.einsum("he,hue->hu", q, dec.content_key(ends)) / scale)
    fixed = p[:, 0] * c_ends[:, 0] + p[:, n] * c_ends[:, 1]
    return resampled_variance(p[:, 1:n], c_pop, counts, n_resamples, np.random.default_rng(seed), fixed)


def within_text_variance(dec: Layer0File, j: int, from_n: int) -> dict[str, np.ndarray]:
    """K9 within one text (``j`` of ``layer0.h5``): the observed variance over destination
    positions ``n ≥ from_n`` of the stored ``Z_h(n)`` along the text, against the independent
    model's mean over those ``n`` of ``Σ_i p_h(n, i)² · Var(c_h(n, ·))``, with ``Var`` over
    the distribution of the text's tokens at ``1..n−1`` (a stationary text: each ``Z(n)`` is
    one draw).  Returns ``predicted, observed [H]`` and the number of positions."""
    pos = dec.positions
    sel = np.flatnonzero(pos >= from_n)
    if len(sel) < 2:
        raise PosmechError(f"fewer than 2 positions >= {from_n} (`contextual.denominator_from`)")
    ids = dec.token_ids[j]
    scale = float(dec.attrs["attn_scale"])
    vocab, inv = np.unique(ids, return_inverse=True)
    kc = dec.content_key(vocab)  # [H, U, dh]
    pred = np.zeros(dec.query.shape[0])
    for k in sel:
        n = int(pos[k])
        counts = np.bincount(inv[1:n], minlength=len(vocab)).astype(float)
        if counts.sum() == 0:
            continue
        w = counts / counts.sum()
        c = np.exp(np.einsum("he,hue->hu", dec.query[:, n], kc) / scale)
        var_c = np.square(c - (c @ w)[:, None]) @ w
        pred += np.square(dec.pattern(n)[:, 1:n]).sum(axis=-1) * var_c
    z = np.exp(dec.log_z_linear[j][:, sel])
    return {"predicted": pred / len(sel), "observed": z.var(axis=-1, ddof=1), "n_positions": np.full(len(pred), len(sel))}


def variance_table(dec: Layer0File, classes: Sequence[str], positions: Sequence[int], n_resamples: int, seed: int,
                   from_n: int, model: str) -> pd.DataFrame:
    """K9's table, rows ``claim, model, method, layer, head, head_name, head_class, text, corpus``
    and per method:

    * ``resampled`` — per text ``j`` of ``dec``, position ``n`` of ``positions`` and head: the
      :func:`variance_model` columns (predicted Var Z_h(n) = Σ_i p_h(n, i)² Var(c) and the
      variance observed over ``n_resamples`` redraws of the text's keys 1..n−1 from its own
      tokens; seed ``seed + 1000 j + n``), with ``n``;
    * ``within_text`` — per text and head: ``n_positions``, ``predicted``, ``observed`` of
      :func:`within_text_variance` (the variance along the text of Z(n) over n >= ``from_n``
      against the mean over those n of Σ p² Var(c))."""
    rows = []
    for j, t in dec.texts.iterrows():
        for n in positions:
            r = variance_model(dec, dec.token_ids[j], n, n_resamples, seed + 1000 * j + n)
            for h, c in enumerate(classes):
                rows.append({"claim": "K9", "model": model, "method": "resampled", "layer": 0, "head": h,
                             "head_name": head_name(0, h), "head_class": c, "text": t["title"], "corpus": t["corpus"],
                             "n": n, **{k: float(v[h]) for k, v in r.items()}})
        within = within_text_variance(dec, j, from_n)
        for h, c in enumerate(classes):
            rows.append({"claim": "K9", "model": model, "method": "within_text", "layer": 0, "head": h,
                         "head_name": head_name(0, h), "head_class": c, "text": t["title"], "corpus": t["corpus"],
                         "n_positions": int(within["n_positions"][h]), "predicted": float(within["predicted"][h]),
                         "observed": float(within["observed"][h])})
    return pd.DataFrame(rows)


def loglog_fit(predicted: np.ndarray, observed: np.ndarray) -> tuple[float, float]:
    """Pearson correlation and least-squares slope of log10 observed on log10 predicted
    (positive pairs only; fewer than 3: an error)."""
    ok = (np.asarray(predicted) > 0) & (np.asarray(observed) > 0)
    if ok.sum() < 3:
        raise PosmechError("fewer than 3 (predicted, observed) variance pairs: no fit")
    x, y = np.log10(np.asarray(predicted)[ok]), np.log10(np.asarray(observed)[ok])
    return float(np.corrcoef(x, y)[0, 1]), float(np.polyfit(x, y, 1)[0])



def loglog_fit_or_reason(predicted: np.ndarray, observed: np.ndarray) -> tuple[float, float, str]:
    """:func:`loglog_fit`, or ``(nan, nan, why)`` when fewer than 3 pairs have positive
    variances (every head's denominator is constant in the tokens: nothing to model, K9
    not measurable); ``why`` is empty when the fit exists."""
    ok = (np.asarray(predicted) > 0) & (np.asarray(observed) > 0)
    if ok.sum() < 3:
        return (float("nan"), float("nan"),
                f"only {int(ok.sum())} (predicted, observed) variance pairs are positive: no layer-0 head's "
                "denominator varies with the tokens (no content-dependent head), nothing to fit")
    return (*loglog_fit(predicted, observed), "")


# --------------------------------------------------------------------------- scorecard rows (K8, K9)
def denominator_scorecard(spread: dict[str, np.ndarray], classes: Sequence[str], n_most_varying: int,
                          n_texts: int, from_n: int, model: str, figure: str,
                          artifact: str) -> list[dict[str, Any]]:
    """K8 rows of rule softmax_denominators from the per-head ``spread`` of log Z across texts
    (:func:`denominator_spread`, keys ``linear`` and ``exact`` LayerNorm):

    * ``most_varying_denominator_heads`` — the ``n_most_varying`` contextual heads with the
      largest spread (:func:`most_varying`), linear LayerNorm; the detail ranks every head;
    * ``most_varying_denominator_heads_exact`` — the same with the exact LayerNorm;
    * ``broad_max_spread`` — :func:`broad_spread_row`."""
    top = {k: most_varying(spread[k], classes, n_most_varying) for k in ("linear", "exact")}
    ranking = ", ".join(f"{head_name(0, int(h))} {spread['linear'][h]:.3f}" for h in np.argsort(-spread["linear"]))
    rows = [{"claim": "K8", "quantity": "most_varying_denominator_heads", "value": top["linear"],
             "detail": f"the {n_most_varying} contextual heads with the largest spread of log Z across "
             f"{n_texts} texts (linear LN, n >= {from_n}); all heads: {ranking}", "artifact": figure},
            {"claim": "K8", "quantity": "most_varying_denominator_heads_exact", "value": top["exact"],
             "detail": "the same with the exact LayerNorm", "artifact": artifact},
            broad_spread_row(spread["linear"], classes, model, figure)]
    return [{**r, "model": model} for r in rows]


def variance_scorecard(table: pd.DataFrame, from_n: int, model: str, figure: str,
                       artifact: str) -> list[dict[str, Any]]:
    """K9 rows of rule denominator_variance from its table (``method`` ``resampled``: one row
    per text, n and head; ``within_text``: one per text and head; columns ``predicted``,
    ``observed`` variances of Z), fitted by :func:`loglog_fit_or_reason` (no value, and why,
    when there is nothing to fit):

    * ``variance_model_fit`` — Pearson r of log10 observed variance of Z over i.i.d. redraws
      of the text's tokens against log10 predicted ``Σ_i p_h(n, i)² Var(c)``;
    * ``variance_model_within_text_fit`` — the same for the variance of Z(n) along each text
      (n >= ``from_n``);
    * ``variance_model_loglog_slope`` — the least-squares slope of the first fit (1 = the
      model's scaling)."""
    res = table[table["method"] == "resampled"]
    wt = table[table["method"] == "within_text"]
    r, slope, why = loglog_fit_or_reason(res["predicted"], res["observed"])
    r_within, slope_within, why_within = loglog_fit_or_reason(wt["predicted"], wt["observed"])
    rows = [{"claim": "K9", "quantity": "variance_model_fit", "value": None if why else round(r, 4),
             "detail": why or f"Pearson r of log10 observed (i.i.d. redraws) vs log10 predicted Var Z over {len(res)} "
             f"(text, n, head) rows; slope {slope:.3f}", "artifact": figure},
            {"claim": "K9", "quantity": "variance_model_within_text_fit",
             "value": None if why_within else round(r_within, 4),
             "detail": why_within or f"Pearson r of log10 observed vs predicted variance of Z(n) along each text (n >= "
             f"{from_n}) over {len(wt)} (text, head) rows; slope {slope_within:.3f}", "artifact": artifact},
            {"claim": "K9", "quantity": "variance_model_loglog_slope", "value": None if why else round(slope, 4),
             "detail": why or "least-squares slope of log10 observed on log10 predicted (1 = the model's scaling)",
             "artifact": artifact}]
    return [{**r, "model": model} for r in rows]
