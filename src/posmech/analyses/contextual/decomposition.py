"""The layer-0 decomposition behind the contextual attention heads (claims K6–K10, seed post 004).

The layer-0 decomposition
-------------------------
Layer 0 reads the residual ``r_i = e(x_i) + p_i`` (token embedding ``e = W_E[x]``
``[d_model]`` plus positional embedding ``p_i = W_pos[i]``), so every layer-0 attention
score is a function of the embedding matrices alone, computed here in float64 from the
model's own weights (no forward pass; tests check it equals the model's layer-0 pattern).
Take a head ``h`` (``W_Q, W_K [d_model, d_head]``, ``b_Q, b_K [d_head]``, score scale
``σ_att``, √d_head for GPT-2), a destination token ``x_n = d`` at position ``n`` and keys
``i = 0..n``.  LayerNorm is ``LN(r) = γ ⊙ (r − mean r) / σ(r) + β`` with
``σ(r) = sqrt(var(r) + eps)`` (TransformerLens's ``blocks.0.ln1.hook_scale``).

* query (exact LayerNorm, one vector per destination): ``q_h(d, n) = LN(e(d) + p_n) W_Q + b_Q``
  ``[d_head]``;
* **LayerNorm treated as linear at its measured scale** ``s`` for the keys (``s`` = the
  median of ``hook_scale`` over the tokens of a corpus, or a configured number):
  ``LN(e + p_i) ≈ γ⊙(ẽ + p̃_i)/s + β`` with ``ẽ, p̃`` centred over ``d_model``; the key
  splits into a **positional key** ``kp_h(i) = (γ⊙p̃_i/s + β) W_K + b_K`` ``[d_head]`` and
  a **content key** ``kc_h(x) = (γ⊙ẽ(x)/s) W_K`` ``[d_head]``;
* **positional score** ``π_h(n, i) = q_h(d, n)·kp_h(i) / σ_att``  ``[n + 1]`` per ``n``;
* **content score** ``κ_h(n, x) = q_h(d, n)·kc_h(x) / σ_att`` (depends on the key's token only);
* **positional pattern** ``p_h(n, i) = softmax_{i ≤ n} π_h(n, i)`` (the pattern if every
  key had the same token);
* **content factor** ``c_h(n, i) = exp κ_h(n, x_i)``;
* **denominator** ``Z_h(n) = Σ_{i ≤ n} p_h(n, i)·c_h(n, i)``, and the (linear-LN)
  attention is ``A_h(n, i) = p_h(n, i)·c_h(n, i) / Z_h(n)`` — an identity, not an
  approximation, once LN is linear.
* **exact pattern**: ``A*_h(n, i) = softmax_i q_h(d, n)·(LN(e(x_i) + p_i) W_K + b_K) / σ_att``
  with the real LayerNorm; its denominator relative to the same positional pattern is
  ``Z*_h(n) = Σ_i exp(s*_h(n, i)) / Σ_i exp π_h(n, i)`` (so ``A* = exp(s*)/(Σ exp π · Z*)``).
  The quality of the linear approximation is the total variation ``TV(A, A*) = ½ Σ_i |A − A*|``
  per head, destination position and text (stored, and reported).
* **a sliding layer 0** (Gemma 2's, Mistral's ``window`` keys): every pattern above is over the
  keys the model's mask leaves, ``n − window < i ≤ n``; **soft-capped scores** (Gemma 2): the
  exact score is the model's ``c·tanh(s*/c)``, while ``π`` and ``κ`` split the logit before the
  cap (as P18 does), so the linear attention ``softmax(π + κ)`` omits the cap and ``TV(A, A*)``
  carries that difference too.

When the destination token is fixed (``d = " the"``, K8/K9), the keys ``0..n−1`` carry the
text's tokens and key ``n`` carries ``d`` itself.  Everything is computed with log-sum-exp
(``log Z``), never from overflowing exponentials.

Shapes: ``H`` heads of layer 0, ``P`` positions (``n_ctx``), ``V`` vocabulary, ``T``
texts, ``N`` destination positions, ``K`` keys.

On a rotary, ALiBi or position-free model layer 0 reads ``e(x_i)`` alone and the parts are
the L rules' position-only and token-only inputs (:mod:`~posmech.analyses.contextual.relative`,
docs/claims.md): ``π`` the scores of the destination token repeated, ``κ`` those with every
query and key at one position.

Artifact ``results/{model}/contextual/layer0.h5`` (kind ``layer0_decomposition``, rule
``layer0_decomposition``; every dataset in docs/artifacts.md): the measured LayerNorm scale
distribution, the factors ``query [H, P, d_head]`` (destination token fixed),
``positional_key [H, P, d_head]``, ``content_key [H, V, d_head]`` from which any ``π``, ``κ``,
``p``, ``c`` is one dot product (:class:`Decomposition`), the texts used, and for each text
``log Z`` (linear and exact) and ``TV(A, A*)`` at every destination position: what K8, K9
and the contextual-neuron rules (C1–C3) read instead of recomputing.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from posmech.analyses.contextual.relative import Layer0Relative
from posmech.analyses.contextual.weights import Layer0Weights
from posmech.core.errors import PosmechError
from posmech.settings.contextual import ContextualSettings

KIND = "layer0_decomposition"
DESCRIPTIONS = {
    "ln_scale/levels": "[9] quantile levels of the LN-scale quantiles",
    "ln_scale/quantiles": "[9] quantiles of blocks.0.ln1.hook_scale over the scale corpus's tokens (position 0 excluded)",
    "ln_scale/counts": "[50] histogram counts of the LN scale (position 0 excluded)",
    "ln_scale/edges": "[51] histogram bin edges of the LN scale",
    "ln_scale/position0": "[n_documents] the LN scale at position 0 (BOS) of each document",
    "factors/query": "[H, n_ctx, width] exact-LN query of the fixed destination token at every position n (width "
                     "d_head; rotary 2 d_head, ALiBi d_head + 2: contextual.relative)",
    "factors/positional_key": "[H, n_ctx, width] positional key (gamma*p_i/s + beta) W_K + b_K, LN linear at scale s "
                              "(rotary / ALiBi: the destination token's key at position i)",
    "factors/content_key": "[H, d_vocab, width] content key (gamma*e(x)/s) W_K of every token, LN linear at scale s "
                           "(rotary / ALiBi: its key with no position)",
    "texts/corpus": "[T] corpus of each text (the pattern corpus first)",
    "texts/doc_index": "[T] document index of each text in its corpus's tokens file",
    "texts/title": "[T] title of each text",
    "texts/token_ids": "[T, max_position + 1] the first tokens of each text",
    "denominators/positions": "[N] destination positions n = 1..max_position",
    "denominators/log_z_linear": "[T, H, N] log Z_h(n), LN linear, destination token fixed at n",
    "denominators/log_z_exact": "[T, H, N] log Z*_h(n): real-LN normaliser relative to the positional pattern's",
    "denominators/tv_linear_exact": "[T, H, N] total variation between the linear-LN and the exact attention rows",
}
RULE = "layer0_decomposition"


# --------------------------------------------------------------------------- decomposition
def _logsumexp(a: np.ndarray, axis: int = -1) -> np.ndarray:
    m = np.max(a, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        return np.squeeze(m, axis) + np.log(np.sum(np.exp(a - m), axis=axis))


@dataclass
class Decomposition:
    """The decomposition of one text at destination positions ``positions [N]``:
    ``pi, kappa, exact [H, N, K]`` (scores; ``-inf`` / 0 for keys after ``n``), with
    ``K = max(positions) + 1``."""

    positions: np.ndarray
    pi: np.ndarray
    kappa: np.ndarray
    exact: np.ndarray

    @property
    def mask(self) -> np.ndarray:
        return np.arange(self.pi.shape[-1])[None, :] <= self.positions[:, None]  # [N, K]

    @property
    def p(self) -> np.ndarray:
        """Positional pattern ``[H, N, K]``."""
        return softmax(self.pi)

    @property
    def c(self) -> np.ndarray:
        """Content factor ``exp κ`` ``[H, N, K]`` (0 after ``n``)."""
        return np.where(self.mask, np.exp(np.where(self.mask, self.kappa, 0.0)), 0.0)

    @property
    def log_z(self) -> np.ndarray:
        """``log Z_h(n)`` ``[H, N]`` (linear LN)."""
        return _logsumexp(self.pi + self.kappa) - _logsumexp(self.pi)

    @property
    def log_z_exact(self) -> np.ndarray:
        """``log Z*_h(n)`` ``[H, N]`` (real LN, relative to the same positional pattern)."""
        return _logsumexp(self.exact) - _logsumexp(self.pi)

    @property
    def linear(self) -> np.ndarray:
        """Linear-LN attention ``p·c/Z`` ``[H, N, K]``."""
        return softmax(self.pi + self.kappa)

    @property
    def attention(self) -> np.ndarray:
        """Exact attention ``[H, N, K]``."""
        return softmax(self.exact)

    def tv(self) -> np.ndarray:
        """``TV(A, A*)`` ``[H, N]``."""
        return 0.5 * np.abs(self.linear - self.attention).sum(axis=-1)


def softmax(scores: np.ndarray) -> np.ndarray:
    """Softmax over the last axis; ``-inf`` entries get 0."""
    m = np.max(scores, axis=-1, keepdims=True)
    e = np.exp(scores - m)
    return e / e.sum(axis=-1, keepdims=True)


@dataclass
class TextKeys:
    """Keys of one text computed once for several :func:`decompose` calls: the sorted
    token ids ``vocab [U]`` of the text (and destination), their content keys ``kc [H, U, d_head]``
    and the exact keys of the text's tokens ``exact [H, T, d_head]``."""

    vocab: np.ndarray
    kc: np.ndarray
    exact: np.ndarray

    @classmethod
    def of(cls, w: Layer0Weights | Layer0Relative, s: float, ids: np.ndarray, destination: int | None = None) -> TextKeys:
        ids = np.asarray(ids, dtype=np.int64)
        vocab = np.unique(np.concatenate([ids, [] if destination is None else [destination]]).astype(np.int64))
        return cls(vocab, w.content_keys(s, vocab), w.exact_keys(ids, np.arange(len(ids))))


