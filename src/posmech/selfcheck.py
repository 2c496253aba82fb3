"""The self-check: hand-built models whose verdicts are known in advance, run through the whole
DAG (``make selfcheck``, config/selfcheck.yaml), and the comparison of the findings table with
those expected verdicts (``python -m posmech selfcheck``).

A verdict is only worth what its power is: each case below is a model built by
:mod:`posmech.models.handbuilt` with exactly known behaviour, and states, next to its
construction, the verdict each finding it covers must get and why.  A finding is *covered* by
the self-check when at least one case expects ``holds`` and another expects ``fails`` or ``not
measurable`` (for a stated reason); :func:`coverage` counts it from the config's expected
verdicts (section ``selfcheck.expected``), the single place a run is checked against.

Command line (what ``make selfcheck`` runs before Snakemake)::

    python -m posmech.selfcheck build DIR     # writes DIR/<case>/ for every case

The models' sizes follow config/selfcheck.yaml: a 32-position context (the CI-sized analyses'
positions, e.g. ``kernels.etc_positions: [16, 31]``, fit) and character tokenizers.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from posmech.models import handbuilt as hb

NO_CONTEXTUAL = ("no layer-0 head is contextual (K7: L0H0 other, L0H1 detokenization), the only class "
                 "neurons.head_classes names: no broad head for the C rules")
N_CTX = 32  # the context of every self-check model
D_VOCAB = 96  # GPT-2-architecture cases: BOS + the 95 printable ASCII characters (every prompt tokenizes)
VERDICTS = ("holds", "fails", "not measurable")


# --------------------------------------------------------------------------- model constructions
def relay_spec(n: int = N_CTX, d_vocab: int = 40) -> hb.Spec:
    """P5's mechanism, planted: L1H0 finds the previous position only through layer 0.

    Layer 0's L0H1 is an exact previous-token head on the positions (dims 0..n-1, spare 2n+1)
    and copies the attended key's position, one-hot, into dims n..2n-1 (spare 2n).  L1H0's
    query reads that copy and its key reads the key's own position: its score is 30 on the
    key whose position layer 0 copied (the previous one) and 0 elsewhere.  A query whose
    copy is missing (layer 0 could not attend to its previous position) has a zero query
    vector, so L1H0 attends uniformly over its q + 1 keys there: previous-token mass
    exactly 1 / (q + 1)."""
    spec = hb.positional_spec(n_ctx=n, n_layer=2, n_head=2, d_vocab=d_vocab,
                              scores={(0, 1): hb.previous_token_scores(n)})
    d, dh = spec.d_model, spec.dh  # 2n + 2, n + 1
    amp = np.sqrt(d / 2.0)  # LN maps a one-hot position (with its spare) to amp·(e_i − e_spare)
    W_V = np.zeros((d, dh))
    W_V[np.arange(n), np.arange(n)] = 1.0
    W_O = np.zeros((dh, d))
    W_O[np.arange(n), n + np.arange(n)] = 1.0 / amp
    W_O[np.arange(n), 2 * n] = -1.0 / amp
    spec.heads[(0, 1)].update(W_V=W_V, W_O=W_O)
    # layer 1's input is two unit blocks (position + copy): LN multiplies it by sqrt(d / 4)
    a = np.sqrt(30.0 * np.sqrt(dh) / (d / 4.0))
    W_Q = np.zeros((d, dh))
    W_K = np.zeros((d, dh))
    W_Q[n + np.arange(n), np.arange(n)] = a
    W_K[np.arange(n), np.arange(n)] = a
    spec.heads[(1, 0)] = {"W_Q": W_Q, "W_K": W_K}
    return spec


def direct_spec(n: int = N_CTX, d_vocab: int = 40) -> hb.Spec:
    """Two exact previous-token heads (L0H1, L1H0) that each read the positions themselves:
    knocking out layer 0's attention changes nothing in layer 1.  L0H0 and L1H1 have zero
    scores (uniform attention); token embeddings, every W_V/W_O, the MLPs and W_U are zero, so
    the residual stream is the positional embedding at every layer and every prediction is
    uniform over the vocabulary."""
    return hb.positional_spec(n_ctx=n, n_layer=2, n_head=2, d_vocab=d_vocab, scores={
        (0, 1): hb.previous_token_scores(n), (1, 0): hb.previous_token_scores(n)})


def helix_spec(n: int = N_CTX, d_vocab: int = D_VOCAB) -> hb.Spec:
    """W_pos in three dimensions only: row i = (3 cos θ_i, 2 sin θ_i, i / n − 1/2), θ_i = 2πi/n,
    in a d_model of 8; token embeddings and every head zero, so the residual stream is W_pos at
    every layer."""
    theta = 2 * np.pi * np.arange(n) / n
    W_pos = np.zeros((n, 8))
    W_pos[:, 0], W_pos[:, 1], W_pos[:, 2] = 3 * np.cos(theta), 2 * np.sin(theta), np.arange(n) / n - 0.5
    return hb.Spec(n_layer=2, n_head=2, d_model=8, n_ctx=n, d_vocab=d_vocab, W_pos=W_pos)


DECAY = 0.3  # the slowly decaying head's scores -DECAY·(n − i)


def kernel_types_spec(n: int = N_CTX, d_vocab: int = D_VOCAB) -> hb.Spec:
    """Layer 0 with one kernel of each type: L0H0 an exact previous-token head (local, ETC ~1),
    L0H1 scores ``-DECAY·(n − i)`` (a geometric kernel: over m keys its ETC is
    :func:`posmech.analyses.kernels.truncated_geometric_etc` (0.3, m), 6.72 over the 30 keys
    k0 = 2..31 at n = 31: 0.22 of them, between the local 0.1 and the uniform 0.5), L0H2 zero
    scores (uniform, ETC = m); layer 1 zero."""
    offsets = np.subtract.outer(np.arange(n), np.arange(n)).astype(float)
    return hb.positional_spec(n_ctx=n, n_layer=2, n_head=3, d_vocab=d_vocab, scores={
        (0, 0): hb.previous_token_scores(n), (0, 1): -DECAY * offsets})


def future_peak_spec(n: int = N_CTX, d_vocab: int = D_VOCAB) -> hb.Spec:
    """As :func:`direct_spec`, but L1H0 also scores 60 on the *future* key q + 1: the causal
    mask hides it, so L1H0 is still an exact previous-token head, yet its raw scores peak at
    q + 1 on every row but the last."""
    S = hb.previous_token_scores(n)
    S[np.arange(n - 1), np.arange(1, n)] = 60.0
    return hb.positional_spec(n_ctx=n, n_layer=2, n_head=2, d_vocab=d_vocab, scores={
        (0, 1): hb.previous_token_scores(n), (1, 0): S})


def dark_diagonal_spec(n: int = N_CTX, d_vocab: int = D_VOCAB, alpha: float = 1.0, gamma: float = 3.0) -> hb.Spec:
    """An early previous-token head with a dark main diagonal below an exact one: L0H1 scores
    ``alpha·(i − n) − gamma·[i = n]`` (later keys higher, the query's own key suppressed: its
    largest attention is on q − 1, ~0.58), L1H0 an exact previous-token head (the sharp one)."""
    i = np.arange(n)
    S = alpha * (i[None, :] - i[:, None]) - gamma * np.eye(n)
    return hb.positional_spec(n_ctx=n, n_layer=2, n_head=2, d_vocab=d_vocab, scores={
        (0, 1): S, (1, 0): hb.previous_token_scores(n)})


def token_norms_spec(n: int = N_CTX, d_vocab: int = D_VOCAB) -> hb.Spec:
    """No head; token t is embedded as ``a_t·(e_{n+8} − e_{n+9})`` with ``a_t = (t mod 8)/2``
    (0 to 3.5), orthogonal to the one-hot positions (norm sqrt 2): the residual's norm, and so
    the layer-0 LayerNorm scale, varies with the token by up to sqrt(1 + 3.5²) ≈ 3.6 times."""
    spec = hb.positional_spec(n_ctx=n, n_layer=2, n_head=2, d_vocab=d_vocab)
    a = (np.arange(d_vocab) % 8) / 2.0
    W_E = np.zeros((d_vocab, spec.d_model))
    W_E[:, n + 8], W_E[:, n + 9] = a, -a
    spec.W_E = W_E
    spec.W_U = np.zeros((spec.d_model, d_vocab))  # untied: the unembedding stays zero
    return spec


BROAD_DECAY = 0.2  # the contextual heads' positional scores -BROAD_DECAY·(n − i)
BROAD_CONTENT = (1.5, 0.3)  # their content scores' scales (L0H0, L0H1)
BROAD_WRITE = 0.02  # the scale of what L0H1 writes (LN2's scale stays within 1.25 times)
TARGET_WIDTH = 0.1  # layer 1: the query token's target position c(x) scores -TARGET_WIDTH·(i − c(x))²


def _layout_head(P: np.ndarray | None, C: np.ndarray | None, f: np.ndarray | None, g: np.ndarray | None,
                 sigma: float, d: int, dh: int, n: int, t0: int, a: float, b: float) -> dict[str, np.ndarray]:
    """Q/K weights scoring ``P[n, i] + C[x_i] + f[x_n]·g[i]`` on a residual laid out as
    ``a``·one-hot position (dims 0..n-1, spare n) + ``b``·one-hot token (dims t0.., spare after)
    that LayerNorm divides by ``sigma``."""
    W_Q, W_K, b_Q = np.zeros((d, dh)), np.zeros((d, dh)), np.zeros(dh)
    root, r = np.sqrt(dh), 0
    if P is not None:
        U, S, Vt = np.linalg.svd(P)
        r = int((S > 1e-10 * max(1.0, S[0])).sum())
        W_Q[:n, :r] = U[:, :r] * np.sqrt(S[:r]) * sigma / a
        W_K[:n, :r] = Vt[:r].T * np.sqrt(S[:r]) * sigma / a * root
    if C is not None:
        b_Q[r] = 1.0
        W_K[t0 : t0 + len(C), r] = C * sigma / b * root
        r += 1
    if f is not None:
        W_Q[t0 : t0 + len(f), r] = f * sigma / b
        W_K[:n, r] = g * sigma / a * root
    return {"W_Q": W_Q, "W_K": W_K, "b_Q": b_Q}


def broad_context_spec(n: int = N_CTX, d_vocab: int = D_VOCAB, mlp: bool = True, seed: int = 0) -> hb.Spec:
    """Contextual heads feeding layer-0 neurons, and a layer 1 whose kernels follow the query token.

    Residual layout (d_model 256, 4 heads of 64): ``W_pos[i] = e_i − e_n`` and ``W_E[x] =
    0.7(e_{n+1+x} − e_{n+1+V})``, every residual zero-mean of the same norm, so the layer-0
    LayerNorm scale is one constant σ and the scores below are exact:

    * L0H0, L0H1 (contextual): ``-BROAD_DECAY·(n − i) + C_h[x_i]`` (a broad geometric kernel,
      ETC ~0.3 of the keys, mass 0.45 on the last 3 keys; random content scores ``C_h`` of
      scales ``BROAD_CONTENT``: L0H0's denominator varies strongly with the text, L0H1's little);
      L0H1 writes ``Σ_i p_i·R[x_i]`` (random zero-mean ``R``, scale ``BROAD_WRITE``) into 16
      spare dimensions, L0H0 writes nothing;
    * L0H2, L0H3: exact previous-token heads (score 10 on key q − 1), writing nothing;
    * MLP 0: neurons 0, 1, 2 read only what L0H1 writes (random weights), every other neuron
      nothing (``mlp`` false: every input weight zero); the MLP writes nothing;
    * layer 1, every head: ``-TARGET_WIDTH·(i − c_h(x_n))² + C'_h[x_i]`` — the query token picks
      a target key position ``c_h(x)`` (random in 0..n-1), so the positional kernel moves with
      the query text, and key content scores (scale 3) pick among the keys near the target, so
      a real row is far from its kernel."""
    rng = np.random.default_rng(seed)
    H, dh, a, b = 4, 64, 1.0, 0.7
    d, t0 = H * dh, n + 1
    sigma = np.sqrt((2 * a * a + 2 * b * b) / d + 1e-12)
    W_pos = np.zeros((n, d))
    W_pos[np.arange(n), np.arange(n)], W_pos[:, n] = a, -a
    W_E = np.zeros((d_vocab, d))
    W_E[np.arange(d_vocab), t0 + np.arange(d_vocab)], W_E[:, t0 + d_vocab] = b, -b
    spec = hb.Spec(2, H, d, n, d_vocab, dh, W_E=W_E, W_pos=W_pos, W_U=np.zeros((d, d_vocab)))
    offsets = np.subtract.outer(np.arange(n), np.arange(n)).astype(float)
    out = np.arange(140, 156)  # what L0H1 writes (unused by the embeddings)
    lay = dict(sigma=sigma, d=d, dh=dh, n=n, t0=t0, a=a, b=b)
    for h, scale in enumerate(BROAD_CONTENT):
        spec.heads[(0, h)] = _layout_head(-BROAD_DECAY * offsets, rng.normal(0, scale, d_vocab), None, None, **lay)
    R = rng.normal(0, BROAD_WRITE, (d_vocab, 16))
    W_V, W_O = np.zeros((d, dh)), np.zeros((dh, d))
    W_V[t0 : t0 + d_vocab, :16] = R - R.mean(axis=1, keepdims=True)  # each write sums to 0: LN only rescales
    W_O[np.arange(16), out] = 1.0
    spec.heads[(0, 1)].update(W_V=W_V, W_O=W_O)
    for h in (2, 3):
        spec.heads[(0, h)] = _layout_head(hb.previous_token_scores(n, 10.0), None, None, None, **lay)
    W_in = np.zeros((d, 4 * d))
    if mlp:
        W_in[out, :3] = rng.normal(0, 1.0, (16, 3))
    spec.mlps[0] = {"W_in": W_in}
    i = np.arange(n, dtype=float)
    square = np.tile(-TARGET_WIDTH * i**2, (n, 1))  # -w·i², and 2w·c(x)·i below: -w(i - c)² up to a constant
    for h in range(H):
        spec.heads[(1, h)] = _layout_head(square, rng.normal(0, 3.0, d_vocab), rng.uniform(0, n - 1, d_vocab),
                                          2 * TARGET_WIDTH * i, **lay)
    return spec


def undefined_kernel_spec(n: int = N_CTX, d_vocab: int = D_VOCAB) -> hb.Spec:
    """:func:`direct_spec` with L1H1's query weights not a number: its query, so its softmax
    over the key positions, is undefined (the other three heads are untouched; layer 0, where
    every kernel's query and keys are read, stays finite)."""
    spec = direct_spec(n, d_vocab)
    spec.heads[(1, 1)] = {"W_Q": np.full((spec.d_model, spec.dh), np.nan)}
    return spec


LB2_OFFSETS = {2: 5.0, 1: 4.0, 3: 3.0}  # the look-back-two head's position scores by offset n - i


def planted_attn_only_spec(n: int = 16, d_vocab: int = 24, look_back_two: bool = True) -> hb.AttnOnlySpec:
    """L0H0: exact previous-token head that copies the previous token (query 1 attends to itself:
    the L3 exception); L0H1 (``look_back_two``): look-back-two head with planted position scores
    ``LB2_OFFSETS`` and random token scores (seed 0); L1H0: induction head with a BOS sink."""
    S_prev = hb.offset_scores(n, {1: 60.0}, self_first=60.0)
    S_prev[0, 0] = 60.0
    spec = hb.AttnOnlySpec(n_ctx=n, d_vocab=d_vocab, scores_pos={(0, 0): S_prev}, copy_head=0,
                           induction=(0, 6.0, 4.0, 12.0))
    if look_back_two:
        spec.scores_pos[(0, 1)] = hb.offset_scores(n, LB2_OFFSETS)
        spec.scores_tok[(0, 1)] = np.random.default_rng(0).normal(size=(d_vocab, d_vocab))
    return spec


# --------------------------------------------------------------------------- cases
@dataclass(frozen=True)
class Case:
    """One self-check model: its construction, the architecture it is written as (``gpt2``: a
    Hugging Face GPT-2 directory; ``attn_only``: a legacy TransformerLens attention-only
    directory), and per claim the expected verdict with the reason it must be so."""

    name: str
    kind: str
    build: Callable[[], Any]
    expected: dict[str, tuple[str, str]] = field(default_factory=dict)  # claim -> (verdict, why)

    def write(self, path: str | Path) -> Path:
        spec = self.build()
        if self.kind == "gpt2":
            return hb.save_model_dir(spec, path)
        return hb.save_attn_only_dir(spec, path)


CASES: tuple[Case, ...] = (
    Case("p5-relay", "gpt2", lambda: relay_spec(N_CTX, D_VOCAB), {
        "P5": ("holds", "L1H0 finds the previous position only through layer 0's copy: at the knocked-out "
                        "queries it attends uniformly, mass 1/(q+1), far below the threshold ratio"),
    }),
    # The residual stream is W_pos at every layer (nothing is written) and every prediction is
    # uniform over the 96 tokens; the W_pos rows are orthogonal one-hot vectors of equal norm.
    Case("p5-direct", "gpt2", lambda: direct_spec(N_CTX, D_VOCAB), {
        "P1": ("fails", "the centred one-hot rows of W_pos spread their variance evenly over ~30 directions: "
                        "the top three hold ~0.1, below 0.5"),
        "P2": ("holds", "no head, MLP or unembedding writes anything: the predictions are uniform whatever "
                        "W_pos is, so averaging it in groups of any size changes nothing"),
        "P3": ("fails", "uniform predictions: P(repeated word) = (1/96)^length, far below 0.9"),
        "P4": ("fails", "L1H0 reads exact positions: averaging W_pos in groups of 10 makes a group's positions "
                        "identical and spreads its attention over the group (similarity ~0.4, below 0.9)"),
        "P5": ("fails", "L1H0 reads the positions itself: the knock-out of layer 0 changes nothing (ratio 1)"),
        "P6": ("holds", "2 of the 4 heads (L0H1, L1H0) are exact previous-token heads: 0.5; the two zero-score "
                        "heads tie exactly on offsets 0 and -1 and a tie is never a previous-token head"),
        "P7": ("holds", "the exact previous-token heads put e^-30 off offset -1: ratio ~0, below 0.1"),
        "P8": ("holds", "token embeddings are zero: the extended positional embeddings are the same for every "
                        "token (cosine 1)"),
        "P9": ("fails", "the later layers' residual stream is W_pos itself: sparsity ratio 1, below 1.5"),
        "P10": ("fails", "as P1: a later layer's extended embeddings are W_pos itself (~0.1 in three components)"),
        "P11": ("not measurable", "W_pos's singular values are all equal: its top-3 subspace is not defined"),
        "P12": ("holds", "L1H0's raw scores are 30 on key q - 1 and 0 on every other key, future keys included"),
        "P13": ("fails", "the early previous-token head L0H1 scores 0 on the diagonal and 30 below it: a bright "
                         "sub-diagonal, not a dark diagonal (fraction 0)"),
        "P14": ("fails", "L1H0 is blind to tokens: its previous-token mass is 1 on repeated tokens too (blip 0)"),
        "P15": ("fails", "the early head L0H1 and the sharp head L1H0 both read exact positions: averaging the "
                         "extended embeddings before either damages both alike (gap 0, below 0.2)"),
        "P16": ("fails", "uniform predictions: the redirected word's probability is ~1e-6 whatever the head does"),
        "K1": ("holds", "every head's kernel (exact previous-token or uniform) has a finite ETC"),
        "K2": ("holds", "the local kernels are exact previous-token kernels: they depend on n - i only (TV 0)"),
        "K3": ("fails", "two kernel types only, local and uniform: no slowly decaying head"),
        "K4": ("holds", "L0H1 is an exact previous-token head: a local kernel in layer 0"),
        "K5": ("holds", "token embeddings are zero: no kernel depends on the query text (overlap 1)"),
        "K6": ("holds", "every position's residual has the same norm: the layer-0 LN scale is constant (ratio 1)"),
        "K7": ("fails", "no contextual head: L0H0 (zero scores, uniform) is other, L0H1 detokenization"),
        "K8": ("fails", "the broad head L0H0 has zero scores: its softmax denominator is n + 1 whatever the text "
                        "(spread 0, below 0.1)"),
        "K9": ("not measurable", "no layer-0 head's denominator varies with the tokens: nothing to fit"),
        "K10": ("holds", "layer 1's attention is purely positional: both layer-1 heads equal their kernels"),
        "C1": ("not measurable", NO_CONTEXTUAL),
        "C2": ("not measurable", NO_CONTEXTUAL),
        "C3": ("not measurable", NO_CONTEXTUAL),
    }),
    # Every head has zero scores: uniform attention, exactly tied on every offset.
    Case("uniform", "gpt2", lambda: hb.positional_spec(n_ctx=N_CTX, n_layer=2, n_head=2, d_vocab=D_VOCAB), {
        "P6": ("fails", "every head attends uniformly: its mean diagonals at offsets 0 and -1 tie exactly, and a "
                        "tie goes to offset 0, so no head is a previous-token head (fraction 0)"),
        "P7": ("not measurable", "no previous-token head: there is no sharpest one to take the ratio of"),
        "K2": ("not measurable", "no head's kernel is local: no local kernel to test for translation equivariance"),
        "K4": ("fails", "every layer-0 kernel is uniform: no local head"),
    }),
    Case("helix", "gpt2", helix_spec, {
        "P1": ("holds", "W_pos lies in three dimensions: its top three components hold all its variance (1.0)"),
        "P10": ("holds", "nothing is written: a later layer's extended embeddings are W_pos, in three dimensions"),
        "P11": ("holds", "the extended embeddings' top-3 subspace is W_pos's own (distinct singular values): "
                         "angles 0"),
    }),
    Case("kernel-types", "gpt2", kernel_types_spec, {
        "K3": ("holds", "L0H0 local (ETC ~1), L0H1 slowly decaying (closed-form ETC 6.72 of 30 keys), "
                        "L0H2 uniform: all three types"),
    }),
    Case("future-peak", "gpt2", future_peak_spec, {
        "P12": ("fails", "the sharp head L1H0's raw scores peak at the future key q + 1 (60 > 30) on every row "
                         "but the last: fraction 1/31, below 0.5"),
    }),
    Case("dark-diagonal", "gpt2", dark_diagonal_spec, {
        "P13": ("holds", "the one early previous-token head L0H1 has its self score 3 below the smooth profile "
                         "of its neighbours: a dark diagonal (fraction 1)"),
    }),
    Case("token-norms", "gpt2", token_norms_spec, {
        "K6": ("fails", "the token embeddings' norms range from 0 to 3.5 times sqrt 2 beside the positions' "
                        "sqrt 2: the layer-0 LN scale varies over the text's tokens well beyond 1.25 times"),
    }),
    # Contextual heads feeding three layer-0 neurons, and a layer 1 that reads the tokens
    # (broad_context_spec): the K7-K9 and C findings hold, K5 and K10 fail.
    Case("broad-context", "gpt2", broad_context_spec, {
        "K5": ("fails", "each layer-1 head's kernel peaks at the target position c_h(x_n) its query token picks: "
                        "the query texts' different characters at n = 31 give kernels far apart (overlap with their "
                        "mean well below 0.8), so with the four layer-0 heads at 1 the median over the 8 heads is "
                        "below 0.9"),
        "K7": ("holds", "L0H0 and L0H1 have broad geometric kernels (ETC ~0.3 of the keys, mass 0.45 on the last "
                        "3) and no duplicate-token score: two contextual heads"),
        "K8": ("holds", "L0H0's content scores (scale 1.5) make its softmax denominator depend on the text's "
                        "tokens: log Z's spread over texts is above 0.1"),
        "K9": ("holds", "the denominators vary through independent content scores only, as the model "
                        "Var Z = sum p_i^2 Var(c) assumes; the two heads' content scales (1.5, 0.3) spread the "
                        "predicted variances over more than a decade"),
        "K10": ("fails", "every layer-1 head's key content scores (scale 3) pick among the keys near its target: "
                         "no more than one head's real row is within TV 0.25 of its positional kernel"),
        "C1": ("holds", "only L0H1 writes, vectors of scale 0.02 beside the constant-norm embeddings: the LN2 "
                        "scale varies by less than 1.25 times"),
        "C2": ("holds", "neurons 0-2 read only what L0H1 writes, a sum over keys of content values whose weights "
                        "have a nearly constant denominator (content scale 0.3): the contextual term explains "
                        "nearly all their variance"),
        "C3": ("holds", "the same three neurons: the approximation differs from the real pre-activation only "
                        "by L0H1's small denominator variation and LN2's, r near 1"),
    }),
    Case("undefined-kernel", "gpt2", undefined_kernel_spec, {
        "K1": ("fails", "L1H1's query weights are not a number: its kernel's ETC is not finite, so 3 of the 4 "
                        "heads have a positional kernel (0.75, below 1)"),
    }),
    Case("attn-planted", "attn_only", lambda: planted_attn_only_spec(N_CTX), {
        "L1": ("holds", "L0H0 puts score 60 on key q - 1: its previous-token mass is ~1"),
        "L2": ("holds", "L0H0's scores are position-only: with tokens zeroed it still attends ~1 to q - 1"),
        "L3": ("holds", "L0H0's row 1 is planted to attend to itself (score 60 on key 1, 0 on key 0)"),
        "L4": ("holds", "the induction head L1H0 scores 4 on BOS keys: without BOS its softmax is not "
                        "anchored and P([B]) collapses more than ten-fold"),
        "L5": ("holds", "L0H1's position scores 5, 4, 3 at offsets -2, -1, -3 put ~0.6 at offset -2"),
    }),
    Case("attn-prev-only", "attn_only", lambda: planted_attn_only_spec(N_CTX, look_back_two=False), {
        "L1": ("holds", "the same exact previous-token head L0H0 as attn-planted"),
        "L5": ("fails", "no head but L0H0 has planted scores: the best other head is near uniform at "
                        "offset -2 (below 0.2), so no look-back-two head exists"),
    }),
    Case("attn-blank", "attn_only", lambda: hb.AttnOnlySpec(n_ctx=N_CTX, d_vocab=24), {
        "L1": ("fails", "no planted scores: every head attends uniformly, ~1/(q+1) on the previous token, "
                        "below 0.4"),
        "L2": ("not measurable", "no head reaches the previous-token role's minimum score, so there is no "
                                 "previous-token head to decompose"),
        "L3": ("not measurable", "as L2: position 1's row is read on the previous-token head, which does not exist"),
        "L4": ("not measurable", "no head reaches the induction role's minimum score: no induction head, "
                                 "the L4 rows are written without a value"),
        "L5": ("fails", "uniform heads: the best other head's offset -2 mass is ~1/(q+1), below 0.2"),
    }),
)


def cases() -> dict[str, Case]:
    return {c.name: c for c in CASES}


def expected_verdicts() -> dict[str, dict[str, str]]:
    """``{model: {claim: verdict}}`` of :data:`CASES` (what config/selfcheck.yaml states)."""
    return {c.name: {claim: v for claim, (v, _) in c.expected.items()} for c in CASES}


def build(root: str | Path, names: list[str] | None = None) -> list[Path]:
    """Write every case (or those ``names``) under ``root/<name>/``; the paths written."""
    known = cases()
    unknown = sorted(set(names or []) - set(known))
    if unknown:
        raise SystemExit(f"error: no self-check case {unknown}; the cases are {sorted(known)}")
    return [known[n].write(Path(root) / n) for n in (names or list(known))]


# --------------------------------------------------------------------------- comparison
@dataclass(frozen=True)
class Check:
    claim: str
    model: str
    expected: str
    obtained: str | None  # None: the (claim, model) is not in the findings table
    value: float | None
    reason: str

    @property
    def agrees(self) -> bool:
        return self.obtained == self.expected


def compare(table: Any, expected: dict[str, dict[str, str]]) -> list[Check]:
    """One :class:`Check` per expected ``(claim, model)`` (``expected`` is ``{model: {claim:
    verdict}}``), against the findings table (``results/report/findings.csv``'s columns claim,
    model, verdict, value, reason); a pair absent from the table is obtained ``None``."""
    rows = {(r["claim"], r["model"]): r for r in table.to_dict("records")}
    out = []
    for model, claims in expected.items():
        for claim, verdict in claims.items():
            if verdict not in VERDICTS:
                raise ValueError(f"selfcheck.expected.{model}.{claim}: {verdict!r} is not one of {VERDICTS}")
            r = rows.get((claim, model))
            value = None if r is None or r["value"] is None or r["value"] != r["value"] else float(r["value"])
            out.append(Check(claim, model, verdict, None if r is None else r["verdict"], value,
                             "" if r is None else str(r.get("reason", ""))))
    return out


def format_checks(checks: list[Check]) -> str:
    """The expected-vs-obtained table as text, disagreements marked ``DISAGREES``."""
    lines = [f"{'claim':6} {'model':22} {'expected':15} {'obtained':15} {'value':>10}  result"]
    for c in checks:
        obtained = "(missing)" if c.obtained is None else c.obtained
        value = "" if c.value is None else f"{c.value:.4g}"
        result = "ok" if c.agrees else ("DISAGREES: not in the findings table" if c.obtained is None
                                        else f"DISAGREES: {c.reason}")
        lines.append(f"{c.claim:6} {c.model:22} {c.expected:15} {obtained:15} {value:>10}  {result}")
    bad = sum(not c.agrees for c in checks)
    lines.append(f"{len(checks) - bad} of {len(checks)} expected verdicts obtained"
                 + ("" if not bad else f"; {bad} disagree"))
    return "\n".join(lines)


def coverage(expected: dict[str, dict[str, str]]) -> dict[str, dict[str, list[str]]]:
    """Per claim: the models expected to give ``holds`` and those expected to give ``fails`` or
    ``not measurable`` (``{"holds": [...], "other": [...]}``)."""
    out: dict[str, dict[str, list[str]]] = {}
    for model, claims in expected.items():
        for claim, verdict in claims.items():
            out.setdefault(claim, {"holds": [], "other": []})["holds" if verdict == "holds" else "other"].append(model)
    return out


def coverage_table(claims: list[str], expected: dict[str, dict[str, str]]) -> str:
    """The Markdown table of docs/claims.md's self-check section: per claim, the cases expected
    to hold and those expected to fail or be not measurable (``python -m posmech.selfcheck
    table`` prints it for the config's expected verdicts)."""
    cov = coverage(expected)
    rows = ["| claim | holds on | fails / not measurable on |", "|---|---|---|"]
    for c in claims:
        m = cov.get(c, {"holds": [], "other": []})
        held = ", ".join(f"`{x}`" for x in m["holds"]) or "—"
        other = ", ".join(f"`{x}` ({'n/m' if expected[x][c] == 'not measurable' else 'fails'})"
                          for x in m["other"]) or "—"
        rows.append(f"| {c} | {held} | {other} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m posmech.selfcheck", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="write the self-check's hand-built models under DIR/<case>/")
    b.add_argument("dir")
    b.add_argument("names", nargs="*", help="only these cases (default: all)")
    t = sub.add_parser("table", help="print docs/claims.md's table of cases per finding from a config")
    t.add_argument("config", nargs="?", default="config/selfcheck.yaml")
    args = parser.parse_args(argv)
    if args.command == "table":
        import yaml

        from posmech.findings import load_findings

        claims = [f.claim for f in load_findings(Path(__file__).resolve().parents[2] / "resources" / "findings.yaml")]
        print(coverage_table(claims, yaml.safe_load(Path(args.config).read_text())["selfcheck"]["expected"]))
        return 0
    for p in build(args.dir, args.names or None):
        print(f"built {p}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
