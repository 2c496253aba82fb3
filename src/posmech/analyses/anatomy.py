"""Score anatomy of previous-token heads (P12) and the score taxa of every head (P13).

*Raw scores* (P12) are the model's pre-softmax scores for **every** query–key pair, the
future triangle included: TransformerLens records ``hook_attn_scores`` after the causal
mask, so they are computed here from ``blocks.L.attn.hook_q`` and ``hook_k`` with the
model's position scheme and scale (:class:`ScoreFunction`): ``q·k / scale`` with learned
absolute positions (``scale`` :func:`attn_scale`: ``sqrt(d_head)`` for GPT-2, 1 for
GPT-Neo), ``R(n)q·R(i)k / scale`` with rotary positions (GPT-NeoX/Pythia's partial
rotation, Llama's grouped-query attention), ``q·k / scale + m_h·(i − n)`` with ALiBi
(BLOOM).  The *masked* scores are the raw ones with ``-inf`` above the diagonal (they
equal ``hook_attn_scores``, for ALiBi up to a constant per query row; checked on every
pass of :func:`head_scores` and on the first batch of :func:`score_profiles`), the
*pattern* is their row softmax.

*Score taxa* (P13).  For a query ``n`` the scores at keys ``n + o``, offsets
``o = -W..W`` (``W`` = ``window``; positive offsets are future keys, present in the raw
scores), form a *row window* ``s(o)``.  It is centred (minus its mean over the window)
and its *spread* is its standard deviation over the window.  The *smooth profile* is the
least-squares quadratic in ``o`` through the window's offsets other than ``-1`` and ``0``
(the two offsets whose deviations are measured); with ``f`` that fit, the row's
features, each divided by the spread, are

* ``dip = f(0) - s(0)``: how far the self score lies **below** its neighbours (a *dark*
  main diagonal, negative self-attention);
* ``bump = s(-1) - f(-1)``: how far the previous key's score lies **above** its
  neighbours (a *bright* sub-diagonal);
* ``trend = W · f'(0)``: the smooth profile's change over ``W`` key positions at the
  diagonal (> 0: later keys score higher).

A row whose spread is at most :data:`FLAT_RTOL` times its largest absolute score (a
constant window, e.g. a uniform head) shows no feature: its features are 0.  A head's
feature is the **median** over its rows (documents × sampled query positions), and
``frac_<feature>`` the fraction of rows whose feature exceeds ``row_min``.  Taxa
(thresholds: config ``anatomy.taxa``,
:class:`posmech.settings.anatomy.AnatomyTaxaSettings`):

* ``dark diagonal``: median dip ≥ ``dip_min``, ``frac_dip`` ≥ ``fraction_min`` and median
  trend ≥ ``trend_min`` (``None``: no trend condition);
* ``bright sub-diagonal``: median bump ≥ ``bump_min`` and ``frac_bump`` ≥ ``fraction_min``;
* a head meeting both goes to the one whose median exceeds its threshold by the larger
  factor (``dip/dip_min`` vs ``bump/bump_min``); a head meeting neither is ``neither``.

Hand-built heads with scores ``α·(i − n) − γ·[i = n]`` come out dark diagonal, ``β·[i = n − 1]``
bright sub-diagonal, uniform and first-position heads neither (tests).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from posmech.analyses.attention import check_head, head_name, parse_head, run_collectors
from posmech.core.errors import PosmechError
from posmech.models.scores import ScoreFunction, offsets, score_function
from posmech.settings.anatomy import AnatomyTaxaSettings

LOG = logging.getLogger(__name__)

TAXA = ("dark diagonal", "bright sub-diagonal", "neither")
FEATURES = ("dip", "bump", "trend")
FLAT_RTOL = 1e-5
SCORE_CHECK_RTOL = 1e-4


def masked_scores(raw: np.ndarray) -> np.ndarray:
    """``raw [..., n, n]`` (query, key) with ``-inf`` above the main diagonal (future keys)."""
    n = raw.shape[-1]
    return np.where(np.triu(np.ones((n, n), dtype=bool), 1), -np.inf, raw)


def softmax_rows(masked: np.ndarray) -> np.ndarray:
    """Row softmax of masked scores (float64 internally; ``-inf`` entries get 0)."""
    x = np.asarray(masked, dtype=np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)


def check_scores(raw: Any, ref: Any, where: str, scale: float, row_constant: bool = False) -> float:
    """Max |raw - ref| over the finite entries of ``ref`` (the bridge's masked
    ``hook_attn_scores``, same shape; entries at the dtype's most negative number, the raw
    mode's mask, count as masked); with ``row_constant`` (ALiBi: :class:`ScoreFunction`)
    each query row's mean difference is removed first.  :class:`PosmechError` when it
    exceeds ``rtol·(1 + max|ref|)``, ``rtol`` = :data:`SCORE_CHECK_RTOL` (float32) or 16 ×
    the machine epsilon of a half-precision model, i.e. when the raw scores are not the
    model's scores."""
    import torch

    rtol = max(SCORE_CHECK_RTOL, 16 * torch.finfo(ref.dtype).eps) if ref.is_floating_point() else SCORE_CHECK_RTOL
    masked_at = torch.finfo(ref.dtype).min if ref.is_floating_point() else None
    ref = ref.float()
    ok = torch.isfinite(ref)
    if masked_at is not None:
        ok &= ref > masked_at
    if not bool(ok.any()):
        return 0.0
    diff = raw.float() - ref
    if row_constant:
        d = torch.where(ok, diff, 0.0)
        diff = diff - d.sum(-1, keepdim=True) / ok.sum(-1, keepdim=True).clamp(min=1)
    err = float(diff.abs()[ok].max())
    bound = rtol * (1.0 + float(ref[ok].abs().max()))
    if not err <= bound:
        raise PosmechError(
            f"{where}: the raw scores (q·k/{scale:.4g} with the model's position scheme) differ from "
            f"hook_attn_scores by {err:.3g} (> {bound:.3g}); the model's attention scale or score function "
            "is not one posmech knows (learned, rotary or ALiBi positions), so its raw scores cannot be computed here")
    return err


class _Captured:
    """Hooks that keep each requested layer's ``q`` and ``k`` (and the ``extra`` hooks the
    score function needs, e.g. a rotary model's ``hook_cos``/``hook_sin``) and hand them to
    ``on_layer(layer, q, k, scores, extra)``: with ``check``, once the model's own (masked)
    ``hook_attn_scores`` fires, with those scores; without, as soon as all of them are
    there, with ``scores=None`` (no score or pattern hook, so the engine keeps its fused
    attention: the pass costs what a bare forward costs)."""

    def __init__(self, layers: Iterable[int], on_layer: Any, extra: Sequence[str] = ()) -> None:
        self.layers = list(layers)
        self.names = ("hook_q", "hook_k", *extra)
        self.got: dict[int, dict[str, Any]] = {}
        self.on_layer = on_layer

    def hooks(self, check: bool = True) -> list[tuple[str, Any]]:
        out = []
        for layer in self.layers:
            out += [(f"blocks.{layer}.attn.{name}", self._keep(name, layer, check)) for name in self.names]
            if check:
                out.append((f"blocks.{layer}.attn.hook_attn_scores", self._scores(layer)))
        return out

    def _hand(self, layer: int, scores: Any) -> None:
        got = self.got.pop(layer)
        extra = {n: got[n] for n in self.names[2:]}
        self.on_layer(layer, got["hook_q"], got["hook_k"], scores, extra)

    def _keep(self, name: str, layer: int, check: bool) -> Any:
        def hook(t: Any, hook: Any) -> None:
            got = self.got.setdefault(layer, {})
            got[name] = t.detach()
            if not check and len(got) == len(self.names):
                self._hand(layer, None)

        return hook

    def _scores(self, layer: int) -> Any:
        def hook(scores: Any, hook: Any) -> None:
            missing = [n for n in self.names if n not in self.got.get(layer, {})]
            if missing:
                raise PosmechError(f"layer {layer}: {'/'.join(missing)} did not fire before hook_attn_scores; this "
                                   "architecture does not expose them to TransformerLens hooks")
            self._hand(layer, scores.detach())

        return hook


def _forward(bridge: Any, ids: np.ndarray, hooks: list[tuple[str, Any]]) -> None:
    """One forward pass of token ids ``[n]`` or ``[batch, n]`` with ``hooks``, no logits."""
    import torch

    x = torch.as_tensor(np.asarray(ids, dtype=np.int64), device=next(bridge.parameters()).device)
    if x.ndim == 1:
        x = x[None]
    with torch.inference_mode(), bridge.hooks(fwd_hooks=hooks):
        bridge(x, return_type=None)


@dataclass
class HeadScores:
    """One head on one document: ``raw``, ``masked`` and ``pattern`` ``[n, n]`` float32
    (query, key); ``hook_scores``/``hook_pattern``: the bridge's own ``hook_attn_scores``
    and ``hook_pattern`` of the same pass (for checks); ``row_constant``: the model's own
    scores may differ from the masked ones by a constant per query row (ALiBi,
    :class:`ScoreFunction`)."""

    head: str
    raw: np.ndarray
    masked: np.ndarray
    pattern: np.ndarray
    hook_scores: np.ndarray
    hook_pattern: np.ndarray
    row_constant: bool = False

    def masked_vs_hook(self) -> float:
        """Max |masked - hook_scores| over the keys the model sees (each row's mean
        difference removed first when ``row_constant``)."""
        seen = self.seen()
        if not seen.any():
            return 0.0
        if not self.row_constant:
            return float(np.abs(self.masked[seen] - self.hook_scores[seen]).max())
        d = np.zeros(seen.shape)
        d[seen] = self.masked[seen].astype(np.float64) - self.hook_scores[seen]
        d = d - d.sum(-1, keepdims=True) / np.maximum(seen.sum(-1, keepdims=True), 1)
        return float(np.abs(d[seen]).max())

    def seen(self) -> np.ndarray:
        """``[n, n]`` True where the model's own scores are not masked (neither ``-inf`` nor
        the dtype's most negative number, the raw mode's mask)."""
        h = self.hook_scores
        return np.isfinite(h) & (h > np.finfo(h.dtype).min)


def head_scores(bridge: Any, tokens: np.ndarray, heads: Sequence[str]) -> list[HeadScores]:
    """Raw scores, masked scores and pattern of ``heads`` (``L{l}H{h}``) on one document
    ``tokens [n]`` (one forward pass)."""
    cfg = bridge.cfg
    for h in heads:
        check_head(bridge, h)
    layers = sorted({parse_head(h)[0] for h in heads})
    raw: dict[int, np.ndarray] = {}
    own: dict[tuple[str, int], np.ndarray] = {}
    fn = score_function(cfg)

    def on_layer(layer: int, q: Any, k: Any, scores: Any, extra: dict[str, Any]) -> None:
        r = fn.full(q, k, extra)
        check_scores(r, scores, f"layer {layer}", fn.scale, fn.row_constant)
        raw[layer] = r[0].cpu().numpy()
        own[("attn_scores", layer)] = scores[0].float().cpu().numpy()

    def keep_pattern(layer: int) -> Any:
        def hook(t: Any, hook: Any) -> None:
            own[("pattern", layer)] = t[0].float().cpu().numpy()

        return hook

    extra = [(f"blocks.{layer}.attn.hook_pattern", keep_pattern(layer)) for layer in layers]
    _forward(bridge, tokens, _Captured(layers, on_layer, fn.extra_hooks).hooks() + extra)
    out = []
    for h in heads:
        layer, idx = parse_head(h)
        r = raw[layer][idx].astype(np.float32)
        m = masked_scores(r).astype(np.float32)
        out.append(HeadScores(h, r, m, softmax_rows(m), own[("attn_scores", layer)][idx],
                              own[("pattern", layer)][idx], fn.row_constant))
    return out


def centre_rows(M: np.ndarray) -> np.ndarray:
    """Each row of ``M`` minus its median over its finite entries (``-inf`` → NaN): the
    display of the triptychs, so that a diverging colour map centred at 0 shows each row's
    structure whatever its offset."""
    X = np.where(np.isfinite(M), M, np.nan).astype(np.float64)
    with np.errstate(all="ignore"):
        med = np.nanmedian(X, axis=-1, keepdims=True)
    return X - np.where(np.isnan(med), 0.0, med)


# --------------------------------------------------------------------------- score taxa
def _fit_matrix(window: int) -> tuple[np.ndarray, np.ndarray]:
    """``(fit_idx, P [3, m])``: window indices of the offsets other than -1 and 0, and the
    least-squares map from the scores there to the coefficients ``(c0, c1, c2)`` of
    ``c0 + c1·o + c2·o²``."""
    o = offsets(window)
    idx = np.flatnonzero((o != 0) & (o != -1))
    X = np.stack([np.ones(len(idx)), o[idx], o[idx] ** 2], 1).astype(np.float64)
    return idx, np.linalg.pinv(X)


def row_features(win: np.ndarray) -> np.ndarray:
    """Normalised features of row windows ``win [..., 2W+1]`` (offsets ``-W..W``):
    ``[..., 3]`` = ``(dip, bump, trend)`` (module docstring); 0 for flat rows."""
    win = np.asarray(win, dtype=np.float64)
    W = (win.shape[-1] - 1) // 2
    if W < 3:
        raise PosmechError(f"config key `anatomy.window`: {W} < 3 leaves too few neighbours to fit the smooth profile")
    idx, P = _fit_matrix(W)
    c = win - win.mean(-1, keepdims=True)
    spread = win.std(-1)
    coef = c[..., idx] @ P.T  # [..., 3]
    fit0, fitm1 = coef[..., 0], coef[..., 0] - coef[..., 1] + coef[..., 2]
    raw = np.stack([fit0 - c[..., W], c[..., W - 1] - fitm1, W * coef[..., 1]], -1)
    flat = spread <= FLAT_RTOL * np.abs(win).max(-1)
    with np.errstate(all="ignore"):
        out = raw / spread[..., None]
    out[flat] = 0.0
    return out


def query_rows(n: int, window: int, rows_per_document: int | None, first_query: int | None = None) -> np.ndarray:
    """Query positions whose whole window ``n-W..n+W`` lies in a document of ``n`` tokens
    and starts after position 0 (``first_query`` default ``W + 1``: the first token /
    BOS, whose scores are special, is never in a window); ``rows_per_document`` of them
    evenly spaced (``None``: all)."""
    lo = window + 1 if first_query is None else max(int(first_query), window)
    hi = n - 1 - window
    if hi < lo:
        return np.zeros(0, dtype=np.int64)
    rows = np.arange(lo, hi + 1)
    if rows_per_document is not None and len(rows) > rows_per_document:
        rows = rows[np.unique(np.round(np.linspace(0, len(rows) - 1, rows_per_document)).astype(int))]
    return rows


def window_scores(q: Any, k: Any, rows: np.ndarray, window: int, scale: float) -> Any:
    """Raw scores of queries ``rows`` at keys ``rows + o``, ``o = -W..W``, from ``q, k
    [b, n, H, d_head]`` (torch): ``[b, H, len(rows), 2W+1]`` float32.  Only these
    ``(2W+1)·len(rows)`` dot products are computed, not the ``n × n`` matrix
    (:meth:`ScoreFunction.window` of a model with learned positions)."""
    return ScoreFunction("learned", scale).window(q, k, rows, window)


@dataclass
class ScoreProfiles:
    """Per head, the sampled row windows and their features.

    ``windows [n_layers, n_heads, n_rows, 2W+1]`` float32 raw scores; ``features
    [n_layers, n_heads, n_rows, 3]`` float64 (dip, bump, trend); ``documents``,
    ``queries [n_rows]``: where each row comes from; ``window``."""

    windows: np.ndarray
    features: np.ndarray
    documents: np.ndarray
    queries: np.ndarray
    window: int
    n_documents: int
    n_tokens: int
    max_check_error: float

    def normalised(self) -> np.ndarray:
        """Row-centred windows divided by their spread (flat rows: 0): ``[L, H, R, 2W+1]``."""
        return normalise_windows(self.windows)


def normalise_windows(win: np.ndarray) -> np.ndarray:
    """Row windows ``[..., 2W+1]`` minus their mean, divided by their spread (standard
    deviation over the window); flat rows (:data:`FLAT_RTOL`) are 0, NaN rows stay NaN."""
    w = np.asarray(win, dtype=np.float64)
    c = w - w.mean(-1, keepdims=True)
    s = w.std(-1, keepdims=True)
    with np.errstate(all="ignore"):
        flat = s <= FLAT_RTOL * np.abs(w).max(-1, keepdims=True)
        return np.where(flat, 0.0, c / s)


def row_windows(raw: np.ndarray, window: int) -> np.ndarray:
    """The normalised row windows of one head's raw scores ``[n, n]``: ``[n, 2W+1]``, row
    ``q`` = scores at keys ``q-W..q+W`` (:func:`normalise_windows`), NaN for queries whose
    window leaves the document.  Drawn next to the triptychs: a dark diagonal is a dark
    column at offset 0, a bright sub-diagonal a bright column at -1."""
    n = raw.shape[0]
    out = np.full((n, 2 * window + 1), np.nan)
    rows = np.arange(window, n - window)
    if len(rows):
        out[rows] = normalise_windows(raw[rows[:, None], rows[:, None] + offsets(window)[None, :]])
    return out


class ProfileCollector:
    """A :class:`~posmech.analyses.attention.Collector` of P13 row windows: for each batch it
    hooks ``hook_q``/``hook_k`` of every layer and keeps the raw scores of the
    :func:`query_rows` at keys ``q-W..q+W`` (:func:`window_scores`, never the full score
    matrix).  The first batch with rows also hooks ``hook_attn_scores`` and checks the
    windows' causal part against it (``max_check_error``); later batches hook only ``q``
    and ``k``, so unless another collector asks for the pattern the engine keeps its fused
    attention."""

    def __init__(self, cfg: Any, window: int, rows_per_document: int | None = None,
                 first_query: int | None = None) -> None:
        self.L, self.H = int(cfg.n_layers), int(cfg.n_heads)
        self.window, self.rows_per_document, self.first_query = window, rows_per_document, first_query
        self.fn = score_function(cfg)
        self.scale = self.fn.scale
        self.wins: list[np.ndarray] = []
        self.docs_of: list[np.ndarray] = []
        self.queries: list[np.ndarray] = []
        self.max_error = 0.0
        self.checked = False
        self.n_documents = self.n_tokens = 0
        self._rows: np.ndarray | None = None
        self._out: np.ndarray | None = None
        self._cap = _Captured(range(self.L), self._on_layer, self.fn.extra_hooks)

    def _on_layer(self, layer: int, q: Any, k: Any, scores: Any, extra: dict[str, Any]) -> None:
        import torch

        W = self.window
        win = self.fn.window(q, k, self._rows, W, extra)  # [b, H, R, 2W+1]
        if scores is not None:  # the first batch: the causal part of every window (offsets <= 0)
            # must equal the model's own scores
            r = torch.as_tensor(self._rows, device=scores.device)
            keys = r[:, None] + torch.as_tensor(offsets(W)[: W + 1], device=scores.device)[None, :]
            ref = scores[:, :, r[:, None], keys]
            self.max_error = max(self.max_error, check_scores(win[..., : W + 1], ref, f"layer {layer}", self.scale,
                                                                   self.fn.row_constant))
            self.checked = True
        self._out[:, layer] = win.cpu().numpy()

    def hooks(self, batch: int, n: int) -> list[tuple[str, Any]]:
        rows = query_rows(n, self.window, self.rows_per_document, self.first_query)
        if not len(rows):
            self._rows = None
            return []
        self._rows = rows
        self._out = np.empty((batch, self.L, self.H, len(rows), 2 * self.window + 1), np.float32)
        return self._cap.hooks(check=not self.checked)

    def done(self, batch: int, n: int) -> None:
        if self._rows is None:
            LOG.warning("documents of %d tokens have no query with a whole window of ±%d; skipped", n, self.window)
        else:
            for b in range(batch):
                self.wins.append(np.moveaxis(self._out[b], 2, 0))  # [R, L, H, 2W+1]
                self.docs_of.append(np.full(len(self._rows), self.n_documents + b))
                self.queries.append(self._rows)
        self.n_documents += batch
        self.n_tokens += n * batch
        self._rows = self._out = None

    def result(self) -> ScoreProfiles:
        """The collected :class:`ScoreProfiles`; :class:`PosmechError` when no row was found."""
        if not self.wins:
            raise PosmechError(f"no query position with a whole window of ±{self.window} keys in any document: "
                               "lower `anatomy.window` or use longer documents")
        W = np.moveaxis(np.concatenate(self.wins), 0, 2)  # [L, H, R, 2W+1]
        return ScoreProfiles(W, row_features(W), np.concatenate(self.docs_of), np.concatenate(self.queries),
                             self.window, self.n_documents, self.n_tokens, self.max_error)


def score_profiles(
    bridge: Any, documents: Iterable[np.ndarray], window: int, rows_per_document: int | None = None,
    first_query: int | None = None, batch_size: int = 1, progress: bool = True,
) -> ScoreProfiles:
    """Run ``documents`` through ``bridge`` and collect every head's P13 row windows and
    their :func:`row_features` (:class:`ProfileCollector`); ``progress``: log progress
    lines."""
    col = ProfileCollector(bridge.cfg, window, rows_per_document, first_query)
    run_collectors(bridge, [(d, (col,)) for d in documents], batch_size, progress)
    return col.result()


def classify_taxa(features: np.ndarray, thresholds: AnatomyTaxaSettings) -> pd.DataFrame:
    """One row per head from row features ``[n_layers, n_heads, n_rows, 3]``: ``layer,
    head`` (ints), ``head_name``, the medians ``dip, bump, trend``, the fractions of rows above
    ``row_min`` ``frac_dip, frac_bump, frac_trend``, ``n_rows`` and ``taxon``."""
    if features.shape[2] == 0:
        raise PosmechError("score taxa need at least one row per head; none was collected")
    L, H = features.shape[:2]
    med = np.median(features, axis=2)
    frac = (features > thresholds.row_min).mean(axis=2)
    rows = []
    t = thresholds
    for layer in range(L):
        for h in range(H):
            dip, bump, trend = (float(x) for x in med[layer, h])
            fd, fb, ft = (float(x) for x in frac[layer, h])
            dark = dip >= t.dip_min and fd >= t.fraction_min and (t.trend_min is None or trend >= t.trend_min)
            bright = bump >= t.bump_min and fb >= t.fraction_min
            if dark and bright:
                taxon = TAXA[0] if dip / max(t.dip_min, 1e-12) >= bump / max(t.bump_min, 1e-12) else TAXA[1]
            else:
                taxon = TAXA[0] if dark else TAXA[1] if bright else TAXA[2]
            rows.append({"layer": layer, "head": h, "head_name": head_name(layer, h), "taxon": taxon,
                         "dip": dip, "bump": bump, "trend": trend, "frac_dip": fd, "frac_bump": fb,
                         "frac_trend": ft, "n_rows": int(features.shape[2])})
    return pd.DataFrame(rows)


def taxa_order(taxa: pd.DataFrame) -> pd.DataFrame:
    """The taxa table as written: dark diagonal, then bright sub-diagonal, then neither;
    by layer and head within a taxon (the report shows the first rows)."""
    rank = taxa["taxon"].map({t: i for i, t in enumerate(TAXA)})
    ordered = taxa.assign(_rank=rank).sort_values(["_rank", "layer", "head"], kind="stable")
    return ordered.drop(columns="_rank").reset_index(drop=True)


def profile_frame(profiles: ScoreProfiles, model: str) -> pd.DataFrame:
    """Tidy median normalised profile per head: ``claim, model, layer, head, head_name,
    offset, median, q25, q75`` (over rows; offsets ``-W..W``, key = query + offset)."""
    z = profiles.normalised()
    q25, med, q75 = np.percentile(z, [25, 50, 75], axis=2)  # [L, H, 2W+1]
    L, H, O = med.shape
    layer, head, off = np.meshgrid(np.arange(L), np.arange(H), np.arange(O), indexing="ij")
    o = offsets(profiles.window)
    return pd.DataFrame({
        "claim": "P13", "model": model,
        "layer": layer.ravel(), "head": head.ravel(),
        "head_name": [head_name(a, b) for a, b in zip(layer.ravel(), head.ravel())], "offset": o[off.ravel()],
        "median": med.ravel(), "q25": q25.ravel(), "q75": q75.ravel(),
    })


def split_of_previous_token_heads(taxa: pd.DataFrame, taxonomy: pd.DataFrame) -> dict[str, int]:
    """How the P6 previous-token heads (``is_previous_token`` of the taxonomy table) split
    over the taxa: ``{taxon: count}`` for every taxon."""
    if "is_previous_token" not in taxonomy or "head_name" not in taxonomy:
        raise PosmechError("the taxonomy table lacks `head_name`/`is_previous_token`; rerun rule `taxonomy` (analysis `diagonal_taxonomy`)")
    prev = set(taxonomy.loc[taxonomy["is_previous_token"].astype(bool), "head_name"])
    unknown = prev - set(taxa["head_name"])
    if unknown:
        raise PosmechError(f"the taxonomy table names heads {sorted(unknown)} that the model does not have; "
                           "rerun rule `taxonomy` (analysis `diagonal_taxonomy`)")
    sel = taxa[taxa["head_name"].isin(prev)]
    return {t: int((sel["taxon"] == t).sum()) for t in TAXA}


def taxa_scorecard(taxa: pd.DataFrame, split: dict[str, int], model: str, detail: str,
                   artifact: str) -> list[dict[str, Any]]:
    """P13 rows: the dark-diagonal and bright sub-diagonal head sets, and the P6 split."""
    def heads(taxon: str) -> list[str]:
        return taxa.loc[taxa["taxon"] == taxon].sort_values(["layer", "head"])["head_name"].tolist()

    return [
        {"claim": "P13", "model": model, "quantity": "dark_diagonal_heads", "value": heads(TAXA[0]),
         "detail": detail, "artifact": artifact},
        {"claim": "P13", "model": model, "quantity": "bright_subdiagonal_heads", "value": heads(TAXA[1]),
         "detail": detail, "artifact": artifact},
        {"claim": "P13", "model": model, "quantity": "prev_token_heads_by_taxon", "value": split,
         "detail": f"P6 previous-token heads (diagonal_taxonomy) per score taxon; {detail}", "artifact": artifact},
    ]


def early_dark_row(taxa: pd.DataFrame, early: list[str], model: str, detail: str, artifact: str) -> dict[str, Any]:
    """P13's finding row ``early_dark_diagonal_fraction``: the fraction of the strict early
    previous-token heads (:func:`posmech.analyses.taxonomy.strict_early_heads`) classified
    dark-diagonal; no value, and why, when there is none."""
    row = {"claim": "P13", "model": model, "quantity": "early_dark_diagonal_fraction", "artifact": artifact}
    if not early:
        return {**row, "value": None, "detail": "no early previous-token head: none of the P7-ranked heads "
                "(taxonomy.early_top_n) is in a layer below the sharpest head's"}
    dark = set(taxa.loc[taxa["taxon"] == TAXA[0], "head_name"])
    hits = [h for h in early if h in dark]
    return {**row, "value": len(hits) / len(early),
            "detail": f"{len(hits)} of the early heads {early} are dark-diagonal ({', '.join(hits) or 'none'}); {detail}"}


def score_taxa_scorecard(taxa: pd.DataFrame, split: dict[str, int], early: list[str], model: str, detail: str,
                         artifact: str) -> list[dict[str, Any]]:
    """Rule score_taxa's scorecard (P13), every row: :func:`taxa_scorecard` (the dark-diagonal
    and bright sub-diagonal head sets, the P6 previous-token heads per taxon ``split``) and
    :func:`early_dark_row` (the fraction of the strict early previous-token heads ``early``
    that are dark-diagonal)."""
    return [*taxa_scorecard(taxa, split, model, detail, artifact), early_dark_row(taxa, early, model, detail, artifact)]


# --------------------------------------------------------------------------- rule helpers
def long_documents(tokens: Any, n_documents: int, context: int | None) -> tuple[list[np.ndarray], int, list[int]]:
    """:func:`posmech.data.tokens.context_documents` of the ``anatomy`` section:
    ``(documents, context, indices in the tokens file)``."""
    from posmech.data.tokens import context_documents

    return context_documents(tokens, n_documents, context, "anatomy")


def anatomy_heads(chosen: dict[str, list[str]], pinned: list[str] | None) -> list[tuple[str, str]]:
    """``[(head, role)]`` drawn by P12: ``pinned`` (config ``anatomy.heads``; role
    ``pinned``) or the chosen sharp head then the early heads."""
    if pinned:
        return [(h, "pinned") for h in pinned]
    return [(h, "sharp") for h in chosen["sharp"]] + [(h, "early") for h in chosen["early"]]


def scores_table(panels: list[HeadScores], roles: dict[str, str], window: int) -> pd.DataFrame:
    """Per drawn head: the checks (masked scores vs ``hook_attn_scores`` where unmasked,
    pattern vs ``hook_pattern``) and the P13 features on this document (median over its
    query rows with a whole window, :func:`query_rows`)."""
    rows = []
    for p in panels:
        n = p.raw.shape[0]
        layer, idx = parse_head(p.head)
        unmasked = p.seen()
        q = query_rows(n, window, None)
        feats = (row_features(np.stack([p.raw[r, r - window: r + window + 1] for r in q]))
                 if len(q) else np.full((1, 3), np.nan))
        med = np.median(feats, axis=0)
        rows.append({
            "layer": layer, "head": idx, "head_name": p.head, "role": roles[p.head], "n_tokens": n,
            "max_abs_diff_masked_vs_hook": p.masked_vs_hook(),
            "masked_entries_agree": bool((np.isfinite(p.masked) == unmasked).all()),
            "max_abs_diff_pattern_vs_hook": float(np.abs(p.pattern - p.hook_pattern).max()),
            "raw_future_max": float(np.triu(p.raw, 1).max()) if n > 1 else float("nan"),
            "dip": float(med[0]), "bump": float(med[1]), "trend": float(med[2]), "n_rows": int(len(q)),
            "raw_argmax_prev_fraction": raw_argmax_prev_fraction(p.raw),
        })
    return pd.DataFrame(rows)


def raw_argmax_prev_fraction(raw: np.ndarray) -> float:
    """P12's finding: the fraction of query rows ``q >= 1`` of the raw scores ``[n, n]`` (every
    key, the future included) whose argmax is the previous position ``q - 1``; NaN for n < 2."""
    n = raw.shape[0]
    if n < 2:
        return float("nan")
    return float((np.argmax(raw[1:], axis=1) == np.arange(n - 1)).mean())


def anatomy_scorecard(table: pd.DataFrame, model: str, detail: str, artifact: str) -> list[dict[str, Any]]:
    """P12 rows: the heads drawn, and the sharp head's raw argmax fraction
    (:func:`raw_argmax_prev_fraction`; no value when ``anatomy.heads`` pins the heads drawn)."""
    sharp = table[table["role"] == "sharp"]
    rows = [{"claim": "P12", "model": model, "quantity": "score_figures", "value": table["head_name"].tolist(),
             "detail": detail, "artifact": artifact}]
    if len(sharp):
        r = sharp.iloc[0]
        rows.append({"claim": "P12", "model": model, "quantity": "sharp_raw_argmax_prev_fraction",
                     "value": float(r["raw_argmax_prev_fraction"]),
                     "detail": f"{r['head_name']}: fraction of the {int(r['n_tokens']) - 1} query rows q >= 1 whose raw "
                               f"scores (every key, the future included) peak at q - 1; {detail}", "artifact": artifact})
    else:
        rows.append({"claim": "P12", "model": model, "quantity": "sharp_raw_argmax_prev_fraction", "value": None,
                     "detail": "anatomy.heads pins the heads drawn: no sharp head among them", "artifact": artifact})
    return rows


def write_scores(path: Any, panels: list[HeadScores], tokens: np.ndarray, attrs: dict[str, Any]) -> None:
    """``results/{model}/anatomy/scores.h5``: per head ``{head}/raw``, ``{head}/masked``
    (``-inf`` above the diagonal), ``{head}/pattern`` ``[n, n]`` float32, and ``tokens [n]``."""
    from posmech.store.hdf5 import artifact_writer, describe

    what = {"raw": "raw scores q·k/scale for every query-key pair, the future (upper) triangle included",
            "masked": "the raw scores with -inf above the diagonal (equal to hook_attn_scores)",
            "pattern": "row softmax of the masked scores (the attention pattern)"}
    with artifact_writer(path, "score_anatomy", "score_anatomy", attrs) as f:
        f.create_dataset("tokens", data=np.asarray(tokens, dtype=np.int64))
        texts = {"tokens": "[n] int64 token ids of the document the scores are computed on"}
        for p in panels:
            for name in ("raw", "masked", "pattern"):
                f.create_dataset(f"{p.head}/{name}", data=getattr(p, name), compression="gzip", compression_opts=4,
                                 shuffle=True)
                texts[f"{p.head}/{name}"] = f"[n, n] float32 (query, key) of head {p.head}: {what[name]}"
        describe(f, texts)


def write_profiles(path: Any, profiles: ScoreProfiles, attrs: dict[str, Any]) -> None:
    """``results/{model}/anatomy/profiles.h5``: ``windows [L, H, R, 2W+1]`` raw row windows,
    ``features [L, H, R, 3]`` (dip, bump, trend), ``offsets [2W+1]``, ``document [R]``,
    ``query [R]`` (where each row comes from)."""
    from posmech.store.hdf5 import artifact_writer, describe

    with artifact_writer(path, "score_profiles", "score_taxa", attrs) as f:
        f.create_dataset("windows", data=profiles.windows, compression="gzip", compression_opts=4, shuffle=True)
        f.create_dataset("features", data=profiles.features.astype(np.float32), compression="gzip",
                         compression_opts=4, shuffle=True)
        f.create_dataset("offsets", data=offsets(profiles.window))
        f.create_dataset("document", data=profiles.documents)
        f.create_dataset("query", data=profiles.queries)
        f["features"].attrs["columns"] = list(FEATURES)
        describe(f, {
            "windows": "[n_layers, n_heads, n_rows, 2W+1] float32 raw scores of each sampled query row at keys "
                       "query-W..query+W (future keys included)",
            "features": "[n_layers, n_heads, n_rows, 3] float32 per-row dip at 0, bump at -1, trend (attribute "
                        "`columns`), in units of the row's spread",
            "offsets": "[2W+1] key offset of each window column (key = query + offset)",
            "document": "[n_rows] 0-based index, among the documents used, of each row's document",
            "query": "[n_rows] query position of each row",
        })