def decompose(w: Layer0Weights | Layer0Relative, s: float, ids: np.ndarray, positions: Sequence[int] | np.ndarray,
              destination: int | None = None, keys: TextKeys | None = None) -> Decomposition:
    """Decompose layer 0 on text ``ids`` at destination ``positions`` (strictly increasing).

    ``destination``: a token id put at each destination position ``n`` (keys ``0..n−1``
    keep the text's tokens, key ``n`` is ``destination``), or None for the text's own token
    (then ``ids`` must reach the largest position).  Memory ``~5·H·N·K`` floats: pass a
    block of positions at a time for long texts, with the text's :class:`TextKeys`."""
    pos = np.asarray(positions, dtype=np.int64)
    K = int(pos.max()) + 1
    ids = np.asarray(ids, dtype=np.int64)
    need = K - 1 if destination is not None else K
    if len(ids) < need:
        raise PosmechError(f"text of {len(ids)} tokens is shorter than destination position {K - 1} needs ({need})")
    kid = ids[:K].copy() if len(ids) >= K else np.concatenate([ids, [ids[0]]])
    if destination is not None:
        kid[K - 1] = destination  # the largest n's own key (each row's key n is set below)
    dest = np.full(len(pos), destination) if destination is not None else ids[pos]
    if keys is None or K > keys.exact.shape[1] + (destination is not None):
        keys = TextKeys.of(w, s, ids, destination)
    q = w.queries(dest, pos)  # [H, N, dh]
    key_inv, dest_inv = np.searchsorted(keys.vocab, kid), np.searchsorted(keys.vocab, dest)
    if not (np.array_equal(keys.vocab[np.minimum(key_inv, len(keys.vocab) - 1)], kid)
            and np.array_equal(keys.vocab[np.minimum(dest_inv, len(keys.vocab) - 1)], dest)):
        raise PosmechError("internal: TextKeys of another text or destination token passed to decompose")
    kappa_u = q @ keys.kc.transpose(0, 2, 1) / w.attn_scale  # [H, N, U]
    kappa = np.take(kappa_u, key_inv, axis=2)  # [H, N, K]
    pi = w.positional_scores(q, dest, pos, K, s)
    ke = keys.exact[:, :K]
    if ke.shape[1] < K:
        ke = np.concatenate([ke, np.zeros_like(ke[:, :1])], axis=1)  # key n, set below
    exact = q @ ke.transpose(0, 2, 1) / w.attn_scale
    if destination is not None:  # key n is the destination token itself
        ke_d = w.exact_keys(dest, pos)  # [H, N, dh]
        rows = np.arange(len(pos))
        kappa[:, rows, pos] = kappa_u[:, rows, dest_inv]
        exact[:, rows, pos] = np.einsum("hne,hne->hn", q, ke_d) / w.attn_scale
    mask = visible_keys(pos, K, int(getattr(w, "window", 0) or 0))
    cap = getattr(w, "softcap", None)
    if cap:  # the model's own score: c·tanh(s / c); π and κ split the logit before the cap
        exact = cap * np.tanh(exact / cap)
    pi = np.where(mask, pi, -np.inf)
    exact = np.where(mask, exact, -np.inf)
    kappa = np.where(mask, kappa, 0.0)
    return Decomposition(pos, pi, kappa, exact)


