"""Geometry of positional information: extended positional embeddings (P8), PCA helices
(P1, P10), canonical angles (P11) and sparsity (P9).

*Extended positional embeddings* (seed 000): feed prompts made of one token repeated to
the full context, take the residual stream at a site, subtract its mean over the
positions holding the repeated token, and average over many tokens.  Sites are the
``resid_pre`` of every block ``l = 0..n_layers-1`` and the final residual stream
(``blocks.{n_layers-1}.hook_resid_post``, before ``ln_final``) at index ``n_layers``.

BOS handling: when the prompts start with BOS (the model's ``prepend_bos``, or
``geometry.extended.bos``), position 0 holds BOS and positions ``1..n_ctx-1`` the
repeated token; the mean subtracted is the mean over the repeated-token positions
(``first_token_position`` onwards), so ``extended[0, p] = W_pos[p] - mean_{q>=first}
W_pos[q]`` exactly for every repeated-token position ``p``.  Row 0 then holds the BOS
residual minus the same mean (token-dependent, not a positional embedding); analyses use
rows ``first_position..`` only.

Everything here is pure numpy on arrays except :func:`extended_embeddings`, which runs a
TransformerLens bridge, and the HDF5 reader/writer.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from posmech.core.errors import PosmechError
from posmech.store.hdf5 import STR, artifact_writer, attr_json, open_artifact
from posmech.core.progress import logged

LOG = logging.getLogger(__name__)

KIND = "extended_embeddings"
RULE = "extended_positional_embeddings"
CENTRING = (
    "every matrix (W_pos and each layer's extended embeddings) minus its mean over the "
    "analysed positions (first_position..n_ctx-1)"
)


DESCRIPTIONS = {
    "extended": "[n_layers+1, n_ctx, d_model] token-averaged residual minus its mean over positions "
                "first_token_position..; index l<n_layers = blocks.l.hook_resid_pre, index n_layers = final residual",
    "W_pos": "[n_ctx, d_model] the model's positional embeddings as loaded (after processing), uncentred",
    "tokens": "[n_tokens] the repeated token ids, in draw order",
    "sites": "[n_layers+1] hook name of each index of `extended`",
    "agreement/mean_cosine_to_average": "[n_layers+1] mean over tokens of cos(E_t, average)",
    "agreement/mean_pairwise_cosine": "[n_layers+1] mean over token pairs t != s of cos(E_t, E_s)",
    "agreement/rms_relative_distance": "[n_layers+1] sqrt(mean_t |E_t - average|^2) / |average|",
}


# --------------------------------------------------------------------------- prompts
def candidate_tokens(d_vocab: int, special_ids: list[int]) -> np.ndarray:
    """Token ids ``0..d_vocab-1`` without the special ones, int64 ``[n_candidates]``."""
    ids = np.arange(d_vocab, dtype=np.int64)
    return ids[~np.isin(ids, np.asarray(sorted(set(special_ids)), dtype=np.int64))]


def draw_tokens(candidates: np.ndarray, n: int, seed: int) -> np.ndarray:
    """``min(n, len(candidates))`` distinct ids drawn with ``seed`` (in draw order), int64."""
    if len(candidates) == 0:
        raise PosmechError("no non-special token in the vocabulary to repeat for the extended embeddings")
    rng = np.random.default_rng(seed)
    return rng.choice(candidates, size=min(n, len(candidates)), replace=False).astype(np.int64)


def repeated_prompts(tokens: np.ndarray, n_ctx: int, bos_id: int | None) -> np.ndarray:
    """``[len(tokens), n_ctx]`` int64: each token repeated to ``n_ctx``, after ``bos_id``
    at position 0 when it is not None."""
    x = np.repeat(np.asarray(tokens, dtype=np.int64)[:, None], n_ctx, axis=1)
    if bos_id is not None:
        x[:, 0] = bos_id
    return x


# --------------------------------------------------------------------------- streaming
@dataclass
class ExtendedAccumulator:
    """Streaming sums over tokens of per-token centred residuals ``E_t`` (one site each).

    ``E_t[s] = resid_t[s] - mean_{p >= first} resid_t[s, p]``; agreement statistics use
    rows ``first..`` only.  Keeps ``S = sum_t E_t``, ``U = sum_t E_t/|E_t|`` (Frobenius
    norm over rows ``first..``) and ``q = sum_t |E_t|^2``: then mean cosine of ``E_t``
    to the average, mean pairwise cosine and RMS relative distance are exact.
    """

    n_sites: int
    n_ctx: int
    d_model: int
    first: int
    count: int = 0
    S: np.ndarray = field(init=False)
    U: np.ndarray = field(init=False)
    q: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.S = np.zeros((self.n_sites, self.n_ctx, self.d_model))
        self.U = np.zeros((self.n_sites, self.n_ctx - self.first, self.d_model))
        self.q = np.zeros(self.n_sites)

    def add(self, site: int, resid: np.ndarray) -> None:
        """Add a batch ``resid [batch, n_ctx, d_model]`` of residuals at ``site``."""
        r = np.asarray(resid, dtype=np.float64)
        E = r - r[:, self.first :].mean(axis=1, keepdims=True)
        self.S[site] += E.sum(axis=0)
        Ep = E[:, self.first :]
        n2 = np.einsum("bpd,bpd->b", Ep, Ep)
        norm = np.sqrt(n2)
        w = np.divide(1.0, norm, out=np.zeros_like(norm), where=norm > 0)
        self.U[site] += np.einsum("b,bpd->pd", w, Ep)
        self.q[site] += n2.sum()

    def mean(self) -> np.ndarray:
        """The average over tokens ``[n_sites, n_ctx, d_model]`` float64."""
        if self.count == 0:
            raise PosmechError("no prompt was accumulated")
        return self.S / self.count

    def agreement(self) -> dict[str, np.ndarray]:
        """Per site ``[n_sites]``: ``mean_cosine_to_average`` (mean over tokens of
        cos(E_t, mean)), ``mean_pairwise_cosine`` (over token pairs t != s; NaN for one
        token), ``rms_relative_distance`` (sqrt(mean_t |E_t - mean|^2) / |mean|)."""
        T = self.count
        M = self.mean()[:, self.first :]
        mnorm = np.sqrt(np.einsum("lpd,lpd->l", M, M))
        with np.errstate(divide="ignore", invalid="ignore"):
            cos_avg = np.einsum("lpd,lpd->l", self.U, M) / (T * mnorm)
            u2 = np.einsum("lpd,lpd->l", self.U, self.U)
            pair = (u2 - T) / (T * (T - 1)) if T > 1 else np.full(self.n_sites, np.nan)
            rms = np.sqrt(np.maximum(self.q / T - mnorm**2, 0.0)) / mnorm
        return {"mean_cosine_to_average": cos_avg, "mean_pairwise_cosine": pair, "rms_relative_distance": rms}


class _Stop(Exception):
    """Raised by the last hook: the logits are not needed."""


def site_names(n_layers: int) -> list[str]:
    """Hook names of the sites: ``blocks.l.hook_resid_pre`` and the final resid_post."""
    return [f"blocks.{i}.hook_resid_pre" for i in range(n_layers)] + [f"blocks.{n_layers - 1}.hook_resid_post"]


def extended_embeddings(
    bridge: Any, tokens: np.ndarray, n_ctx: int, bos_id: int | None, batch_size: int = 8,
) -> tuple[ExtendedAccumulator, dict[str, float]]:
    """Run the repeated-token prompts of ``tokens`` through ``bridge`` in batches and
    accumulate centred residuals at every site (:func:`site_names`).

    Returns the accumulator (``.mean()`` is ``[n_layers + 1, n_ctx, d_model]``) and
    timing ``{'forward_seconds', 'tokens_per_second', 'n_prompts'}``."""
    import torch

    n_layers = bridge.cfg.n_layers
    names = site_names(n_layers)
    first = 1 if bos_id is not None else 0
    if n_ctx - first < 2:
        raise PosmechError(f"context {n_ctx} is too short for extended embeddings (need >= {first + 2})")
    acc = ExtendedAccumulator(len(names), n_ctx, bridge.cfg.d_model, first)
    prompts = repeated_prompts(tokens, n_ctx, bos_id)
    device = bridge.cfg.device

    def hook_for(site: int) -> Any:
        def hook(t: Any, hook: Any) -> None:
            acc.add(site, t.detach().to("cpu", torch.float64).numpy())
            if site == len(names) - 1:
                raise _Stop

        return hook

    fwd = [(n, hook_for(i)) for i, n in enumerate(names)]
    t0 = time.perf_counter()
    with torch.inference_mode(), bridge.hooks(fwd_hooks=fwd):
        for start in logged(range(0, len(prompts), batch_size), what=f"batches of {batch_size} prompts"):
            x = torch.from_numpy(prompts[start : start + batch_size]).to(device)
            try:
                bridge(x)
            except _Stop:
                pass
            acc.count += len(x)
    secs = time.perf_counter() - t0
    LOG.info("%d prompts x %d tokens in %.1f s", len(prompts), n_ctx, secs)
    return acc, {
        "forward_seconds": secs,
        "tokens_per_second": len(prompts) * n_ctx / max(secs, 1e-9),
        "n_prompts": len(prompts),
    }


def compute_extended(
    bridge: Any, n_tokens: int, seed: int, batch_size: int, prepend_bos: bool, n_ctx: int | None = None,
) -> tuple[ExtendedAccumulator, np.ndarray, np.ndarray, dict[str, Any]]:
    """Draw ``n_tokens`` non-special tokens with ``seed``, run their repeated-token prompts
    (``n_ctx`` long, default the model's context; BOS first when ``prepend_bos``).

    Returns ``(accumulator, W_pos [n_ctx, d_model] float64, tokens [n], info)``; ``info``
    holds timing and the choices made (for the artifact's attributes)."""
    try:
        W_pos_param = bridge.W_pos
    except AttributeError as err:
        raise PosmechError(
            f"the model has no learned absolute positional embedding matrix W_pos ({err}); extended "
            "positional embeddings are defined against W_pos: leave it out of `geometry.models`"
        ) from None
    tok = bridge.tokenizer
    cfg_ctx = int(bridge.cfg.n_ctx)
    n_ctx = min(int(n_ctx or cfg_ctx), cfg_ctx)
    bos_id = None
    if prepend_bos:
        bos_id = getattr(tok, "bos_token_id", None)
        if bos_id is None:
            raise PosmechError("prepend_bos is true but the tokenizer has no BOS token; set `prepend_bos: false`")
    d_vocab = min(int(bridge.cfg.d_vocab), len(tok)) if tok is not None else int(bridge.cfg.d_vocab)
    special = list(getattr(tok, "all_special_ids", []) or []) + ([bos_id] if bos_id is not None else [])
    tokens = draw_tokens(candidate_tokens(d_vocab, special), n_tokens, seed)
    if len(tokens) < n_tokens:
        LOG.warning("only %d non-special tokens in the vocabulary; using all of them", len(tokens))
    acc, timing = extended_embeddings(bridge, tokens, n_ctx, bos_id, batch_size)
    W_pos = W_pos_param.detach().to("cpu").double().numpy()[:n_ctx]
    info = {
        **timing, "n_ctx": n_ctx, "prepend_bos": bos_id is not None, "bos_token_id": -1 if bos_id is None else bos_id,
        "n_tokens_requested": n_tokens, "seed": seed, "batch_size": batch_size,
        "n_layers": int(bridge.cfg.n_layers), "d_model": int(bridge.cfg.d_model),
    }
    return acc, W_pos, tokens, info


# --------------------------------------------------------------------------- artifact
@dataclass
class Extended:
    """Contents of ``extended.h5``: ``extended [n_layers + 1, n_ctx, d_model]``,
    ``W_pos [n_ctx, d_model]`` (the model's, after processing), agreement per site."""

    extended: np.ndarray
    W_pos: np.ndarray
    tokens: np.ndarray
    sites: list[str]
    first_token_position: int
    agreement: dict[str, np.ndarray]
    attrs: dict[str, Any]

    @property
    def n_layers(self) -> int:
        return self.extended.shape[0] - 1


def write_extended(
    path: str | os.PathLike[str], acc: ExtendedAccumulator, W_pos: np.ndarray, tokens: np.ndarray,
    sites: list[str], attrs: dict[str, Any],
) -> None:
    """Write the extended-embeddings artifact (kind ``extended_embeddings``)."""
    meta = {**attrs, "first_token_position": acc.first, "n_tokens": acc.count, "centring": (
        "per token: residual minus its mean over positions first_token_position..n_ctx-1; then averaged over tokens"
    )}
    with artifact_writer(path, KIND, RULE, meta) as f:
        f.create_dataset("extended", data=acc.mean(), chunks=(1, *acc.S.shape[1:]))
        f.create_dataset("W_pos", data=np.asarray(W_pos, dtype=np.float64))
        f.create_dataset("tokens", data=np.asarray(tokens, dtype=np.int64))
        f.create_dataset("sites", data=np.asarray(sites, dtype=object), dtype=STR)
        g = f.create_group("agreement")
        for k, v in acc.agreement().items():
            g.create_dataset(k, data=v)
        for name, text in DESCRIPTIONS.items():
            f[name].attrs["description"] = text


def read_extended_artifact(path: str | os.PathLike[str]) -> Extended:
    """Everything in ``extended.h5`` (refuses partial or other-schema files)."""
    with open_artifact(path, KIND) as f:
        attrs = {k: attr_json(f, k) for k in f.attrs}
        return Extended(
            extended=f["extended"][()].astype(np.float64),
            W_pos=f["W_pos"][()].astype(np.float64),
            tokens=f["tokens"][()],
            sites=[s.decode() if isinstance(s, bytes) else str(s) for s in f["sites"][()]],
            first_token_position=int(attrs["first_token_position"]),
            agreement={k: f["agreement"][k][()] for k in f["agreement"]},
            attrs=attrs,
        )


def read_extended(path: str | os.PathLike[str]) -> np.ndarray:
    """Token-averaged extended positional embeddings, float64 ``[n_layers + 1, n_ctx, d_model]``:
    index ``l < n_layers`` is ``blocks.l.hook_resid_pre``, index ``n_layers`` the final
    residual; each centred over positions ``first_token_position..`` (attribute; 1 when
    the prompts start with BOS, whose row 0 is then not positional)."""
    with open_artifact(path, KIND) as f:
        return f["extended"][()].astype(np.float64)


# --------------------------------------------------------------------------- analyses
def centre(X: np.ndarray, first: int = 0) -> np.ndarray:
    """Rows ``first..`` of ``X [n, d]`` minus their mean: ``[n - first, d]`` float64."""
    Y = np.asarray(X, dtype=np.float64)[first:]
    return Y - Y.mean(axis=0, keepdims=True)


def right_singular(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Singular values ``s [d]`` (descending) and right-singular vectors ``Vt [d, d]`` of
    ``X [n, d]`` via the eigendecomposition of ``X^T X`` (much faster than a full SVD for
    ``n ~ d ~ 1000``; exact for the leading components, which are all that is used)."""
    X = np.asarray(X, dtype=np.float64)
    lam, V = np.linalg.eigh(X.T @ X)
    order = np.argsort(lam)[::-1]
    return np.sqrt(np.clip(lam[order], 0.0, None)), V[:, order].T


def pca(X: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """PCA of centred ``X [n, d]``: ``(components [k, d], explained_variance_ratio [k],
    singular_values [d])``; component signs fixed so the largest |loading| is positive."""
    s, Vt = right_singular(X)
    k = min(k, Vt.shape[0])
    V = Vt[:k]
    sign = np.sign(V[np.arange(k), np.abs(V).argmax(axis=1)])
    V = V * np.where(sign == 0, 1.0, sign)[:, None]
    total = float(np.square(np.asarray(X, dtype=np.float64)).sum())
    ratio = (s[:k] ** 2) / total if total > 0 else np.zeros(k)
    return V, ratio, s


def subspace_angles_deg(Va: np.ndarray, Vb: np.ndarray) -> np.ndarray:
    """Principal angles (degrees, ascending) between the row spaces of ``Va [k, d]`` and
    ``Vb [k, d]`` (``scipy.linalg.subspace_angles``, imported here: the other geometry
    jobs, and extended_averaging, import this module without it)."""
    from scipy.linalg import subspace_angles

    return np.sort(np.degrees(subspace_angles(Va.T, Vb.T)))


MIN_GAP = 1e-3


def canonical_angles_deg(A: np.ndarray, B: np.ndarray, k: int, min_gap: float = MIN_GAP) -> np.ndarray:
    """Principal angles (degrees, ascending) between the top-``k`` right-singular subspaces
    of ``A [n, d]`` and ``B [m, d]`` (as given: centre first), via
    ``scipy.linalg.subspace_angles``; ``[k]``.  All NaN when either subspace is not
    defined (:func:`undefined_reason`)."""
    sa, Va = right_singular(A)
    sb, Vb = right_singular(B)
    if undefined_reason({"A": sa, "B": sb}, k, min_gap):
        return np.full(k, np.nan)
    return subspace_angles_deg(Va[:k], Vb[:k])


def gap_of(s: np.ndarray, k: int) -> float:
    """Relative spectral gap ``1 - s[k]/s[k-1]`` at ``k`` for descending singular values
    ``s``: how well the top-``k`` singular subspace is defined (0: not at all, e.g. a
    repeated singular value ``s[k-1] == s[k]``, or rank below ``k``; 1 when there is no
    ``s[k]``, i.e. the top-``k`` subspace is the whole row space)."""
    if len(s) <= k:
        return 1.0
    return float(1.0 - s[k] / s[k - 1]) if s[k - 1] > 0 else 0.0


def undefined_reason(singular: dict[str, np.ndarray], k: int, min_gap: float = MIN_GAP) -> str:
    """Why a top-``k`` singular subspace is not defined, or ``""`` when all are.

    ``singular``: ``{name: descending singular values}``.  The top-``k`` subspace of a matrix
    is determined only when ``s[k-1] > s[k]``; when the relative gap :func:`gap_of` is below
    ``min_gap`` (default 1e-3) the subspace is (numerically) any ``k``-dimensional part of
    the span of the tied singular vectors, and angles to it would be those of an arbitrary
    basis.  The reason names the matrix, the singular values and the gap."""
    out = []
    for name, s in singular.items():
        g = gap_of(s, k)
        if g < min_gap:
            out.append(f"top-{k} subspace of {name} is not defined: singular values s{k} = {s[k - 1]:.6g} and "
                       f"s{k + 1} = {s[k]:.6g} have relative gap {g:.3g} < {min_gap:g} (geometry.min_gap)")
    return "; ".join(out)


def spectral_gap(X: np.ndarray, k: int) -> float:
    """:func:`gap_of` the singular values of ``X``."""
    return gap_of(right_singular(X)[0], k)


def far_fraction(X: np.ndarray, threshold: float) -> float:
    """Fraction of entries with ``|x| > threshold``."""
    return float((np.abs(X) > threshold).mean())


def rms(X: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(X))))


def table_meta(ext: Extended, first: int, **extra: Any) -> dict[str, Any]:
    """Metadata lines of every geometry table: the prompts (BOS choice), centring, positions."""
    bos = bool(ext.attrs.get("prepend_bos", ext.first_token_position == 1))
    prompts = (f"{len(ext.tokens)} tokens (seed {ext.attrs.get('seed', '?')}), each repeated to "
               f"{ext.extended.shape[1]} positions" + (", BOS at position 0" if bos else ", no BOS")
               + f" (geometry.bos: {ext.attrs.get('bos_config', '?')}, model prepend_bos: "
               f"{ext.attrs.get('model_prepend_bos', '?')})")
    return {"prompts": prompts, "first_token_position": ext.first_token_position, "first_position": first,
            "centring": CENTRING, **extra}


def layer_label(layer: int, n_layers: int) -> str:
    return "final" if layer == n_layers else f"resid_pre {layer}"


def analysis_first(ext: Extended, first_position: int | None) -> int:
    """Rows used by the analyses: ``first_position`` or the first repeated-token position."""
    f = ext.first_token_position if first_position is None else int(first_position)
    if not 0 <= f <= ext.extended.shape[1] - 4:
        raise PosmechError(
            f"config key `geometry.first_position`: {f} leaves fewer than 4 of {ext.extended.shape[1]} positions"
        )
    return f


def all_pcas(ext: Extended, first: int, k: int,
             layers: Sequence[int] | None = None) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """``{layer: (components [k, d], explained_variance_ratio [k])}`` of the centred
    matrices; layer ``-1`` is ``W_pos``.  One decomposition per matrix.  ``layers``: the
    extended embeddings' layers to decompose (None: every one; W_pos always), e.g. only the
    layer P10 reads in a twin's null (:func:`claimed_layers`)."""
    out = {-1: pca(centre(ext.W_pos, first), k)[:2]}
    for i in range(ext.n_layers + 1) if layers is None else layers:
        out[i] = pca(centre(ext.extended[i], first), k)[:2]
    return out


def claimed_layers(ext: Extended, layer: int) -> list[int] | None:
    """The extended embeddings' layers the P1/P10/P11 tables hold: every one, or, when the
    running analyses compute only what their claims read (a random-init twin's null,
    :func:`posmech.core.null.only_claims`, config ``twins.claims_only``), only ``layer``,
    the one P10's and P11's claims read (:func:`helix_layer`; P1 reads W_pos, always there).
    None: every layer."""
    from posmech.core.null import only_claims

    return [helix_layer(ext, layer)] if only_claims() else None


def pca_table(ext: Extended, model: str, first: int, k: int,
              pcas: dict[int, tuple[np.ndarray, np.ndarray]] | None = None) -> pd.DataFrame:
    """Explained-variance ratio of the top ``k`` principal components of ``W_pos`` (P1)
    and of every layer's extended embeddings (P10): one row per (matrix, component).
    ``pcas``: :func:`all_pcas` with at least ``k`` components, to reuse."""
    pcas = pcas or all_pcas(ext, first, k)
    rows = []
    for layer in sorted(pcas):
        matrix = "W_pos" if layer < 0 else "extended"
        ratio = pcas[layer][1][:k]
        for j, r in enumerate(ratio):
            rows.append({
                "claim": "P1" if matrix == "W_pos" else "P10", "model": model, "matrix": matrix,
                "layer": layer, "site": "W_pos" if layer < 0 else ext.sites[layer], "component": j + 1,
                "explained_variance_ratio": float(r), "cumulative": float(ratio[: j + 1].sum()),
            })
    return pd.DataFrame(rows)


def angles_table(ext: Extended, model: str, first: int, k: int, min_gap: float = MIN_GAP,
                 layers: Sequence[int] | None = None) -> pd.DataFrame:
    """Canonical angles between the top-``k`` right-singular subspaces of centred
    ``W_pos`` and of each layer's extended embeddings: one row per (layer, angle);
    ``layers``: those layers only (None: every one; :func:`claimed_layers`).

    Columns ``gap_W_pos``/``gap_extended`` are the relative spectral gaps at ``k``
    (:func:`gap_of`); when either is below ``min_gap`` the layer's angles are NaN,
    ``defined`` is false and ``undefined_reason`` says why (also logged as a warning)."""
    sw, Vw = right_singular(centre(ext.W_pos, first))
    rows = []
    for i in range(ext.n_layers + 1) if layers is None else layers:
        sx, Vx = right_singular(centre(ext.extended[i], first))
        reason = undefined_reason({"W_pos": sw, f"the extended embeddings at {ext.sites[i]}": sx}, k, min_gap)
        if reason:
            LOG.warning("P11 layer %d: angles undefined: %s", i, reason)
        angles = np.full(k, np.nan) if reason else subspace_angles_deg(Vw[:k], Vx[:k])
        for j, a in enumerate(angles):
            rows.append({
                "claim": "P11", "model": model, "layer": i, "site": ext.sites[i], "k": k, "angle_index": j + 1,
                "angle_deg": float(a), "gap_W_pos": gap_of(sw, k), "gap_extended": gap_of(sx, k),
                "defined": not reason, "undefined_reason": reason,
            })
    return pd.DataFrame(rows)


def sparsity_table(ext: Extended, model: str, first: int, threshold: float) -> pd.DataFrame:
    """Per matrix: fraction of entries with ``|x| > threshold * rms(centred W_pos)``
    (``frac_far``), its ratio to ``W_pos``'s (``wpos_over_extended``: > 1 means sparser
    than W_pos), and the scale-free ``frac_far_own_scale`` (threshold in units of the
    matrix's own RMS entry)."""
    W = centre(ext.W_pos, first)
    thr = threshold * rms(W)
    fw = far_fraction(W, thr)
    rows = []
    mats = [("W_pos", -1, W)] + [("extended", i, centre(ext.extended[i], first)) for i in range(ext.n_layers + 1)]
    for matrix, layer, X in mats:
        f = far_fraction(X, thr)
        rows.append({
            "claim": "P9", "model": model, "matrix": matrix, "layer": layer,
            "site": "W_pos" if layer < 0 else ext.sites[layer], "threshold": thr, "threshold_factor": threshold,
            "frac_far": f, "wpos_over_extended": fw / f if f > 0 else np.inf,
            "frac_far_own_scale": far_fraction(X, threshold * rms(X)), "rms": rms(X),
        })
    return pd.DataFrame(rows)


def agreement_table(ext: Extended, model: str) -> pd.DataFrame:
    """P8: per site, agreement of the per-token extended embeddings with their average,
    and the difference to centred ``W_pos`` (exactly 0 at layer 0 up to float error)."""
    f = ext.first_token_position
    W = centre(ext.W_pos, f)
    rows = []
    for i in range(ext.n_layers + 1):
        X = centre(ext.extended[i], f)
        rows.append({
            "claim": "P8", "model": model, "layer": i, "site": ext.sites[i],
            **{k: float(v[i]) for k, v in ext.agreement.items()},
            "max_abs_diff_to_W_pos": float(np.abs(X - W).max()),
            "rms_W_pos": rms(W), "rms_extended": rms(X),
            "n_tokens": len(ext.tokens),
        })
    return pd.DataFrame(rows)


def project(X: np.ndarray, V: np.ndarray) -> np.ndarray:
    """Coordinates of the rows of ``X [n, d]`` on the components ``V [k, d]``: ``[n, k]``."""
    return X @ V.T


def helices(ext: Extended, first: int, pcas: dict[int, tuple[np.ndarray, np.ndarray]] | None = None) -> dict[str, Any]:
    """Top-3 PCA coordinates, each matrix in its own basis: ``W_pos [n, 3]``,
    ``extended [n_layers + 1, n, 3]``, ``positions [n]`` (``n = n_ctx - first``) and the
    labelled ``panels`` of :func:`posmech.plots.geometry.helix_grid`."""
    pcas = pcas or all_pcas(ext, first, 3)
    out_ext = [project(centre(ext.extended[i], first), pcas[i][0][:3]) for i in range(ext.n_layers + 1)]
    Wc = centre(ext.W_pos, first)
    Pw = project(Wc, pcas[-1][0][:3])
    # layer 0's extended embeddings are W_pos itself (P8): one panel for both, not two identical ones
    same0 = np.allclose(centre(ext.extended[0], first), Wc, rtol=0, atol=1e-6 * max(rms(Wc), 1e-12))
    panels = [("P1 W_pos" + (" = P10 layer 0" if same0 else ""), Pw)] + [
        (f"P10 layer {i}" if i < ext.n_layers else "P10 final residual", P)
        for i, P in enumerate(out_ext) if i > 0 or not same0]
    return {"W_pos": Pw, "extended": np.stack(out_ext), "positions": np.arange(first, ext.W_pos.shape[0]),
            "panels": panels}


def comparison_panels(ext: Extended, first: int, layer: int) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """P10's three panels ``(basis, extended [n, 3], W_pos [n, 3])``: both centred matrices
    projected on the top-3 PCA basis of W_pos, of the layer's extended embeddings, and of
    the two stacked (the joint one)."""
    W = centre(ext.W_pos, first)
    X = centre(ext.extended[layer], first)
    out = []
    for name, M in (("W_pos", W), (f"extended layer {layer}", X), ("joint", np.concatenate([W, X]))):
        V = pca(M, 3)[0]
        out.append((name, project(X, V), project(W, V)))
    return out


def helix_layer(ext: Extended, layer: int) -> int:
    """The configured P10/P11 layer, clipped to the model's sites (logged when clipped)."""
    if layer > ext.n_layers:
        LOG.warning("geometry layer %d does not exist (n_layers %d); using %d", layer, ext.n_layers, ext.n_layers)
    return min(layer, ext.n_layers)


# --------------------------------------------------------------------------- scorecards
def extended_scorecard(agree: pd.DataFrame, model: str, artifact: str) -> list[dict[str, Any]]:
    """P8 rows: the layer-0 identity error and the cross-token agreement (layers > 0)."""
    later = agree[agree["layer"] > 0]
    cos = later["mean_pairwise_cosine"]
    return [
        {"claim": "P8", "model": model, "quantity": "layer0_max_abs_diff",
         "value": float(agree.loc[agree["layer"] == 0, "max_abs_diff_to_W_pos"].iloc[0]),
         "detail": "max |extended[0] - (W_pos - mean over positions)| over repeated-token positions",
         "artifact": artifact},
        {"claim": "P8", "model": model, "quantity": "cross_token_cosine", "value": float(cos.min()),
         "detail": "minimum over layers > 0 of the mean pairwise cosine between per-token extended "
                   f"embeddings ({int(agree['n_tokens'].iloc[0])} tokens); per layer: "
                   + ", ".join(f"{lay}: {c:.3f}" for lay, c in zip(later["layer"], cos)),
         "artifact": artifact},
    ]


def pca_scorecard(table: pd.DataFrame, model: str, layer: int, wpos_fig: str, cmp_fig: str) -> list[dict[str, Any]]:
    """P1 and P10 rows (qualitative claims): the top-3 explained variance as the value."""
    def top3(matrix: str, lay: int) -> float:
        sel = table[(table["matrix"] == matrix) & (table["layer"] == lay) & (table["component"] <= 3)]
        return float(sel["explained_variance_ratio"].sum())

    return [
        {"claim": "P1", "model": model, "quantity": "wpos_helix", "value": top3("W_pos", -1),
         "detail": "fraction of W_pos variance in its top-3 principal components (helix figure)",
         "artifact": wpos_fig},
        {"claim": "P10", "model": model, "quantity": "extended_helix", "value": top3("extended", layer),
         "detail": f"fraction of the layer-{layer} extended embeddings' variance in their top-3 principal "
                   "components (helix and three-panel figure)", "artifact": cmp_fig},
    ]


def angles_scorecard(table: pd.DataFrame, model: str, layer: int, artifact: str) -> list[dict[str, Any]]:
    """P11 row: the canonical angles (degrees, ascending) at ``layer``; no value (empty)
    and the reason in ``detail`` when they are undefined (:func:`undefined_reason`)."""
    sel = table[table["layer"] == layer].sort_values("angle_index")
    defined = "defined" not in sel or bool(sel["defined"].all())
    detail = (f"layer {layer} ({sel['site'].iloc[0]}), top-{int(sel['k'].iloc[0])} right-singular "
              f"subspaces; spectral gaps W_pos {sel['gap_W_pos'].iloc[0]:.3g}, "
              f"extended {sel['gap_extended'].iloc[0]:.3g}; {CENTRING}")
    return [{
        "claim": "P11", "model": model, "quantity": "canonical_angles_deg",
        "value": [round(float(a), 3) for a in sel["angle_deg"]] if defined else None,
        "detail": detail if defined else f"undefined: {sel['undefined_reason'].iloc[0]}; {detail}",
        "artifact": artifact,
    }]


def sparsity_scorecard(table: pd.DataFrame, model: str, artifact: str) -> list[dict[str, Any]]:
    """P9 row: median over layers > 0 of frac_far(W_pos) / frac_far(extended)."""
    later = table[(table["matrix"] == "extended") & (table["layer"] > 0)]
    thr = float(table["threshold_factor"].iloc[0])
    return [{
        "claim": "P9", "model": model, "quantity": "sparsity_ratio",
        "value": float(np.median(later["wpos_over_extended"])),
        "detail": f"median over layers > 0; far from 0 = |x| > {thr:g} x RMS entry of centred W_pos; per layer: "
                  + ", ".join(f"{lay}: {r:.2f}" for lay, r in zip(later["layer"], later["wpos_over_extended"])),
        "artifact": artifact,
    }]
