"""The self-check: hand-built models whose verdicts are known in advance, run through the whole
DAG (``make selfcheck``, config/selfcheck.yaml), and the comparison of the findings table with
those expected verdicts (``python -m posmech selfcheck``).

A verdict is only worth what its power is: each case below is a model built by
:mod:`posmech.models.handbuilt` with exactly known behaviour, and states, next to its
construction, the verdict each finding it covers must get and why.  A finding is *covered* by
the self-check when at least one case expects ``holds`` and another expects ``fails`` or ``not
measurable`` (for a stated reason); :func:`coverage` counts it from the expected verdicts of
:data:`CASES`, the single place they are stated and a run is checked against (a config with
``selfcheck.cases: true``, config/selfcheck.yaml, shows them in its report).

Command line (what ``make selfcheck`` runs before Snakemake)::

    python -m posmech.verdicts.selfcheck build DIR     # writes DIR/<case>/ for every case

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

from posmech.core.io import REPO
from posmech.models import handbuilt as hb
from posmech.verdicts.findings import VERDICTS as FINDINGS_VERDICTS

NO_CONTEXTUAL = ("no layer-0 head is contextual (K7: L0H0 other, L0H1 detokenization), the only class "
                 "neurons.head_classes names: no broad head for the C rules")
N_CTX = 32  # the context of every self-check model
D_VOCAB = 96  # GPT-2-architecture cases: BOS + the 95 printable ASCII characters (every prompt tokenizes)
# the findings' verdicts, `holds on null` included (a case whose model has a twin may expect it)
VERDICTS = FINDINGS_VERDICTS


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


SAME_CODE = 40.0  # p5-relay's L1H0: penalty on a key whose token code equals the query's


def token_relay_spec(n: int = N_CTX, d_vocab: int = D_VOCAB, n_codes: int = 16) -> hb.Spec:
    """P5 and P15's mechanism, planted: L1H0 finds the previous token only through layer 0's copy
    of it, and never reads a position.

    Token t is embedded as the one-hot code ``e_c − e_spare`` (c = t mod ``n_codes``, block T
    beside the positions, of the same norm; the layer norm then maps a two-block residual to
    ``sqrt(d/4)·x``).  L0H1, an exact previous-token head on the positions (planted doubled,
    for that amplitude; query 1 attends to itself, not to BOS), copies the attended key's code
    into block R.  L1H0's query reads
    R, its key reads T: it scores 30 on every key whose code is the previous token's (the
    previous position and the earlier occurrences of that code) and 0 elsewhere.  A query whose
    copy is missing (layer 0's attention to its previous position knocked out) has a zero query
    vector, so L1H0 attends uniformly over its q + 1 keys there (P5).  The extended positional
    embeddings (one repeated token) hold the positions only, the copied code being the same at
    every position: averaging them before layer 1 changes L1H0 only through the layer norm's
    scale (the positions' block gets shorter), while before layer 0 it blurs L0H1's exact
    positions (P15).  L1H0 also scores ``−SAME_CODE`` on every key
    of the query's own code: where a token repeats the one before it, key q − 1 scores
    30 − 40 < 0 and the head leaves it (P14).  The layer-0 MLP erases the even positions
    (:func:`even_position_eraser`; L1H0 reads no position): the later layers' extended
    embeddings have half as many entries far from zero as W_pos (P9)."""
    dh = n + 2
    prev = hb.previous_token_scores(n)
    prev[1, :2] = [0.0, 30.0]  # query 1 copies its own code, not BOS's: R is one code from position 1 on
    spec = hb.positional_spec(n_ctx=n, n_layer=2, n_head=2, d_head=dh, d_vocab=d_vocab, scores={(0, 1): 2 * prev})
    d = spec.d_model  # 2(n + 2): positions 0..n-1, T n..n+n_codes-1, R after it, spares
    T, R = n + np.arange(n_codes), n + n_codes + 1 + np.arange(n_codes)
    spare_T, spare_R = n + n_codes, n + 2 * n_codes + 1
    W_E = np.zeros((d_vocab, d))
    W_E[np.arange(d_vocab), T[np.arange(d_vocab) % n_codes]] = 1.0
    W_E[:, spare_T] = -1.0
    spec.W_E = W_E
    spec.W_U = np.zeros((d, d_vocab))  # untied: uniform predictions
    amp0 = np.sqrt(d / 4.0)  # layer 0's input: two unit blocks (position + code)
    W_V = np.zeros((d, dh))
    W_V[T, np.arange(n_codes)] = 1.0
    W_O = np.zeros((dh, d))
    W_O[np.arange(n_codes), R] = 1.0 / amp0
    W_O[np.arange(n_codes), spare_R] = -1.0 / amp0
    spec.heads[(0, 1)].update(W_V=W_V, W_O=W_O)
    # layer 1's input is three unit blocks (position, code, copied code): LN multiplies it by sqrt(d / 6)
    a = np.sqrt(30.0 * np.sqrt(dh) / (d / 6.0))
    W_Q = np.zeros((d, dh))
    W_K = np.zeros((d, dh))
    W_Q[R, np.arange(n_codes)] = a
    W_K[T, np.arange(n_codes)] = a
    b = np.sqrt(SAME_CODE * np.sqrt(dh) / (d / 6.0))  # -SAME_CODE on keys of the query's own code
    W_Q[T, n_codes + np.arange(n_codes)] = b
    W_K[T, n_codes + np.arange(n_codes)] = -b
    spec.heads[(1, 0)] = {"W_Q": W_Q, "W_K": W_K}
    spec.mlps[0] = even_position_eraser(spec, n_blocks=3)
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
    every layer (every head has zero scores)."""
    theta = 2 * np.pi * np.arange(n) / n
    W_pos = np.zeros((n, 8))
    W_pos[:, 0], W_pos[:, 1], W_pos[:, 2] = 3 * np.cos(theta), 2 * np.sin(theta), np.arange(n) / n - 0.5
    return hb.Spec(n_layer=2, n_head=2, d_model=8, n_ctx=n, d_vocab=d_vocab, W_pos=W_pos)


INDUCTION_MATCH, LOOK_BACK = 20.0, 10.0  # mask-clock's L2H0: score on keys after the query's token / two-back match
CLOCK_STEP = 2 * np.pi / 64  # mask-clock: the angle between consecutive positions (32 fit in half a turn)
CLOCK_SHARPNESS = 3000.0  # mask-clock: the layer-1 heads' scores beta·cos(angle difference - offset·step)


def mask_clock_spec(n: int = N_CTX, d_vocab: int = D_VOCAB) -> hb.Spec:
    """A two-token induction circuit on the GPT-2 architecture with W_pos = 0: the positions are
    recovered from the causal mask, so averaging W_pos changes nothing (P3).  The residual stream
    is unit blocks (one-hot vectors, each with its own spare dimension, so the layer norm only
    rescales: a residual of m blocks is multiplied by ``sqrt(d/(2m))``).

    * L0H0 has zero scores: it attends uniformly over the q + 1 keys and reads the BOS
      indicator, writing ``f = 1/(q + 1)`` (block F; every sequence starts with BOS).
    * The layer-0 MLP maps ``f`` to a clock, the unit-norm block C = ``(cos qθ, sin qθ, −cos qθ,
      −sin qθ)`` (θ = 2π/64), and erases F: 32 neurons ``gelu(s·(u − t_j))`` on the post-LN value u
      of F, their output weights solved so that the outputs are exact at the 32 positions.
    * L1H0, the sharp previous-token head, scores ``CLOCK_SHARPNESS·cos((q − k)θ − θ)`` (largest
      at k = q − 1, 14 above the neighbours) and copies the key's token into block R; L1H1 the
      same at k = q − 2, into R2.
    * L2H0, the induction head, scores ``INDUCTION_MATCH`` = 20 on every key whose R is the query's
      token and ``LOOK_BACK`` = 10 on every key whose R2 is the query's R, and copies the key's token
      into O, which W_U reads (logit 20 per unit).

    On "(apple orange)" + newline + "(" it predicts "apple" (and on the "orange apple" prompt
    "orange") with probability ~1, identically with W_pos averaged (P3), and L1H0's attention is
    the same too (P4).  On "an OxRamAss; an Ox" with the sharp head redirected ("A" reads "x",
    "R" reads " ") and doubled (R's block twice as long: both score terms grow alike), at the
    final "x" the key "A" scores 20 (its R is "x") against "R"'s 10 (its R2 is "O", the query's
    R): "A" is predicted; after it "s" (the only key whose R is "A"), after "As" the second "s"
    (R "s", R2 "A": 30, against ";"'s 20): P("Ass") close to 1 (P16)."""
    V = d_vocab
    T = np.arange(V)
    F, C = V + 1 + np.arange(2), V + 3 + np.arange(4)  # F: f and its spare; C: the clock
    R, R2, O = V + 7 + np.arange(V), 2 * V + 8 + np.arange(V), 3 * V + 9 + np.arange(V)
    spare = {"T": V, "R": 2 * V + 7, "R2": 3 * V + 8, "O": 4 * V + 9}
    dh = 2 * V
    d = 3 * dh
    spec = hb.Spec(n_layer=3, n_head=3, d_model=d, n_ctx=n, d_vocab=V, d_head=dh, W_pos=np.zeros((n, d)))
    W_E = np.zeros((V, d))
    W_E[T, T] = 1.0
    W_E[:, spare["T"]] = -1.0
    spec.W_E = W_E
    amp = lambda blocks: np.sqrt(d / (2.0 * blocks))  # noqa: E731 — post-LN scale of unit blocks
    # layer 0: f = 1/(q + 1) from the uniform head reading BOS (token 0)
    W_V, W_O = np.zeros((d, dh)), np.zeros((dh, d))
    W_V[T[0], 0] = 1.0
    W_O[0, F[0]], W_O[0, F[1]] = 1.0 / amp(1), -1.0 / amp(1)
    spec.heads[(0, 0)] = {"W_V": W_V, "W_O": W_O}
    # the MLP: exact at the n positions
    q = np.arange(n)
    f = 1.0 / (q + 1)
    u = f * np.sqrt(d / (2.0 + 2.0 * f**2))  # LN(T block + F block)[F[0]]
    order = np.sort(u)
    knots = np.concatenate([[order[0] - 1.0], (order[1:] + order[:-1]) / 2])  # one below each point
    s = 4.0 / np.min(np.diff(order))
    act = np.array([[gelu_new(s * (uq - t)) for t in knots] for uq in u])  # [position, neuron]
    targets = np.stack([np.cos(q * CLOCK_STEP), np.sin(q * CLOCK_STEP), -np.cos(q * CLOCK_STEP),
                        -np.sin(q * CLOCK_STEP), -f, f], axis=1)
    out = np.linalg.solve(act, targets)  # [neuron, output]
    W_in, b_in, W_out = np.zeros((d, 4 * d)), np.zeros(4 * d), np.zeros((4 * d, d))
    W_in[F[0], :n] = s
    b_in[:n] = -s * knots
    W_out[:n, C] = out[:, :4]
    W_out[:n, F[0]], W_out[:n, F[1]] = out[:, 4], out[:, 5]
    spec.mlps[0] = {"W_in": W_in, "b_in": b_in, "W_out": W_out}
    # layer 1: previous and two-back heads on the clock (input: T + C, two blocks)
    x = np.sqrt(CLOCK_SHARPNESS * np.sqrt(dh)) / amp(2)
    for h, (offset, block) in enumerate(((1, R), (2, R2))):
        delta = offset * CLOCK_STEP
        W_Q, W_K = np.zeros((d, dh)), np.zeros((d, dh))
        W_Q[C[0], 0], W_Q[C[1], 1] = x, x
        W_K[C[0], 0], W_K[C[1], 0] = x * np.cos(delta), -x * np.sin(delta)  # cos(angle_k + delta)
        W_K[C[1], 1], W_K[C[0], 1] = x * np.cos(delta), x * np.sin(delta)  # sin(angle_k + delta)
        W_V, W_O = np.zeros((d, dh)), np.zeros((dh, d))
        W_V[T, T] = 1.0
        W_O[T, block] = 1.0 / amp(2)
        W_O[T, spare["R" if offset == 1 else "R2"]] = -1.0 / amp(2)
        spec.heads[(1, h)] = {"W_Q": W_Q, "W_K": W_K, "W_V": W_V, "W_O": W_O}
    # layer 2: the induction head (input: T, C, R, R2: four blocks)
    a = np.sqrt(INDUCTION_MATCH * np.sqrt(dh)) / amp(4)
    g = np.sqrt(LOOK_BACK * np.sqrt(dh)) / amp(4)
    W_Q, W_K, W_V, W_O = np.zeros((d, dh)), np.zeros((d, dh)), np.zeros((d, dh)), np.zeros((dh, d))
    W_Q[T, T], W_K[R, T] = a, a
    W_Q[R, V + T], W_K[R2, V + T] = g, g
    W_V[T, T] = 1.0
    W_O[T, O] = 1.0 / amp(4)
    W_O[T, spare["O"]] = -1.0 / amp(4)
    spec.heads[(2, 0)] = {"W_Q": W_Q, "W_K": W_K, "W_V": W_V, "W_O": W_O}
    W_U = np.zeros((d, V))
    W_U[O, T] = 20.0 / amp(5)
    spec.W_U = W_U
    return spec


def planted_random_spec(n: int = N_CTX, d_vocab: int = D_VOCAB, seed: int = 0) -> hb.Spec:
    """An exact previous-token head (L1H0) planted among random weights: the positional spec's
    L1H0 (score 30 on key q − 1), every other weight random
    (:func:`posmech.models.handbuilt.with_random_weights`)."""
    spec = hb.positional_spec(n_ctx=n, n_layer=2, n_head=2, d_vocab=d_vocab,
                              scores={(1, 0): hb.previous_token_scores(n)})
    return hb.with_random_weights(spec, seed=seed)


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


def gelu_new(x: float) -> float:
    """GPT-2's activation (the tanh approximation of GELU)."""
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def even_position_eraser(spec: hb.Spec, n_blocks: int = 1) -> dict[str, np.ndarray]:
    """A layer-0 MLP that erases the even positions from the residual stream: neuron j reads
    position j of its post-LN input, ``sqrt(d/(2·n_blocks))·(e_i − e_spare)`` when the residual
    there is ``n_blocks`` unit blocks (pre-activation exactly ``[i = j]``), and, for even j,
    writes ``−e_j``: the positions' part of the residual after layer 0 is ``−e_spare`` at even
    positions and ``e_i − e_spare`` at odd ones.  Centred over positions, only the odd
    positions' entries stay far from zero: half as many as in W_pos."""
    n, d = spec.n_ctx, spec.d_model
    amp = np.sqrt(d / (2.0 * n_blocks))
    W_in = np.zeros((d, 4 * d))
    W_out = np.zeros((4 * d, d))
    W_in[np.arange(n), np.arange(n)] = 1.0 / amp
    even = np.arange(0, n, 2)
    W_out[even, even] = -1.0 / gelu_new(1.0)
    return {"W_in": W_in, "W_out": W_out}


def anatomy_spec(n: int = N_CTX, d_vocab: int = D_VOCAB, alpha: float = 1.0, gamma: float = 3.0) -> hb.Spec:
    """Score anatomy (P12, P13) on one model, the residual stream W_pos at every layer:

    * L0H1, the early previous-token head, scores ``alpha·(i − n) − gamma·[i = n]`` (later keys
      higher, the query's own key suppressed: its largest attention is on q − 1, ~0.58): a dark
      main diagonal;
    * L1H0, the sharp one, scores 30 on key q − 1 and 60 on the *future* key q + 1: the causal
      mask hides it, so L1H0 is still an exact previous-token head, yet its raw scores peak at
      q + 1 on every row but the last;
    * L0H0 and L1H1 have zero scores; token embeddings, every W_V/W_O, the MLPs and W_U are zero."""
    i = np.arange(n)
    dark = alpha * (i[None, :] - i[:, None]) - gamma * np.eye(n)
    sharp = hb.previous_token_scores(n)
    sharp[np.arange(n - 1), np.arange(1, n)] = 60.0
    return hb.positional_spec(n_ctx=n, n_layer=2, n_head=2, d_vocab=d_vocab, scores={(0, 1): dark, (1, 0): sharp})


TOKEN_TO_FIRST = 200.0  # token-norms' L0H0: score per unit of token norm on key position 0
COPY_GAIN = 3.0  # token-norms' L0H0: norm of the position copy it writes, per unit of W_pos's


def token_norms_spec(n: int = N_CTX, d_vocab: int = D_VOCAB) -> hb.Spec:
    """Token embeddings of varying norm, a head that reads positions only for tokens of norm 0,
    and an unembedding that reads the exact position.

    Token t is embedded as ``a_t·(e_{n+8} − e_{n+9})``, ``a_t = 0`` for even t and
    ``(t mod 8)/2`` (0.5 to 3.5) for odd t, orthogonal to the one-hot positions (norm sqrt 2):
    the residual's norm, and so the layer-0 LayerNorm scale, varies with the token by up to
    sqrt(1 + 3.5²) ≈ 3.6 times.  L0H0 scores 30 on key q − 1 and ``TOKEN_TO_FIRST·a`` (a the
    query token's a_t) on key 0, and copies the attended key's position, ``COPY_GAIN`` times
    one-hot, into dims n+10..2n+9: on a text of one even token (a = 0) it copies the previous
    position, so the layer-1 residual is W_pos beside a shifted copy 3 times as large; on one
    odd token key 0 wins (40 to 80 against at most 24, after the LN scales) and the copy is the
    same at every position.  W_U reads the position: position i predicts token 1 + (i mod 95)
    with a logit of 10 per unit of the final LN's output on e_i."""
    spec = hb.positional_spec(n_ctx=n, n_layer=2, n_head=3, d_vocab=d_vocab,
                              scores={(0, 0): hb.previous_token_scores(n)})
    d, dh = spec.d_model, spec.dh  # 3(n + 1), n + 1
    a = np.where(np.arange(d_vocab) % 2 == 0, 0.0, (np.arange(d_vocab) % 8) / 2.0)
    W_E = np.zeros((d_vocab, d))
    W_E[:, n + 8], W_E[:, n + 9] = a, -a
    spec.W_E = W_E
    amp = np.sqrt(d / 2.0)  # the post-LN amplitude of a position of a token of norm 0
    head = spec.heads[(0, 0)]
    u = np.sqrt(TOKEN_TO_FIRST * np.sqrt(dh)) / amp  # column n: query's token dim x key's position 0
    head["W_Q"][n + 8, n], head["W_K"][0, n] = u, u
    copy = n + 10 + np.arange(n)
    head["W_V"] = np.zeros((d, dh))
    head["W_V"][np.arange(n), np.arange(n)] = 1.0
    head["W_O"] = np.zeros((dh, d))
    head["W_O"][np.arange(n), copy] = COPY_GAIN / amp
    head["W_O"][np.arange(n), 2 * n + 10] = -COPY_GAIN / amp  # the copy block's spare
    W_U = np.zeros((d, d_vocab))
    W_U[np.arange(n), 1 + np.arange(n) % (d_vocab - 1)] = 10.0
    spec.W_U = W_U
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


def rotary_high_model() -> Any:
    """A rotary (Llama) model, d_head 16 (8 pairs), whose previous-token head L0H0 is built from
    the two highest-frequency pairs (θ = 1 and 0.32 rad per position, amplitude 8: mean
    previous-token attention ~0.88 over a 32-token context) and whose three other heads are
    content heads in the lowest pair (7)."""
    heads = {(0, 0): hb.RotaryHead((0, 1), "positional", amplitude=8.0), (0, 1): hb.RotaryHead((7,), "content", 2.0),
             (1, 0): hb.RotaryHead((7,), "content", 2.0), (1, 1): hb.RotaryHead((7,), "content", 2.0)}
    return hb.rotary_model(heads, n_layer=2, n_head=2, d_head=16, d_model=32, n_ctx=N_CTX, d_vocab=D_VOCAB)


def rotary_mid_model() -> Any:
    """A rotary (Llama) model, d_head 16, whose previous-token head L0H0 is built from two
    middle-frequency pairs (2, 3: θ = 0.1 and 0.032 rad per position) with a large amplitude
    (60: the scores fall by ~10 one key away, previous-token attention ~0.99), beside a content
    head in the highest pair (0)."""
    heads = {(0, 0): hb.RotaryHead((2, 3), "positional", amplitude=60.0), (0, 1): hb.RotaryHead((0,), "content", 2.0)}
    return hb.rotary_model(heads, n_layer=1, n_head=2, d_head=16, d_model=32, n_ctx=N_CTX, d_vocab=D_VOCAB)
ROPE_GAP = 15.0  # rope-planted: the planted head's score at its key above every other key (rotation alone)
ALIBI_ANTI_SELF = 30.0  # alibi-planted: L0H0's penalty on keys of the query's token code
ALIBI_WRITE = 0.05  # alibi-planted: L0H4's write of each key's code, small beside the embeddings' norm


def rope_planted_spec(n: int = N_CTX, d_vocab: int = D_VOCAB) -> hb.RotarySpec:
    """A Llama model whose layer-0 heads attend by rotation alone (their queries and keys read
    only the dimension every token shares): L0H0 scores key q − 1 at least ``ROPE_GAP`` above
    every other key, L0H1 key q − 2; layer 1 and every output are zero."""
    return hb.RotarySpec(n_ctx=n, d_vocab=d_vocab, offsets={0: (1, ROPE_GAP), 1: (2, ROPE_GAP)})


def alibi_planted_spec(n: int = N_CTX, d_vocab: int = D_VOCAB) -> hb.AlibiSpec:
    """A 16-head BLOOM model: L0H0 (ALiBi slope 2^-1/2 = 0.707) scores −``ALIBI_ANTI_SELF`` on
    every key of the query's token code (16 codes), so on random tokens it leaves the query's own
    key for the nearest other one; every other head has zero query and key weights: its pattern
    is ALiBi's ``softmax(m_h (i − n))`` alone. L0H4 (slope 2^-2.5, broad: contextual) writes a
    random vector of each key's token code (scale ``ALIBI_WRITE``) into spare dimensions, which
    layer 0's MLP neurons 0, 1, 2 alone read (C1–C3); every other output is zero."""
    return hb.AlibiSpec(n_ctx=n, d_vocab=d_vocab, anti_self={0: ALIBI_ANTI_SELF}, context_write={4: ALIBI_WRITE},
                        context_neurons=3)


def sink_spec(layer: int, head: int, n: int = N_CTX, d_vocab: int = D_VOCAB) -> hb.Spec:
    """Three layers of two heads, the residual stream W_pos at every layer; head ``(layer, head)``
    scores 30 on key 0 from every query (:func:`posmech.models.handbuilt.sink_scores`: alpha[0]
    = 1 to within 32·e^-30), the five other heads zero scores (uniform: alpha[0] = H_32 / 32 =
    0.127, below epsilon 0.3). Sink ratio 1/6 on every sample."""
    return hb.positional_spec(n_ctx=n, n_layer=3, n_head=2, d_vocab=d_vocab, scores={(layer, head): hb.sink_scores(n)})


ALIBI_SINK = 60.0  # alibi-sinks: the sink heads' score on the BOS key (above 0.707 x 31 = 21.9, the steepest bias)
ALIBI_SINK_HEADS = 8  # alibi-sinks: heads 0-7 of each layer, the eight steepest ALiBi slopes (2^-0.5 .. 2^-4)


def alibi_sinks_spec(n: int = N_CTX, d_vocab: int = D_VOCAB) -> hb.AlibiSpec:
    """A 2-layer, 16-head BLOOM model whose heads 0-7 of both layers (the eight steepest ALiBi
    slopes, 2^-0.5 .. 2^-4) score ``ALIBI_SINK`` on the BOS key from every query: alpha[0] = 1
    to within e^-38 on a BOS-first sample; heads 8-15 have zero query and key weights, ALiBi's
    ``softmax(m_h (i − n))`` alone (slopes 2^-4.5 .. 2^-8: alpha[0] from 0.110 to 0.125 at 32
    tokens, below epsilon 0.3, and decreasing with the slope). Every value and output is zero."""
    return hb.AlibiSpec(n_ctx=n, d_vocab=d_vocab, sink={h: ALIBI_SINK for h in range(ALIBI_SINK_HEADS)})


MASSIVE = 5000.0  # massive-activation: W_pos[0, 3]


def massive_activation_spec(n: int = N_CTX, d_vocab: int = D_VOCAB) -> hb.Spec:
    """Two layers of two zero heads (uniform, writing nothing) and zero MLPs: the residual
    stream is W_pos at every layer, standard normal entries (seed 0) in a d_model of 8 but for
    ``MASSIVE`` at position 0, dimension 3: max |h| / median |h| of a 32-token sample is 5000 /
    ~0.67, ~7000, on token 0, dimension 3."""
    W_pos = np.random.default_rng(0).normal(size=(n, 8))
    W_pos[0, 3] = MASSIVE
    return hb.Spec(n_layer=2, n_head=2, d_model=8, n_ctx=n, d_vocab=d_vocab, W_pos=W_pos)


# --------------------------------------------------------------------------- cases
@dataclass(frozen=True)
class Case:
    """One self-check model: its construction, the architecture it is written as (``gpt2``: a
    Hugging Face GPT-2 directory; ``attn_only``: a legacy TransformerLens attention-only
    directory; ``random``: a random-init Hugging Face model of the
    :class:`~posmech.models.handbuilt.RandomSpec`'s architecture; ``hf``: a built Hugging Face
    model, e.g. a rotary :func:`~posmech.models.handbuilt.rotary_model`; ``llama``: a rotary
    Llama directory of a :class:`~posmech.models.handbuilt.RotarySpec`; ``bloom``: an ALiBi
    BLOOM directory), and per claim the expected verdict with the reason it must be so."""

    name: str
    kind: str
    build: Callable[[], Any]
    expected: dict[str, tuple[str, str]] = field(default_factory=dict)  # claim -> (verdict, why)

    def write(self, path: str | Path) -> Path:
        spec = self.build()
        if self.kind == "gpt2":
            return hb.save_model_dir(spec, path)
        if self.kind == "random":
            return hb.save_random_dir(spec, path)
        if self.kind == "hf":
            return hb.save_hf_model_dir(spec, path)
        if self.kind == "llama":
            return hb.save_rotary_dir(spec, path)
        if self.kind == "bloom":
            return hb.save_alibi_dir(spec, path)
        return hb.save_attn_only_dir(spec, path)


NO_PREV = "no previous-token head over the uniform baseline (P6)"
#: random-gpt2's expected verdicts beyond the taxonomy and the kernels (every family runs on it;
#: values measured 2026-11-28 on the self-check's 40 Bible documents)
RANDOM_GPT2: dict[str, tuple[str, str]] = {
    "P1": ("fails", "random W_pos (standard deviation 0.01 in 32 dimensions) spreads its variance: the top three "
                    "components hold ~0.3, below 0.5"),
    "P3": ("fails", "random predictions: P(repeated word) ~1e-12"),
    "P5": ("fails", "the head the interventions read (the fallback's: no previous-token head) attends almost "
                    "uniformly with or without layer 0: ratio ~1"),
    "P9": ("fails", "the random layers add no structure: the later layers' extended embeddings are as dense as "
                    "W_pos (ratio ~0.94, below 1.5)"),
    "P10": ("fails", "as P1 at a later layer: ~0.34 in three components"),
    "P11": ("fails", "random W_pos has no helix subspace: the top-3 subspaces are ~43 degrees apart, above 20"),
    "P12": ("fails", "the fallback head's raw scores are noise: their argmax is at q - 1 on ~1/31 of the rows"),
    "P13": ("not measurable", NO_PREV + ": no early previous-token head"),
    "P15": ("not measurable", NO_PREV + ": no early previous-token head"),
    "P16": ("fails", "random predictions: the redirected word's probability is ~3e-6"),
    "L1": ("fails", "every head attends almost uniformly: ~0.135 on the previous random token, below 0.4"),
    "L2": ("not measurable", "no head reaches the previous-token role's minimum score 0.2"),
    "L3": ("not measurable", "as L2: no previous-token head"),
    "L4": ("not measurable", "no head reaches the induction role's minimum score (best ~0.06)"),
    "L5": ("fails", "uniform heads: the best offset -2 mass is ~0.135, below 0.2"),
    "K2": ("not measurable", "no local kernel to test for translation equivariance"),
    "K6": ("fails", "random token embeddings beside a smaller random W_pos: the layer-0 LN scale varies ~1.46 "
                    "times over the tokens, above 1.25"),
    "K7": ("fails", "every layer-0 head is near uniform (ETC / n_keys ~1): none is contextual"),
    "K8": ("fails", "near-uniform heads: the softmax denominator barely depends on the text (spread ~0.001)"),
    "C1": ("not measurable", "no contextual layer-0 head (K7) for the C rules"),
    "C2": ("not measurable", "no contextual layer-0 head (K7) for the C rules"),
    "C3": ("not measurable", "no contextual layer-0 head (K7) for the C rules"),
}

CASES: tuple[Case, ...] = (
    Case("p5-relay", "gpt2", token_relay_spec, {
        "P5": ("holds", "L1H0 finds the previous token only through layer 0's copy of it: at the knocked-out "
                        "queries it attends uniformly, mass 1/(q+1), far below the threshold ratio"),
        "P15": ("holds", "L1H0 never reads a position, so averaging the extended embeddings before layer 1 "
                         "changes only the layer norm's scale (damage ~0.06), while the early head L0H1 reads "
                         "exact positions and loses most of its previous-token mass (~0.7) when they are averaged "
                         "before layer 0"),
        "P14": ("holds", "L1H0 scores -40 on keys of the query's own token code: where a token repeats the one "
                         "before it, key q - 1 scores 30 - 40 and the previous-token mass falls to ~0"),
        "P9": ("holds", "the layer-0 MLP erases the even positions: centred, the later layers keep the odd "
                        "positions' entries only, half as many far from zero as W_pos (ratio ~2, above 1.5)"),
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
    # W_pos a helix in three dimensions; every head has zero scores (uniform attention, exactly tied on
    # every offset) and writes nothing.
    Case("helix", "gpt2", helix_spec, {
        "P1": ("holds", "W_pos lies in three dimensions: its top three components hold all its variance (1.0)"),
        "P10": ("holds", "nothing is written: a later layer's extended embeddings are W_pos, in three dimensions"),
        "P11": ("holds", "the extended embeddings' top-3 subspace is W_pos's own (distinct singular values): "
                         "angles 0"),
        "P6": ("fails", "every head attends uniformly: its offset -1 mean is the uniform baseline itself (excess 0, "
                        "below the 0.1 margin), and its mean diagonals at offsets 0 and -1 tie exactly, and a "
                        "tie goes to offset 0, so no head is a previous-token head (fraction 0)"),
        "P7": ("not measurable", "no previous-token head: there is no sharpest one to take the ratio of"),
        "K2": ("not measurable", "no head's kernel is local: no local kernel to test for translation equivariance"),
        "K4": ("fails", "every layer-0 kernel is uniform: no local head"),
        "S1": ("fails", "every head attends uniformly: alpha[0] = H_32 / 32 = 0.127 on every (sample, layer, head), "
                        "below epsilon 0.3: sink ratio 0"),
        "S2": ("not measurable", "two layers: layers 0-1 are the whole model, no later layer to hold the sinks"),
        "S4": ("not measurable", "the residual stream is W_pos, zero in five of its eight dimensions: the median "
                                 "magnitude of every hidden state is 0"),
    }),
    Case("mask-clock", "gpt2", mask_clock_spec, {
        "P3": ("holds", "W_pos is zero: the positions come from the causal mask (a uniform head reading BOS, "
                        "an MLP clock), so averaging W_pos changes nothing, and the two-token induction head "
                        "copies each repeated word with probability ~1 (0.99999 computed on these weights)"),
        "P4": ("holds", "the sharp head L1H0 reads the clock, not W_pos (zero): its attention with W_pos "
                        "averaged in groups of 10 is the intact one (cosine 1)"),
        "P16": ("holds", "the two-token induction head follows the redirected previous-token copies of L1H0: "
                         "P(Ass) ~1 after the intervention (0.9987 computed on these weights), above 0.5"),
    }),
    Case("kernel-types", "gpt2", kernel_types_spec, {
        "K3": ("holds", "L0H0 local (ETC ~1), L0H1 slowly decaying (closed-form ETC 6.72 of 30 keys), "
                        "L0H2 uniform: all three types"),
    }),
    Case("anatomy", "gpt2", anatomy_spec, {
        "P12": ("fails", "the sharp head L1H0's raw scores peak at the future key q + 1 (60 > 30) on every row "
                         "but the last: fraction 1/31, below 0.5"),
        "P13": ("holds", "the one early previous-token head L0H1 has its self score 3 below the smooth profile "
                         "of its neighbours: a dark diagonal (fraction 1)"),
    }),
    Case("token-norms", "gpt2", token_norms_spec, {
        "K6": ("fails", "the token embeddings' norms range from 0 to 3.5 times sqrt 2 beside the positions' "
                        "sqrt 2: the layer-0 LN scale varies over the text's tokens well beyond 1.25 times"),
        "P8": ("fails", "on an even token L0H0 copies the previous position (3 times W_pos's norm) beside "
                        "W_pos, on an odd one the same position 0 everywhere (centred away): the two tokens' "
                        "extended embeddings have cosine 1/sqrt(10) ~0.32, so the mean over pairs is below 0.9"),
        "P2": ("fails", "W_U reads the exact position: averaging W_pos in groups of 5 moves the loss by many "
                        "nats (two-sided: a drop is a change too)"),
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
    # Random-init models of four architectures, initialised as their families do (a random-init
    # twin's weights): every head is within 0.001 of uniform attention (measured: the largest
    # offset -1 excess over the uniform baseline is 0.0003), so no learned finding the cases run
    # may hold. Checked on all four: the diagonal taxonomy and the kernel types; on random-gpt2 every
    # family (RANDOM_GPT2). Not listed: the findings that hold on random weights by construction (P2,
    # P4, P8, K1, K5, K9, K10: docs/claims.md, "Learned or structural"), and P14, which reads the
    # fallback's head and sits at its threshold there (blip 0.0495 against 0.05).
    *(Case(f"random-{name}", "random", (lambda a=arch: hb.RandomSpec(a, seed=0)), {
        "P6": ("fails", "random weights: no head's mean attention at offset -1 is 0.1 above a head with zero "
                        "scores (uniform causal; ALiBi: its bias alone); the largest excess is below 0.001, so the "
                        "fraction of previous-token heads is 0 (the post's loose definition counts the heads that "
                        "peak at offset -1 by noise)"),
        "P7": ("not measurable", "no previous-token head (P6): nothing to rank"),
        "K3": ("fails", "every kernel is uniform" + (", or for the steepest ALiBi slopes (1/4) the bias's own slow "
                        "decay: no local kernel" if arch == "bloom" else ": one kernel type of three")),
        "K4": ("fails", "no layer-0 head has a local kernel (ETC / n_keys near 1"
                        + (", or 0.27 for ALiBi's slope 1/4, above the 0.1 of a local kernel)" if arch == "bloom"
                           else ")")),
        **(RANDOM_GPT2 if arch == "gpt2" else {}),
    }) for name, arch in (("gpt2", "gpt2"), ("llama", "llama"), ("neox", "gpt_neox"), ("bloom", "bloom"))),
    # Two more families for the null (issue 43: six architectures, each read against its own
    # random-init twin, config/selfcheck.yaml `twins`): the taxonomy only.
    *(Case(f"random-{name}", "random", (lambda a=arch: hb.RandomSpec(a, seed=0)), {
        "P6": ("fails", "random weights: no head's mean attention at offset -1 is 0.1 above a head with zero "
                        "scores (the largest excess is below 0.001)"),
        "P7": ("not measurable", "no previous-token head (P6): nothing to rank"),
    }) for name, arch in (("opt", "opt"), ("gptneo", "gpt_neo"))),
    # An exact previous-token head (L1H0, score 30 on key q - 1 of the one-hot positions) planted
    # among random weights: every other head's query / key weights, every value / output weight,
    # the MLPs, the token embeddings and the unembedding are random (normal, standard deviation
    # 0.02, GPT-2's initialisation).
    Case("planted-random", "gpt2", planted_random_spec, {
        "P6": ("holds", "the planted L1H0 puts ~1 of each query's attention on the previous key, 0.90 above the "
                        "uniform baseline; the three random heads stay within 0.001 of it: 1 of 4 heads, 0.25"),
        "P7": ("holds", "the planted head's second-largest mean diagonal is ~e^-30 of its largest: ratio ~0"),
    }),
    # Rotary models (P17, P18): heads whose q·k lives in known frequency pairs (handbuilt.rotary_model).
    Case("rotary-high", "hf", rotary_high_model, {
        "P17": ("holds", "the previous-token head L0H0's scores live in pairs 0 and 1, the highest-frequency "
                         "quarter of the 8 pairs: share 1"),
        "P18": ("holds", "usage shares: L0H0 half in pair 0, half in pair 1; the three content heads all in pair 7: "
                         "lowest quarter 0.375 over highest 0.125, ratio 3"),
    }),
    Case("rotary-mid", "hf", rotary_mid_model, {
        "P17": ("fails", "the previous-token head L0H0's scores live in pairs 2 and 3, outside the highest quarter "
                         "(pairs 0, 1): share 0"),
        "P18": ("fails", "no head uses the lowest quarter (pairs 6, 7): ratio 0"),
    }),
    Case("sink-late", "gpt2", lambda: sink_spec(2, 0), {
        "S1": ("holds", "L2H0 puts ~1 on key 0 from every query (alpha[0] ~1), the five uniform heads 0.127: "
                        "sink ratio 1/6, above 0.1"),
        "S2": ("holds", "the sink is in layer 2: layers 0-1 hold none (ratio 0)"),
        "S3": ("not measurable", "learned positions: no ALiBi slopes"),
        "S5": ("not measurable", "no checkpoints: the self-check sweeps no model, so there is no order of "
                                 "formation to read (S5 is judged on swept models only)"),
    }),
    Case("sink-early", "gpt2", lambda: sink_spec(0, 1), {
        "S1": ("holds", "L0H1 is the sink: sink ratio 1/6, above 0.1"),
        "S2": ("fails", "the sink is in layer 0: one of the four heads of layers 0-1 on every sample (0.25, "
                        "above 0.05)"),
    }),
    Case("alibi-sinks", "bloom", alibi_sinks_spec, {
        "S1": ("holds", "heads 0-7 of both layers put ~1 on the BOS key (alpha[0] ~1), heads 8-15 ALiBi alone "
                        "(alpha[0] 0.110-0.125): sink ratio 16 / 32 = 0.5, above 0.1"),
        "S2": ("not measurable", "two layers: layers 0-1 are the whole model, no later layer to hold the sinks"),
        "S3": ("holds", "the sinks are the eight steepest slopes of each layer (alpha[0] ~1); the other heads' "
                        "alpha[0] falls with the slope (0.125 at 2^-8 to 0.110 at 2^-4.5): Spearman of alpha[0] "
                        "with the slope ~0.67 over the 32 heads, above 0"),
    }),
    Case("massive-activation", "gpt2", massive_activation_spec, {
        "S4": ("holds", "W_pos[0, 3] = 5000 beside standard normal entries: max |h| / median |h| ~7000 in every "
                        "layer, above 1000"),
        "S1": ("fails", "zero scores: every head uniform, sink ratio 0"),
    }),
    Case("attn-planted", "attn_only", lambda: planted_attn_only_spec(N_CTX), {
        "L1": ("holds", "L0H0 puts score 60 on key q - 1: its previous-token mass is ~1"),
        "L2": ("holds", "L0H0's scores are position-only: with tokens zeroed it still attends ~1 to q - 1"),
        "L3": ("holds", "L0H0's row 1 is planted to attend to itself (score 60 on key 1, 0 on key 0)"),
        "L4": ("holds", "the induction head L1H0 scores 4 on BOS keys: without BOS its softmax is not "
                        "anchored and P([B]) collapses more than ten-fold"),
        "L5": ("holds", "L0H1's position scores 5, 4, 3 at offsets -2, -1, -3 put ~0.6 at offset -2"),
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
    # rotary and ALiBi (issue 44): the position-only and token-only inputs per scheme (docs/claims.md)
    Case("rope-planted", "llama", rope_planted_spec, {
        "L1": ("holds", "L0H0's rotation puts key q - 1 15 above every other key: its previous-token mass is ~1"),
        "L2": ("holds", "L0H0 reads only the dimension every token shares: with one token repeated (position-only) "
                        "the rotation alone still puts ~1 on q - 1"),
        "L3": ("fails", "rotary has no position-0 exception: with one token repeated, query 1 sees key 0 at offset "
                        "-1 like any other query its previous key, and L0H0 puts ~1 there"),
        "L4": ("not measurable", "layer 1 is zero (uniform): no head reaches the induction role's minimum score"),
        "L5": ("holds", "L0H1's rotation puts key q - 2 15 above every other key: offset -2 mass ~1"),
        "K6": ("holds", "every token embedding has the same norm: layer 0's RMSNorm scale is one number (ratio 1)"),
        "K7": ("fails", "both layer-0 heads are local (offsets -1 and -2: detokenization), no contextual head"),
        "K8": ("not measurable", "no layer-0 head is contextual or other: both are local (detokenization)"),
        "K10": ("holds", "layer 1 is zero: each layer-1 row is uniform, as its positional kernel (zero weights)"),
    }),
    Case("alibi-planted", "bloom", alibi_planted_spec, {
        "L1": ("holds", "L0H0 leaves keys of the query's code (-30) for the nearest other key, weighted by its slope "
                        "0.707: previous-token mass ~0.51 >= 0.4"),
        "L2": ("fails", "with one token repeated (position-only) every key has the query's code, so L0H0's pattern is "
                        "ALiBi's softmax(0.707 (i - n)) alone: ~0.25 on q - 1; an ALiBi previous-token head needs "
                        "the tokens"),
        "L3": ("fails", "the same position-only pattern at query 1: e^-0.707 / (1 + e^-0.707) = 0.33 on key 0"),
        "L4": ("not measurable", "layer 1 is zero: no head reaches the induction role's minimum score"),
        "L5": ("fails", "every other head is ALiBi alone: its offset -2 mass is at most ~0.16 (slope ln 1.5), below "
                        "0.2"),
        "K6": ("holds", "the embedding LayerNorm gives every token the same norm: layer 0's LayerNorm scale is one "
                        "number (ratio 1)"),
        "K7": ("holds", "the zero heads' positional patterns are ALiBi's: those of mid slopes (e.g. 2^-2.5) are broad "
                        "but not uniform, and carry no content: contextual"),
        "K8": ("fails", "the broad heads have zero query and key weights: no content score, every denominator is 1 "
                        "whatever the text (spread 0)"),
        "K10": ("holds", "layer 1 is zero: each layer-1 row is uniform, as its positional kernel (zero weights)"),
        "C1": ("holds", "L0H4's write (scale 0.05) is small beside the embedding LayerNorm's output (norm 16): the "
                        "LN2 scale is 1.00 at every position, ratio 1"),
        "C2": ("holds", "neurons 0-2 read only what the contextual head L0H4 writes; it has no query or key weights, "
                        "so its attention is ALiBi's positional pattern exactly and its content score 0: the "
                        "contextual term is their whole pre-activation (explained ~1)"),
        "C3": ("holds", "the same three neurons: the bag of tokens of L0H4 is their exact pre-activation, r ~1"),
    }),
)


def cases() -> dict[str, Case]:
    return {c.name: c for c in CASES}


def expected_verdicts() -> dict[str, dict[str, str]]:
    """``{model: {claim: verdict}}`` of :data:`CASES`: what a self-check run must give."""
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
                raise ValueError(f"expected verdict of {model} for {claim}: {verdict!r} is not one of {VERDICTS}")
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
    to hold and those expected to fail or be not measurable (``python -m posmech.verdicts.selfcheck
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
    parser = argparse.ArgumentParser(prog="python -m posmech.verdicts.selfcheck", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="write the self-check's hand-built models under DIR/<case>/")
    b.add_argument("dir")
    b.add_argument("names", nargs="*", help="only these cases (default: all)")
    sub.add_parser("table", help="print docs/claims.md's table of cases per finding")
    args = parser.parse_args(argv)
    if args.command == "table":
        from posmech.verdicts.findings import load_findings

        claims = [f.claim for f in load_findings(REPO / "resources" / "findings.yaml")]
        print(coverage_table(claims, expected_verdicts()))
        return 0
    for p in build(args.dir, args.names or None):
        print(f"built {p}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