def visible_keys(pos: np.ndarray, K: int, window: int = 0) -> np.ndarray:
    """``[N, K]`` True where destination ``pos[j]`` sees key ``i``: ``i ≤ n`` and, in a sliding
    layer of ``window`` keys, ``n − i < window`` (the model's mask: Gemma 2's and Mistral's)."""
    k = np.arange(K)[None, :]
    n = np.asarray(pos)[:, None]
    return (k <= n) & (n - k < window) if window else k <= n


def denominators(w: Layer0Weights | Layer0Relative, s: float, ids: np.ndarray, positions: np.ndarray, destination: int,
                 block: int = 128) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``log Z``, ``log Z*`` and ``TV(A, A*)``, each ``[H, N]``, of one text with the
    destination token fixed, in blocks of ``block`` positions."""
    pos = np.asarray(positions, dtype=np.int64)
    out = [np.empty((w.n_heads, len(pos))) for _ in range(3)]
    keys = TextKeys.of(w, s, np.asarray(ids)[: int(pos.max())], destination)
    for a in range(0, len(pos), block):
        dec = decompose(w, s, ids, pos[a : a + block], destination, keys)
        out[0][:, a : a + block] = dec.log_z
        out[1][:, a : a + block] = dec.log_z_exact
        out[2][:, a : a + block] = dec.tv()
    return out[0], out[1], out[2]


def positional_pattern(query: np.ndarray, positional_key: np.ndarray, n: int, attn_scale: float,
                       window: int = 0) -> np.ndarray:
    """``p_h(n, ·)`` ``[H, n + 1]`` from the stored factors ``query, positional_key [H, P, d_head]``
    (0 at keys a sliding layer of ``window`` keys hides)."""
    s = np.einsum("he,hke->hk", query[:, n], positional_key[:, : n + 1]) / attn_scale
    return softmax(np.where(visible_keys(np.array([n]), n + 1, window)[0], s, -np.inf))


def etc(p: np.ndarray) -> np.ndarray:
    """Effective Token Count ``1 / Σ p²`` over the last axis."""
    return 1.0 / np.square(p).sum(axis=-1)


def tv(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Total variation ``½ Σ |a − b|`` over the last axis."""
    return 0.5 * np.abs(a - b).sum(axis=-1)


def renormalised(p: np.ndarray, k0: int) -> np.ndarray:
    """``p`` over keys ``k0..`` renormalised (keys before ``k0`` dropped)."""
    q = p[..., k0:]
    return q / q.sum(axis=-1, keepdims=True)


# --------------------------------------------------------------------------- inputs
def single_token(tokenizer: Any, text: str, key: str) -> int:
    """The id of ``text`` if the tokenizer keeps it as one token; else a clear error naming ``key``."""
    ids = tokenizer(text, add_special_tokens=False).input_ids
    if len(ids) != 1:
        pieces = [tokenizer.decode([i]) for i in ids]
        raise PosmechError(f"config key `{key}`: {text!r} is {len(ids)} tokens for this model's tokenizer "
                           f"({pieces}); choose a string that is a single token")
    back = tokenizer.decode(ids)
    if back != text:
        raise PosmechError(f"config key `{key}`: {text!r} does not decode back from its token ({back!r}: the "
                           "tokenizer drops or changes characters); choose a string that is a single token")
    return int(ids[0])


def choose_texts(corpora: dict[str, Any], n_per_corpus: int, min_length: int, seed: int,
                 key: str) -> list[dict[str, Any]]:
    """``n_per_corpus`` documents of at least ``min_length`` tokens from each corpus
    (:class:`posmech.data.tokens.TokenSet` by name), drawn with ``seed``; the first corpus's
    first text is the one whose patterns are drawn (K6, K10).  A corpus with too few long
    documents is an error naming ``key``."""
    rng = np.random.default_rng(seed)
    out = []
    for name, toks in corpora.items():
        lengths = toks.lengths()
        ok = np.flatnonzero(lengths >= min_length)
        if len(ok) < n_per_corpus:
            raise PosmechError(
                f"config key `{key}`: corpus {name!r} has {len(ok)} document(s) of at least {min_length} tokens "
                f"(longest {int(lengths.max())}), {n_per_corpus} needed: the largest position is beyond the texts; "
                "lower the positions or `contextual.texts.n_per_corpus`"
            )
        for j in np.sort(rng.choice(ok, size=n_per_corpus, replace=False)):
            out.append({"corpus": name, "doc_index": int(j), "title": toks.titles[int(j)],
                        "ids": np.asarray(toks.doc(int(j))[:min_length], dtype=np.int64)})
    return out


def ln_scale_summary(w: Layer0Weights | Layer0Relative, tokens: Any, max_tokens: int | None = None,
                     block: int = 8192) -> dict[str, Any]:
    """The distribution of ``blocks.0.ln1.hook_scale`` over the tokens of a corpus
    (:class:`posmech.data.tokens.TokenSet`): quantiles (levels 0, .01, .05, .25, .5, .75, .95,
    .99, 1), mean, a 50-bin histogram; all tokens (BOS included: listed separately)."""
    pos = np.concatenate([np.arange(n) for n in tokens.lengths()])
    ids = tokens.flat
    if max_tokens is not None:
        ids, pos = ids[:max_tokens], pos[:max_tokens]
    vals = np.concatenate([w.ln_scale(ids[a : a + block], pos[a : a + block]) for a in range(0, len(ids), block)])
    if not len(vals):
        raise PosmechError("the LayerNorm-scale corpus has no tokens")
    levels = np.array([0, 0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99, 1.0])
    non_first = vals[pos != 0] if (pos != 0).any() else vals
    counts, edges = np.histogram(non_first, bins=50)
    return {"levels": levels, "quantiles": np.quantile(non_first, levels), "mean": float(non_first.mean()),
            "std": float(non_first.std()), "n_tokens": int(len(non_first)), "position0": vals[pos == 0],
            "counts": counts, "edges": edges}


# --------------------------------------------------------------------------- artifact
def build_decomposition(w: Layer0Weights | Layer0Relative, destination: int, destination_text: str, scale_tokens: Any,
                        texts: list[dict[str, Any]], max_position: int, ln_scale: float | None,
                        path: str | os.PathLike[str], attrs: dict[str, Any],
                        progress: Any = None) -> dict[str, Any]:
    """Rule ``layer0_decomposition``: measure the LN scale on ``scale_tokens``, fix ``s``
    (``ln_scale`` or the median), compute the factors and every text's denominators at
    positions ``1..max_position`` and write ``path`` (layout in the module docstring)."""
    from posmech.store.hdf5 import STR, artifact_writer, describe

    summary = ln_scale_summary(w, scale_tokens)
    s = float(ln_scale) if ln_scale is not None else float(summary["quantiles"][4])
    positions = np.arange(1, max_position + 1)
    H, P = w.n_heads, w.n_ctx
    meta = {**attrs, "destination_token": destination_text, "destination_id": destination, "ln_scale_used": s,
            "ln_scale_source": "config" if ln_scale is not None else "median", "ln_eps": w.eps,
            "attn_scale": w.attn_scale, "n_heads": H, "d_head": w.d_head, "n_ctx": P,
            "position_scheme": getattr(w, "scheme", "learned"), "window": int(getattr(w, "window", 0) or 0),
            "softcap": float(getattr(w, "softcap", None) or 0.0),
            "max_position": max_position, "layer": 0}
    query = w.queries(np.full(P, destination), np.arange(P))
    with artifact_writer(path, KIND, RULE, meta) as f:
        g = f.create_group("ln_scale")
        for k in ("levels", "quantiles", "counts", "edges", "position0"):
            g.create_dataset(k, data=summary[k])
        for k in ("mean", "std", "n_tokens"):
            g.attrs[k] = summary[k]
        fa = f.create_group("factors")
        fa.create_dataset("query", data=query)
        fa.create_dataset("positional_key", data=w.positional_keys(s, destination))
        ck = fa.create_dataset("content_key", shape=(H, w.d_vocab, query.shape[-1]), dtype="float32",
                               chunks=(1, min(w.d_vocab, 4096), query.shape[-1]))
        for a in range(0, w.d_vocab, 8192):
            ck[:, a : a + 8192] = w.content_keys(s, np.arange(a, min(a + 8192, w.d_vocab))).astype(np.float32)
        t = f.create_group("texts")
        t.create_dataset("corpus", data=[x["corpus"] for x in texts], dtype=STR)
        t.create_dataset("doc_index", data=np.array([x["doc_index"] for x in texts], dtype=np.int64))
        t.create_dataset("title", data=[x["title"] for x in texts], dtype=STR)
        t.create_dataset("token_ids", data=np.stack([x["ids"][: max_position + 1] for x in texts]).astype(np.int32))
        d = f.create_group("denominators")
        d.create_dataset("positions", data=positions)
        out = {k: d.create_dataset(k, shape=(len(texts), H, len(positions)), dtype="float64")
               for k in ("log_z_linear", "log_z_exact", "tv_linear_exact")}
        for j, x in enumerate(texts):
            lz, lze, tvs = denominators(w, s, x["ids"], positions, destination)
            out["log_z_linear"][j], out["log_z_exact"][j], out["tv_linear_exact"][j] = lz, lze, tvs
            if progress:
                progress(j + 1, len(texts))
        tv_med = float(np.median(f["denominators/tv_linear_exact"][()]))
        describe(f, DESCRIPTIONS)
    return {"ln_scale_used": s, "quantiles": dict(zip(summary["levels"].tolist(), summary["quantiles"].tolist())),
            "tv_median": tv_med, "n_texts": len(texts)}


@dataclass
class Layer0File:
    """The contents of ``layer0.h5`` (:func:`read_decomposition`)."""

    attrs: dict[str, Any]
    ln_scale: dict[str, Any]
    query: np.ndarray
    positional_key: np.ndarray
    texts: pd.DataFrame
    token_ids: np.ndarray
    positions: np.ndarray
    log_z_linear: np.ndarray
    log_z_exact: np.ndarray
    tv_linear_exact: np.ndarray
    path: str

    def content_key(self, ids: np.ndarray | None = None) -> np.ndarray:
        """``kc [H, U, d_head]`` (float32 on disk) of tokens ``ids`` (all when None)."""
        from posmech.store.hdf5 import open_artifact

        with open_artifact(self.path, KIND) as f:
            ds = f["factors/content_key"]
            if ids is None:
                return ds[()].astype(np.float64)
            ids = np.asarray(ids)
            u, inv = np.unique(ids, return_inverse=True)
            return ds[:, u, :].astype(np.float64)[:, inv]

    def pattern(self, n: int) -> np.ndarray:
        """Positional pattern ``p_h(n, ·)`` ``[H, n + 1]`` of the fixed destination token."""
        return positional_pattern(self.query, self.positional_key, n, float(self.attrs["attn_scale"]),
                                  int(self.attrs.get("window", 0) or 0))


def read_decomposition(path: str | os.PathLike[str]) -> Layer0File:
    """Read ``layer0.h5`` (everything but the content keys, read on demand)."""
    from posmech.store.hdf5 import attr_json, open_artifact

    with open_artifact(path, KIND) as f:
        attrs = {k: attr_json(f, k) for k in f.attrs}
        g = f["ln_scale"]
        ln = {k: g[k][()] for k in g}
        ln.update({k: g.attrs[k] for k in g.attrs})
        dec = lambda a: [v.decode() if isinstance(v, bytes) else str(v) for v in a]  # noqa: E731
        texts = pd.DataFrame({"corpus": dec(f["texts/corpus"][()]), "doc_index": f["texts/doc_index"][()],
                              "title": dec(f["texts/title"][()])})
        return Layer0File(attrs, ln, f["factors/query"][()], f["factors/positional_key"][()], texts,
                          f["texts/token_ids"][()].astype(np.int64), f["denominators/positions"][()],
                          f["denominators/log_z_linear"][()], f["denominators/log_z_exact"][()],
                          f["denominators/tv_linear_exact"][()], str(path))


# --------------------------------------------------------------------------- config
# --------------------------------------------------------------------------- scorecard rows (K6, K8)
def decomposition_scorecard(summary: dict[str, Any], n_tokens: int, scale_corpus: str, destination_token: str,
                            model: str, figure: str, h5: str) -> list[dict[str, Any]]:
    """K6 and K8 rows of rule layer0_decomposition from :func:`build_decomposition`'s
    ``summary`` (``quantiles`` of the LayerNorm scale, ``ln_scale_used``, ``tv_median``).

    * K6 ``ln1_scale_range`` — the 5th and 95th percentiles of ``blocks.0.ln1.hook_scale``
      over ``n_tokens`` tokens of ``scale_corpus`` (position 0 excluded); the detail adds the
      median, the 1st–99th percentiles and the scale ``s`` the linear LayerNorm uses;
    * K8 ``linear_vs_exact_tv`` — the median over texts, heads and destination positions of
      the total-variation distance between the attention with LayerNorm 1 linear at ``s``
      and the exact attention, destination token ``destination_token``."""
    q = summary["quantiles"]
    rows = [{"claim": "K6", "quantity": "ln1_scale_range", "value": [round(q[0.05], 4), round(q[0.95], 4)],
             "detail": f"5th and 95th percentiles of blocks.0.ln1.hook_scale over {n_tokens} "
             f"{scale_corpus} tokens (position 0 excluded); median {q[0.5]:.4f}, 1st-99th "
             f"{q[0.01]:.4f}-{q[0.99]:.4f}; linear LN uses s = {summary['ln_scale_used']:.4f}", "artifact": figure},
            {"claim": "K8", "quantity": "linear_vs_exact_tv", "value": round(summary["tv_median"], 6),
             "detail": "median over texts, heads and destination positions of TV(linear-LN attention, exact "
             f"attention), destination {destination_token!r}", "artifact": h5}]
    return [{**r, "model": model} for r in rows]


def check_contexts(settings: ContextualSettings, models: Iterable[str], n_ctx: Callable[[str], int]) -> None:
    """The section's positions against the context ``n_ctx(model)`` of each of ``models``
    (those the family runs on), before any job (:func:`posmech.settings.positions_for`): a
    :class:`~posmech.core.errors.PosmechError` naming the key and the model for the first that
    does not fit (the rule resolves them with the model's own context)."""
    from posmech.settings import positions_for

    for m in models:
        positions_for(settings, n_ctx(m), m)
