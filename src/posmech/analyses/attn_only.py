"""The attention-only family (L1-L5, seed 001): input decomposition, the position-0 exception,
BOS and induction, the look-back-two head.

Everything runs on random-token sequences, on a model of any position scheme
(:func:`position_scheme_of`; docs/claims.md, "Position-only and token-only inputs"):

* **Forward variants** (:data:`VARIANTS`, :func:`run_variant`): ``both`` (the normal forward),
  ``position_only`` (the input no longer depends on the tokens) and ``token_only`` (the
  input no longer depends on the positions), defined per scheme (:func:`variant_input`):

  - ``learned`` (a learned ``W_pos`` added to the residual stream): position-only zeroes the
    token embeddings ``hook_embed`` at every position, BOS included; token-only zeroes the
    positional embeddings ``hook_pos_embed``;
  - ``rotary``: position-only puts one token (each sequence's last) at every position, so
    the residual stream is the same vector at every position in every layer and only the
    rotation of ``q`` and ``k`` varies; token-only runs every token at position 0 (the
    posmech engine's ``positions``), so every rotation is the identity and ``q·k`` carries
    no position;
  - ``alibi``: position-only as rotary (the scores are ``q(t)·k(t)`` plus the bias); token-only
    runs every token at position 0, which switches the bias ``m_h·(key − query)`` off;
  - ``none`` (no positional encoding): no position part, so no position-only input (its
    quantities are not measurable, with the reason); token-only is the model itself.

  The variant holds for the whole forward pass.
* **Scores** are the pre-softmax attention scores ``q·k / attn_scale`` computed from
  ``hook_q`` / ``hook_k`` (TransformerLens 4.3 records ``hook_attn_scores`` after the causal
  mask), for keys ``<=`` query; entries above the diagonal are NaN.  On rotary and ALiBi
  models they are the raw scores of
  :class:`~posmech.models.scores.ScoreFunction` (``q`` and ``k`` rotated, ALiBi's
  ``m·(key − query)`` added, grouped key heads repeated).  **Patterns** are the
  model's softmaxes (``hook_pattern``).  Averages over sequences are means of per-sample
  softmaxes (never softmaxes of mean scores).
* **Sequences** (:func:`random_tokens`): BOS (when configured) followed by tokens drawn
  uniformly, with replacement, from the non-special ids of the tokenizer that the model
  embeds; seeded.
* **Head roles** (:func:`find_roles`): the *previous-token* head has the largest mean
  attention at offset −1 on random-token sequences, the *look-back-two* head (another head)
  the largest at offset −2, both averaged over queries ``first_query..T−1`` (query ``q`` to
  key ``q − offset``); the *induction* head has the largest induction score: mean attention
  from each query of the second copy of ``[BOS] R R`` (``R`` random tokens) to the key just
  after the query token's first occurrence.  Any role can be pinned in config.

Conventions: heads are ``L{layer}H{head}``; arrays of a forward are ``[batch, layer, head,
query, key]``; position 0 is BOS when the sequences have one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from posmech.analyses.attention import head_name, parse_head
from posmech.models.scores import attn_scale as sa_attn_scale
from posmech.models.scores import key_head, score_function
from posmech.core.errors import PosmechError
from posmech.core.names import RANDOM_OFFSET2_MASS, RANDOM_PREV_MASS
from posmech.core.progress import Progress
from posmech.settings.attn_only import AttnOnlySettings

LOG = logging.getLogger(__name__)

VARIANTS = ("both", "position_only", "token_only")
VARIANT_LABELS = {"both": "both", "position_only": "position only", "token_only": "token only"}
ROLES = ("previous", "look_back_two", "induction")
Hook = tuple[str, Callable[..., Any]]


# --------------------------------------------------------------------------- heads
def check_pins(pins: dict[str, str] | None, n_layers: int, n_heads: int, key: str) -> dict[str, tuple[int, int]]:
    """Parse pinned roles ``{role: head}`` and check each head exists (before any forward pass)."""
    out = {}
    for role, name in (pins or {}).items():
        if role not in ROLES:
            raise PosmechError(f"{key}.{role}: unknown role; pinnable roles are {', '.join(ROLES)}")
        layer, head = parse_head(name, f"{key}.{role}")
        if layer >= n_layers or head >= n_heads:
            raise PosmechError(
                f"{key}.{role}: head {name} does not exist in a model with {n_layers} layers × {n_heads} heads; "
                "pin an existing head or remove the pin to find the role automatically"
            )
        out[role] = (layer, head)
    return out


# --------------------------------------------------------------------------- checks
#: the position schemes of :func:`position_scheme_of` in words (the L rules' reasons)
SCHEME_WORDS = {"learned": "learned absolute positions", "rotary": "rotary positions", "alibi": "ALiBi positions",
                "none": "no positional encoding"}
#: why the position-only input is not defined, per scheme that has none (its quantities are
#: written without a value and this reason: the finding is not measurable)
NO_POSITION_ONLY = {"none": "not measurable: the model has no positional encoding, so there is no position part "
                            "and no position-only input (docs/claims.md, \"Position-only and token-only inputs\")"}


#: the position-only input in words, per scheme that has one (figure titles)
POSITION_ONLY_WORDS = {"learned": "token embeddings zeroed", "rotary": "one token repeated: only the rotation varies",
                       "alibi": "one token repeated: only the ALiBi bias varies"}


def position_scheme_of(cfg: Any) -> str:
    """The model's position scheme from its loaded ``cfg`` (TransformerLens's
    ``positional_embedding_type``): ``learned`` (``standard``), ``rotary``, ``alibi`` or
    ``none``; anything else (``shortformer``: positions added to queries and keys only) is an
    error naming ``attn_only.models``."""
    kind = str(getattr(cfg, "positional_embedding_type", "standard") or "standard")
    scheme = {"standard": "learned", "rotary": "rotary", "alibi": "alibi", "none": "none"}.get(kind)
    if scheme is None:
        raise PosmechError(f"attn_only.models: positional_embedding_type {kind!r}: the L rules' position-only and "
                           "token-only inputs are defined for learned absolute, rotary, ALiBi and no positional "
                           "encoding; remove the model from `attn_only.models`")
    return scheme


def require_variants(bridge: Any, key: str) -> str:
    """The model's position scheme, once its forward variants can be made: learned positions
    need the hooks ``hook_embed`` and ``hook_pos_embed``; rotary and ALiBi positions need a
    forward that runs every token at position 0 (the posmech engine's ``positions``:
    ``runs_token_trees``)."""
    scheme = position_scheme_of(bridge.cfg)
    if scheme == "learned" and ("hook_pos_embed" not in bridge.hook_dict or "hook_embed" not in bridge.hook_dict):
        raise PosmechError(f"{key}: learned positions but no hook_embed / hook_pos_embed to zero; the L rules' "
                           "position-only and token-only inputs cannot be made: remove it from `attn_only.models`")
    if scheme in ("rotary", "alibi") and not getattr(bridge, "runs_token_trees", False):
        raise PosmechError(f"{key}: {SCHEME_WORDS[scheme]}: the token-only input runs every token at position 0, "
                           "which only the posmech engine can do; set `engine: auto` (or `posmech`) for the model, "
                           "or remove it from `attn_only.models`")
    return scheme


def require_context(n_ctx: int, lengths: dict[str, int]) -> None:
    """Every configured sequence (``{config key: its length in tokens}``) fits the context."""
    for key, length in lengths.items():
        if length > n_ctx:
            raise PosmechError(
                f"{key}: sequences of {length} tokens are longer than the model's context ({n_ctx}); lower it"
            )


def bos_id(tokenizer: Any, bos: bool, key: str) -> int | None:
    """The tokenizer's BOS id when ``bos`` (an error naming ``key`` if it has none), else None."""
    if not bos:
        return None
    tid = getattr(tokenizer, "bos_token_id", None) if tokenizer is not None else None
    if tid is None:
        raise PosmechError(
            f"{key}: is true but the model's tokenizer defines no BOS token (bos_token); set `{key}: false` "
            "or give the tokenizer a bos_token"
        )
    return int(tid)


def sampling_vocab(tokenizer: Any, d_vocab: int) -> np.ndarray:
    """Ids the random tokens are drawn from: ids ``< min(d_vocab, len(tokenizer))`` that are
    not special tokens of the tokenizer."""
    n = min(int(d_vocab), len(tokenizer)) if tokenizer is not None else int(d_vocab)
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    ids = np.asarray([i for i in range(n) if i not in special], dtype=np.int64)
    if len(ids) < 2:
        raise PosmechError("the model's tokenizer has fewer than two non-special tokens to draw random tokens from")
    return ids


# --------------------------------------------------------------------------- sequences
def random_tokens(vocab: np.ndarray, n_sequences: int, n_tokens: int, bos: int | None, seed: int) -> np.ndarray:
    """``[n_sequences, n_tokens (+1)]`` int64: BOS (when given) then uniform random ``vocab`` ids."""
    rng = np.random.default_rng(seed)
    x = vocab[rng.integers(0, len(vocab), size=(n_sequences, n_tokens))]
    if bos is not None:
        x = np.concatenate([np.full((n_sequences, 1), bos, dtype=np.int64), x], axis=1)
    return x.astype(np.int64)


def repeated_tokens(vocab: np.ndarray, n_sequences: int, half: int, bos: int | None, seed: int) -> np.ndarray:
    """``[n, (1) + 2·half]``: ``[BOS] R R`` with ``R`` ``half`` random tokens (induction score)."""
    r = random_tokens(vocab, n_sequences, half, None, seed)
    x = np.concatenate([r, r], axis=1)
    if bos is not None:
        x = np.concatenate([np.full((n_sequences, 1), bos, dtype=np.int64), x], axis=1)
    return x


def distinct_tokens(vocab: np.ndarray, n_sequences: int, k: int, seed: int) -> np.ndarray:
    """``[n, k]``: per row ``k`` distinct ``vocab`` ids (A, B, R1..R7 of L4)."""
    if len(vocab) < k:
        raise PosmechError(f"need {k} distinct non-special tokens, the tokenizer has {len(vocab)}")
    rng = np.random.default_rng(seed)
    return np.stack([vocab[rng.choice(len(vocab), size=k, replace=False)] for _ in range(n_sequences)])


# --------------------------------------------------------------------------- forward variants
def variant_hooks(variant: str) -> list[Hook]:
    """Hooks of a forward variant on a model with learned positions: zero the token
    (``position_only``) or positional (``token_only``) embeddings at every position."""

    def zero(t: Any, hook: Any) -> Any:
        return t * 0.0

    if variant == "both":
        return []
    if variant == "position_only":
        return [("hook_embed", zero)]
    if variant == "token_only":
        return [("hook_pos_embed", zero)]
    raise PosmechError(f"unknown forward variant {variant!r}; expected one of {', '.join(VARIANTS)}")


def variant_input(scheme: str, variant: str, tokens: np.ndarray) -> tuple[np.ndarray, list[Hook], np.ndarray | None]:
    """What a forward variant runs on a model of position scheme ``scheme`` (module
    docstring): ``(tokens, hooks, positions)``, ``positions`` ``[T]`` the position of every
    token (None: ``0..T−1``).  ``position_only`` of scheme ``none`` is an error (it has no
    position part: :data:`NO_POSITION_ONLY`)."""
    if variant not in VARIANTS:
        raise PosmechError(f"unknown forward variant {variant!r}; expected one of {', '.join(VARIANTS)}")
    if scheme == "learned":
        return tokens, variant_hooks(variant), None
    if variant == "both" or (scheme == "none" and variant == "token_only"):
        return tokens, [], None
    if variant == "position_only":
        if scheme in NO_POSITION_ONLY:
            raise PosmechError(f"the position-only input is {NO_POSITION_ONLY[scheme]}")
        return np.repeat(tokens[:, -1:], tokens.shape[1], axis=1), [], None
    return tokens, [], np.zeros(tokens.shape[1], dtype=np.int64)  # token_only: every token at position 0


@dataclass
class Forward:
    """Scores and patterns of one forward variant over a batch of sequences.

    ``scores``/``patterns``: float64 ``[batch, n_captured, T, T]`` for ``heads`` (in order);
    scores are NaN above the diagonal, patterns 0 there.  ``target_logprob``: float64
    ``[batch]``, the log-probability of each sequence's target token at the last position
    (when targets were given)."""

    heads: list[tuple[int, int]]
    scores: np.ndarray
    patterns: np.ndarray
    target_logprob: np.ndarray | None = None

    def head(self, lh: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
        i = self.heads.index(lh)
        return self.scores[:, i], self.patterns[:, i]


def attn_scale(bridge: Any) -> float:
    """The model's score scale (:func:`posmech.models.scores.attn_scale`)."""
    return sa_attn_scale(bridge.cfg)


def run_variant(
    bridge: Any, tokens: np.ndarray, variant: str, heads: Sequence[tuple[int, int]] | None = None,
    targets: np.ndarray | None = None, batch_size: int = 100, progress: str | None = None,
) -> Forward:
    """Forward ``tokens [B, T]`` under ``variant`` (:func:`variant_input` of the model's
    scheme) in batches; capture ``heads`` (all when None); with ``targets [B]`` also the
    log-probability of each target token at the last position (the normal positions only)."""
    import torch

    from posmech.analyses.readout import logits_at

    cfg = bridge.cfg
    heads = list(heads) if heads is not None else [(la, h) for la in range(cfg.n_layers) for h in range(cfg.n_heads)]
    layers = sorted({la for la, _ in heads})
    scheme = position_scheme_of(cfg)
    tokens, hooks, positions = variant_input(scheme, variant, tokens)
    if positions is not None and targets is not None:
        raise PosmechError(f"the {variant} input of {SCHEME_WORDS[scheme]} moves the positions: no target "
                           "log-probabilities are read under it")
    B, T = tokens.shape
    scores = np.full((B, len(heads), T, T), np.nan)
    patterns = np.zeros((B, len(heads), T, T))
    last = np.zeros(B) if targets is not None else None
    scale = attn_scale(bridge)
    # rotary / ALiBi: the model's own score function; learned and none: q·k / scale below
    fn = score_function(cfg) if scheme in ("rotary", "alibi") else None
    extra = fn.extra_hooks if fn is not None else ()
    upper = np.triu(np.ones((T, T), dtype=bool), 1)
    tree = {} if positions is None else {"positions": positions, "visible": ~upper}
    prog = Progress(B, f"{progress}: {variant} forward, sequences", logger=LOG) if progress else None
    for start in range(0, B, batch_size):
        got: dict[tuple[str, int], Any] = {}

        def grab(name: str, layer: int) -> Any:  # keyed by the name asked for (the bridge's raw mode
            def keep(t: Any, hook: Any) -> None:  # calls hook_q's hook point `q.hook_out`)
                got[(name, layer)] = t.detach().to("cpu", torch.float64)

            return keep

        names = ("hook_q", "hook_k", "hook_pattern", *extra)
        grabs = [(f"blocks.{la}.attn.{k}", grab(k, la)) for la in layers for k in names]
        x = torch.as_tensor(tokens[start : start + batch_size], device=cfg.device)
        sl = slice(start, start + len(x))
        if last is not None and targets is not None:  # logits at the last position only
            lg = logits_at(bridge, x, np.arange(len(x)), np.full(len(x), T - 1), [*hooks, *grabs])
            t = torch.as_tensor(targets[sl], device=lg.device)[:, None]
            last[sl] = torch.log_softmax(lg.double(), -1).gather(-1, t)[:, 0].cpu().numpy()
        else:  # no logits: the pass can stop after the last captured layer
            with torch.inference_mode(), bridge.hooks(fwd_hooks=[*hooks, *grabs]):
                bridge(x, return_type=None, **tree)
        full = {la: fn.full(got[("hook_q", la)], got[("hook_k", la)], {e: got[(e, la)] for e in extra}, positions)
                for la in layers} if fn is not None else {}
        for i, (la, h) in enumerate(heads):
            if fn is not None:
                s = full[la][:, h].numpy()
            else:
                q = got[("hook_q", la)][:, :, h]
                k = key_head(got[("hook_k", la)], h, got[("hook_q", la)].shape[2])  # grouped / multi-query keys
                s = torch.einsum("bqd,bkd->bqk", q, k).numpy() / scale
            s[:, upper] = np.nan
            scores[sl, i] = s
            patterns[sl, i] = got[("hook_pattern", la)][:, h].numpy()
        if prog is not None:
            prog.update(min(start + batch_size, B))
    return Forward(heads, scores, patterns, last)


# --------------------------------------------------------------------------- head roles
def diagonal_mean(patterns: np.ndarray, offset: int, first_query: int) -> np.ndarray:
    """Mean over sequences and queries ``q >= max(first_query, offset)`` of ``P[q, q − offset]``:
    ``patterns [B, n, T, T]`` → ``[n]``.  An empty query set is an error."""
    T = patterns.shape[-1]
    q = np.arange(max(first_query, offset), T)
    if not len(q):
        raise PosmechError(f"no query at offset {offset} from query {first_query} in sequences of {T} tokens")
    return patterns[:, :, q, q - offset].mean(axis=(0, 2))


def induction_score(patterns: np.ndarray, half: int, bos: bool) -> np.ndarray:
    """Mean attention from every query of the second copy of ``[BOS] R R`` to the key just after
    the query token's first occurrence (offset ``half − 1``): ``[B, n, T, T]`` → ``[n]``."""
    first = (1 if bos else 0) + half
    q = np.arange(first, patterns.shape[-1])
    return patterns[:, :, q, q - half + 1].mean(axis=(0, 2))


#: ``head_name`` of a role that no head fills (its ``layer`` and ``head`` are empty): the best candidate's score is below the role's
#: threshold (``attn_only.role_min_score``); it is never "the best of the rest"
NONE = "none"


def find_roles(
    heads: list[tuple[int, int]], diag1: np.ndarray, diag2: np.ndarray, induction: np.ndarray,
    pins: dict[str, tuple[int, int]], min_score: dict[str, float] | None = None,
) -> list[dict[str, Any]]:
    """Rows ``role, layer, head, head_name, criterion, score, source, candidate, min_score, passes``:
    previous-token head = argmax of ``diag1``, look-back-two = argmax of ``diag2`` over the
    other heads, induction = argmax of ``induction`` (``source`` ``found``), or the pinned
    head (``pinned``).  A found role whose best ``candidate`` scores below ``min_score[role]``
    has ``head_name`` :data:`NONE` and no ``layer``/``head`` (``source`` ``none``): the role is not filled."""
    min_score = min_score or {}
    rows = []
    taken: set[tuple[int, int]] = set()
    for role, vals, crit in (
        ("previous", diag1, RANDOM_PREV_MASS),  # the names of heads.csv's l_previous_mass, l_offset2_mass
        ("look_back_two", diag2, RANDOM_OFFSET2_MASS),
        ("induction", induction, "induction score"),
    ):
        if role in pins:
            lh, source = pins[role], "pinned"
        else:
            order = np.argsort(-vals, kind="stable")
            cand = [heads[i] for i in order if not (role == "look_back_two" and heads[i] in taken)]
            lh, source = cand[0], "found"
        taken.add(lh)
        score, thr = float(vals[heads.index(lh)]), float(min_score.get(role, -np.inf))
        passes = source == "pinned" or score >= thr
        rows.append({"role": role, "layer": lh[0] if passes else None, "head": lh[1] if passes else None,
                     "head_name": head_name(*lh) if passes else NONE, "criterion": crit, "score": score,
                     "source": source if passes else NONE, "candidate": head_name(*lh),
                     "min_score": thr if np.isfinite(thr) else None, "passes": passes})
    return rows


def roles_frame(model: str, roles: list[dict[str, Any]]) -> Any:
    """The ``head_roles.csv`` table of :func:`find_roles` rows: ``layer`` and ``head`` are
    nullable integers (``Int64``), empty for a role no head fills (``head_name`` :data:`NONE`)."""
    import pandas as pd

    return pd.DataFrame([{"model": model, **r} for r in roles]).astype({"layer": "Int64", "head": "Int64"})


def claim_table(claim: str, model: str, rows: list[dict[str, Any]], **columns: Any) -> Any:
    """A table of an L rule: ``rows`` (dicts of the library's results, e.g. the ``patterns`` or
    ``masses`` of :func:`random_token_patterns`, the rows of :func:`bos_induction`) with the
    columns ``claim`` (``claim``), ``model`` and then ``columns`` (the same value in every
    row, e.g. the head measured) in front of each row's own."""
    import pandas as pd

    return pd.DataFrame([{"claim": claim, "model": model, **columns, **r} for r in rows])


def role_missing(role: str, row: dict[str, Any]) -> str:
    """Why a role is not filled, in words (``row`` of :func:`find_roles` with ``head_name`` :data:`NONE`)."""
    words = role.replace("_", "-")
    return (f"no {words} head: the best candidate {row['candidate']} scores {row['score']:.3f} "
            f"({row['criterion']}) < attn_only.role_min_score.{role} {row['min_score']:g}")


def offset_masses(pattern: np.ndarray, first_query: int, bos: bool) -> dict[str, float]:
    """Masses of a mean pattern ``[T, T]`` averaged over queries ``first_query..T−1``:
    ``previous`` (key q−1), ``offset_2`` (q−2), ``offset_3`` (q−3), ``self`` (q) and ``bos`` (key 0
    when the sequences have BOS)."""
    T = pattern.shape[-1]
    q = np.arange(first_query, T)
    if not len(q) or first_query < 3:
        raise PosmechError(f"masses need queries >= 3 (got first_query {first_query}, {T} tokens)")
    out = {"previous": pattern[q, q - 1].mean(), "offset_2": pattern[q, q - 2].mean(),
           "offset_3": pattern[q, q - 3].mean(), "self": pattern[q, q].mean()}
    if bos:
        out["bos"] = pattern[q, 0].mean()
    return {k: float(v) for k, v in out.items()}


# --------------------------------------------------------------------------- tidy tables
def matrix_rows(M: np.ndarray, value: str, lower: bool = True) -> list[dict[str, Any]]:
    """``[T, T]`` → rows ``query, key, offset, <value>`` for keys ``<=`` query."""
    T = M.shape[0]
    return [{"query": q, "key": k, "offset": k - q, value: float(M[q, k])}
            for q in range(T) for k in range(q + 1 if lower else T)]


#: columns of :func:`decomposition_rows` (the table of rule input_decomposition, empty when no
#: head fills either role)
DECOMPOSITION_COLUMNS = ["claim", "layer", "head", "head_name", "role", "variant", "n_sequences", "query", "key",
                         "offset", "score_mean",
                         "score_sd", "pattern_mean"]


def decomposition_rows(
    fwds: dict[str, Forward], roles: dict[str, tuple[int, int]], claims: dict[str, str],
) -> list[dict[str, Any]]:
    """Rows per (role, variant, query, key): mean / sd of the score, mean pattern, over sequences."""
    rows = []
    for role, lh in roles.items():
        for variant, f in fwds.items():
            S, P = f.head(lh)
            ms, sd, mp = S.mean(0), S.std(0), P.mean(0)
            T = ms.shape[0]
            claim = claims[role]
            if role == "previous" and variant == "position_only":
                claim = "L2,L3"
            for q in range(T):
                for k in range(q + 1):
                    rows.append({"claim": claim, "layer": lh[0], "head": lh[1], "head_name": head_name(*lh),
                                 "role": role, "variant": variant,
                                 "n_sequences": S.shape[0], "query": q, "key": k, "offset": k - q,
                                 "score_mean": float(ms[q, k]), "score_sd": float(sd[q, k]),
                                 "pattern_mean": float(mp[q, k])})
    return rows


def decomposition_table(rows: list[dict[str, Any]], model: str) -> Any:
    """L2/L3/L5's table of :func:`input_decomposition`'s rows (none when neither role is
    filled): :data:`DECOMPOSITION_COLUMNS` with ``model`` second, after ``claim``."""
    import pandas as pd

    df = pd.DataFrame([{"model": model, **r} for r in rows], columns=["model", *DECOMPOSITION_COLUMNS])
    df.insert(1, "model", df.pop("model"))
    return df


def mean_matrix(df: Any, head: str, variant: str, value: str) -> np.ndarray:
    """The ``[T, T]`` matrix of ``value`` (NaN above the diagonal) from decomposition rows."""
    d = df[(df["head_name"] == head) & (df["variant"] == variant)]
    T = int(d["query"].max()) + 1
    M = np.full((T, T), np.nan)
    M[d["query"].to_numpy(), d["key"].to_numpy()] = d[value].to_numpy()
    return M


# --------------------------------------------------------------------------- L4
def induction_sequences(distinct: np.ndarray, bos: int | None) -> tuple[np.ndarray, list[str]]:
    """``[BOS] A B R1..Rk A`` (or without BOS) from rows ``A, B, R1..Rk`` of ``distinct``;
    also the key labels."""
    a = distinct[:, :1]
    x = np.concatenate([distinct, a], axis=1)
    k = distinct.shape[1] - 2
    labels = ["A", "B", *[f"R{i + 1}" for i in range(k)], "A (query)"]
    if bos is not None:
        x = np.concatenate([np.full((len(x), 1), bos, dtype=np.int64), x], axis=1)
        labels = ["BOS", *labels]
    return x.astype(np.int64), labels


# --------------------------------------------------------------------------- scorecards
def scorecard(rows: list[tuple[str, str, float | list[str], str]], model: str, artifact: str) -> list[dict[str, Any]]:
    """``(claim, quantity, value, detail)`` tuples → scorecard dicts."""
    return [{"claim": c, "model": model, "quantity": q, "value": v, "detail": d, "artifact": artifact}
            for c, q, v, d in rows]


# --------------------------------------------------------------------------- settings
@dataclass
class Setup:
    """What every L rule needs before its first forward pass (all checks done)."""

    bos: int | None
    vocab: np.ndarray
    pins: dict[str, tuple[int, int]]
    heads: list[tuple[int, int]]
    #: the model's position scheme (:func:`position_scheme_of`)
    scheme: str = "learned"


def prepare(bridge: Any, p: AttnOnlySettings, model: str, entry: dict[str, Any], need_bos: bool = False) -> Setup:
    """Every check of the L rules, before any forward pass: settings, the position scheme's
    forward variants (:func:`require_variants`), the pinned heads, sequence lengths vs ``n_ctx``, a BOS token when ``attn_only.bos`` is true
    (``need_bos``: L4 always needs one)."""
    p.check()
    scheme = require_variants(bridge, f"model `{model}`")
    cfg = bridge.cfg
    pins = check_pins(((p.pin or {}).get(model)), cfg.n_layers, cfg.n_heads, f"attn_only.pin.{model}")
    bos = p.bos_for(entry)
    if need_bos and not bos:
        raise PosmechError(f"attn_only.bos: L4 (bos_induction) compares with and without BOS; model `{model}` "
                           "runs without BOS (`bos: false` or `prepend_bos: false`): leave it out of the rule")
    require_context(int(cfg.n_ctx), p.sequence_lengths(bos))
    bid = bos_id(bridge.tokenizer, bos, "attn_only.bos")
    vocab = sampling_vocab(bridge.tokenizer, cfg.d_vocab)
    heads = [(la, h) for la in range(cfg.n_layers) for h in range(cfg.n_heads)]
    return Setup(bid, vocab, pins, heads, scheme)


# --------------------------------------------------------------------------- rules
def random_token_patterns(bridge: Any, p: AttnOnlySettings, setup: Setup, progress: str = "L1") -> dict[str, Any]:
    """L1 and the head roles: mean pattern of every head over ``n_sequences`` random-token
    sequences, offset masses per head, and the roles (previous, look-back-two, induction).

    Returns ``patterns`` (rows per head/query/key), ``masses`` (rows per head/mass), ``roles``
    (rows of :func:`find_roles`), ``mean`` ``[n_heads, T, T]`` and ``induction`` ``[n_heads]``."""
    x = random_tokens(setup.vocab, p.n_sequences, p.n_tokens, setup.bos, p.seed)
    f = run_variant(bridge, x, "both", setup.heads, batch_size=p.batch_size, progress=progress)
    mean = f.patterns.mean(0)
    d1 = diagonal_mean(f.patterns, 1, p.first_query)
    d2 = diagonal_mean(f.patterns, 2, p.first_query)
    ind = p.induction_score
    xr = repeated_tokens(setup.vocab, ind.n_sequences, ind.half_length, setup.bos, p.seed + 1)
    fr = run_variant(bridge, xr, "both", setup.heads, batch_size=p.batch_size, progress=f"{progress} induction")
    ind_score = induction_score(fr.patterns, ind.half_length, setup.bos is not None)
    roles = find_roles(setup.heads, d1, d2, ind_score, setup.pins, p.role_min_score.as_dict())
    role_of = {r["head_name"]: r["role"] for r in reversed(roles)}
    patterns, masses = [], []
    for i, lh in enumerate(setup.heads):
        name = head_name(*lh)
        ids = {"layer": lh[0], "head": lh[1], "head_name": name}
        for r in matrix_rows(mean[i], "attention"):
            patterns.append({**ids, "role": role_of.get(name, ""), **r})
        m = offset_masses(mean[i], p.first_query, setup.bos is not None)
        for kind, v in m.items():
            masses.append({**ids, "role": role_of.get(name, ""), "mass": kind, "value": v,
                           "queries": f"{p.first_query}..{mean.shape[-1] - 1}"})
        masses.append({**ids, "role": role_of.get(name, ""), "mass": "induction_score",
                       "value": float(ind_score[i]), "queries": "second copy"})
    return {"patterns": patterns, "masses": masses, "roles": roles, "mean": mean, "induction": ind_score}


def input_decomposition(
    bridge: Any, p: AttnOnlySettings, setup: Setup, roles: dict[str, tuple[int, int]], progress: str = "L2/L3/L5",
) -> list[dict[str, Any]]:
    """L2, L3, L5: scores and patterns of the previous-token and look-back-two heads under the
    three inputs (:func:`variant_input` of the model's scheme) on the L1 sequences (same
    seed).  With learned positions ``position_only`` does not depend on the tokens, so one
    sequence stands for all (its sd is 0); with rotary or ALiBi positions it repeats each
    sequence's last token, so its mean is over those tokens; a model with no positional
    encoding has none (:data:`NO_POSITION_ONLY`).  Rows of :func:`decomposition_rows`."""
    x = random_tokens(setup.vocab, p.n_sequences, p.n_tokens, setup.bos, p.seed)
    heads = list(dict.fromkeys(roles.values()))
    fwds = {}
    for v in VARIANTS:
        if v == "position_only" and setup.scheme in NO_POSITION_ONLY:
            continue
        xs = x[:1] if v == "position_only" and setup.scheme == "learned" else x
        fwds[v] = run_variant(bridge, xs, v, heads, batch_size=p.batch_size, progress=progress)
    return decomposition_rows(fwds, roles, {"previous": "L2", "look_back_two": "L5"})


def bos_induction(
    bridge: Any, p: AttnOnlySettings, setup: Setup, induction: tuple[int, int], progress: str = "L4",
) -> tuple[list[dict[str, Any]], dict[str, np.ndarray]]:
    """L4: P([B]) at the final [A] of ``[BOS] A B R1..Rk A`` and of ``A B R1..Rk A`` (A, B, R
    distinct random tokens, the same draws in both conditions), and the induction head's
    attention row at the last query.  Rows: ``condition, quantity (p_B | attention), key_label,
    key_position, value, sd, n_samples``; also the mean rows per condition."""
    c = p.bos_induction
    k = c.n_random + 2
    draws = distinct_tokens(setup.vocab, c.n_samples, k, p.seed + 2)
    rows, mean_rows = [], {}
    for cond, bos in (("with_bos", setup.bos), ("without_bos", None)):
        x, labels = induction_sequences(draws, bos)
        f = run_variant(bridge, x, "both", [induction], targets=draws[:, 1], batch_size=p.batch_size,
                        progress=f"{progress} {cond}")
        pb = np.exp(f.target_logprob)
        rows.append({"condition": cond, "quantity": "p_B", "key_label": "", "key_position": -1,
                     "value": float(pb.mean()), "sd": float(pb.std()), "n_samples": len(pb)})
        row = f.patterns[:, 0, -1, :]
        mean_rows[cond] = row.mean(0)
        for j, lab in enumerate(labels):
            rows.append({"condition": cond, "quantity": "attention", "key_label": lab, "key_position": j,
                         "value": float(row[:, j].mean()), "sd": float(row[:, j].std()), "n_samples": len(row)})
    return rows, mean_rows


# --------------------------------------------------------------------------- scorecard rows per rule
def random_token_scorecard(out: dict[str, Any], p: AttnOnlySettings, setup: Setup, model: str,
                           artifact: str) -> list[dict[str, Any]]:
    """L1 rows (previous-token head's masses over queries first_query..T−1, its row 1) and the
    head roles (L1 previous, L5 look-back-two, L4 induction)."""
    roles = {r["role"]: r for r in out["roles"]}
    src = {k: (f"{v['source']} ({v['criterion']} {v['score']:.3f})" if v["head_name"] != NONE else role_missing(k, v))
           for k, v in roles.items()}
    rows: list[tuple[str, str, Any, str]] = [
        (claim, f"{role}_head" if role != "previous" else "previous_token_head",
         [roles[role]["head_name"]] if roles[role]["head_name"] != NONE else [], src[role])
        for claim, role in (("L1", "previous"), ("L5", "look_back_two"), ("L4", "induction"))]
    # the best candidate's score of every role, whether or not it passes the role's threshold:
    # the existence findings (L1, L5) read these, so they fail rather than go unmeasured
    rows += [(claim, f"{role}_candidate_score", roles[role]["score"],
              f"{roles[role]['candidate']}: {roles[role]['criterion']} (best candidate for the role)")
             for claim, role in (("L1", "previous"), ("L5", "look_back_two"), ("L4", "induction"))]
    names = ["prev_head_mass_previous", "prev_head_mass_self", "prev_head_mass_offset2"]
    if setup.bos is not None:
        names += ["prev_head_mass_bos", "prev_head_row1_bos", "prev_head_row1_self"]
    prev = roles["previous"]["head_name"]
    if prev == NONE:
        return scorecard(rows + [("L1", q, None, src["previous"]) for q in names], model, artifact)
    M = out["mean"][setup.heads.index(parse_head(prev))]
    m = {(r["head_name"], r["mass"]): r["value"] for r in out["masses"]}
    qs = f"queries {p.first_query}..{M.shape[-1] - 1}, {p.n_sequences} random-token sequences"
    values = {"prev_head_mass_previous": (m[(prev, "previous")], f"{prev}, key q-1; {qs}"),
              "prev_head_mass_self": (m[(prev, "self")], f"{prev}, key q; {qs}"),
              "prev_head_mass_offset2": (m[(prev, "offset_2")], f"{prev}, key q-2; {qs}")}
    if setup.bos is not None:
        values.update({"prev_head_mass_bos": (m[(prev, "bos")], f"{prev}, key 0 (BOS); {qs}"),
                       "prev_head_row1_bos": (float(M[1, 0]), f"{prev}, query 1 -> key 0 (BOS)"),
                       "prev_head_row1_self": (float(M[1, 1]), f"{prev}, query 1 -> key 1")})
    return scorecard(rows + [("L1", q, *values[q]) for q in names], model, artifact)


def _at(df: Any, head: str, variant: str, query: int, key: int, col: str) -> float:
    d = df[(df["head_name"] == head) & (df["variant"] == variant) & (df["query"] == query) & (df["key"] == key)]
    return float(d[col].iloc[0])


#: the quantities of :func:`decomposition_scorecard` per role (``(claim, quantity)``; the
#: BOS-only ones last): a role that no head fills gets them without a value and the reason
DECOMPOSITION_QUANTITIES = {
    "previous": [("L2", q) for q in ("posonly_score_offset1", "posonly_score_self", "posonly_score_offset2",
                                     "posonly_score_max_other", "posonly_pattern_offset1", "tokonly_score_other_mean",
                                     "both_pattern_offset1", "both_pattern_self", "both_pattern_offset2")]
                + [("L3", q) for q in ("posonly_row1_key0", "posonly_row1_self", "posonly_min_prev_q2plus")],
    "look_back_two": [("L5", f"posonly_pattern_{n}") for n in ("offset2", "offset1", "offset3", "offset4", "self")]
                     + [("L5", f"posonly_score_{n}") for n in ("offset2", "offset1", "offset3")]
                     + [("L5", f"both_mass_{n}") for n in ("offset2", "offset1", "offset3")],
}
DECOMPOSITION_BOS_QUANTITIES = [("L2", "tokonly_score_bos"), ("L2", "tokonly_pattern_bos"), ("L2", "both_pattern_bos")]


def decomposition_scorecard(df: Any, roles: dict[str, str], p: AttnOnlySettings, bos: bool, model: str,
                            artifacts: dict[str, str], missing: dict[str, str] | None = None,
                            scheme: str = "learned") -> list[dict[str, Any]]:
    """L2, L3, L5 rows at query ``p.query`` (and, for L5 'both', masses over queries
    first_query..T−1 of the mean pattern).  A role whose head is :data:`NONE` gets its
    quantities (:data:`DECOMPOSITION_QUANTITIES`) without a value and ``missing[role]`` (why).
    A position scheme without a position-only input (:data:`NO_POSITION_ONLY`) gets its
    ``posonly_*`` quantities without a value and that reason."""
    rows = _decomposition_scorecard(df, roles, p, bos, model, artifacts, missing, scheme in NO_POSITION_ONLY)
    if scheme in NO_POSITION_ONLY:
        rows = [{**r, "value": None, "detail": NO_POSITION_ONLY[scheme]} if r["quantity"].startswith("posonly_")
                and r["value"] is not None else r for r in rows]
    return rows


def _decomposition_scorecard(df: Any, roles: dict[str, str], p: AttnOnlySettings, bos: bool, model: str,
                             artifacts: dict[str, str], missing: dict[str, str] | None,
                             no_position: bool) -> list[dict[str, Any]]:
    """:func:`decomposition_scorecard`'s rows; ``no_position``: the table has no
    ``position_only`` rows (their quantities get NaN here, replaced by the reason there)."""
    if no_position:  # a stand-in for the missing variant: NaN in every cell
        pos = df[df["variant"] == "token_only"].assign(variant="position_only", score_mean=np.nan,
                                                         score_sd=np.nan, pattern_mean=np.nan)
        df = _concat(df, pos)
    q, fq = p.query, p.first_query
    prev, lb2 = roles["previous"], roles["look_back_two"]
    art = {"L2": artifacts["L2"], "L3": artifacts["L3"], "L5": artifacts["L5"]}
    absent: list[dict[str, Any]] = []
    for role in ("previous", "look_back_two"):
        if roles[role] == NONE:
            names = DECOMPOSITION_QUANTITIES[role] + (DECOMPOSITION_BOS_QUANTITIES if bos and role == "previous" else [])
            why = (missing or {}).get(role, f"no {role.replace('_', '-')} head")
            absent += [{"claim": c, "model": model, "quantity": n, "value": None, "detail": why, "artifact": art[c]}
                       for c, n in names]
    rows: list[tuple[str, str, Any, str]] = []
    d = f"query {q}"
    if prev == NONE:
        return absent + ([] if lb2 == NONE else _look_back_two_rows(df, lb2, q, fq, bos, model, art))
    for name, key in (("offset1", q - 1), ("self", q), ("offset2", q - 2)):
        rows.append(("L2", f"posonly_score_{name}", _at(df, prev, "position_only", q, key, "score_mean"), f"{prev}, {d}"))
    others = [k for k in range(q + 1) if k not in (q, q - 1, q - 2)]
    rows.append(("L2", "posonly_score_max_other", max(_at(df, prev, "position_only", q, k, "score_mean") for k in others),
                 f"{prev}, {d}, keys other than q, q-1, q-2"))
    rows.append(("L2", "posonly_pattern_offset1", _at(df, prev, "position_only", q, q - 1, "pattern_mean"), f"{prev}, {d}"))
    first = 1 if bos else 0
    rest = [_at(df, prev, "token_only", q, k, "score_mean") for k in range(first, q + 1)]
    rows.append(("L2", "tokonly_score_other_mean", float(np.mean(rest)), f"{prev}, {d}, mean over non-BOS keys"))
    if bos:
        rows += [("L2", "tokonly_score_bos", _at(df, prev, "token_only", q, 0, "score_mean"), f"{prev}, {d}, key BOS"),
                 ("L2", "tokonly_pattern_bos", _at(df, prev, "token_only", q, 0, "pattern_mean"), f"{prev}, {d}"),
                 ("L2", "both_pattern_bos", _at(df, prev, "both", q, 0, "pattern_mean"), f"{prev}, {d}")]
    for name, key in (("offset1", q - 1), ("self", q), ("offset2", q - 2)):
        rows.append(("L2", f"both_pattern_{name}", _at(df, prev, "both", q, key, "pattern_mean"), f"{prev}, {d}"))
    P = mean_matrix(df, prev, "position_only", "pattern_mean")
    rows += [("L3", "posonly_row1_key0", float(P[1, 0]), f"{prev}, position-only query 1 -> key 0"),
             ("L3", "posonly_row1_self", float(P[1, 1]), f"{prev}, position-only query 1 -> key 1"),
             ("L3", "posonly_min_prev_q2plus", float(min(P[k, k - 1] for k in range(2, P.shape[0]))),
              f"{prev}, position-only, min over queries >= 2 of P[q, q-1]")]
    out = [{**r, "artifact": art[r["claim"]]} for r in scorecard(rows, model, "")]
    return out + absent + ([] if lb2 == NONE else _look_back_two_rows(df, lb2, q, fq, bos, model, art))


def _concat(a: Any, b: Any) -> Any:
    """The rows of frame ``a`` then those of ``b``."""
    import pandas as pd

    return pd.concat([a, b], ignore_index=True)


def _look_back_two_rows(df: Any, lb2: str, q: int, fq: int, bos: bool, model: str,
                        art: dict[str, str]) -> list[dict[str, Any]]:
    """L5 rows of :func:`decomposition_scorecard` for the look-back-two head ``lb2``."""
    rows: list[tuple[str, str, Any, str]] = []
    d = f"query {q}"
    for name, off in (("offset2", 2), ("offset1", 1), ("offset3", 3), ("offset4", 4), ("self", 0)):
        rows.append(("L5", f"posonly_pattern_{name}", _at(df, lb2, "position_only", q, q - off, "pattern_mean"),
                     f"{lb2}, {d}"))
    for name, off in (("offset2", 2), ("offset1", 1), ("offset3", 3)):
        rows.append(("L5", f"posonly_score_{name}", _at(df, lb2, "position_only", q, q - off, "score_mean"),
                     f"{lb2}, {d}"))
    B = mean_matrix(df, lb2, "both", "pattern_mean")
    m = offset_masses(B, fq, bos)
    for name, k in (("offset2", "offset_2"), ("offset1", "previous"), ("offset3", "offset_3")):
        rows.append(("L5", f"both_mass_{name}", m[k], f"{lb2}, mean over queries {fq}..{B.shape[0] - 1}"))
    return [{**r, "artifact": art[r["claim"]]} for r in scorecard(rows, model, "")]


#: the quantities of :func:`bos_induction_scorecard` (written without a value when no head
#: fills the induction role)
BOS_INDUCTION_QUANTITIES = ("p_b_with_bos", "p_b_without_bos", "induction_row_with_bos_bos", "induction_row_with_bos_b",
                            "induction_row_without_bos_a", "induction_row_without_bos_b", "p_b_without_over_with")


def bos_induction_scorecard(rows: list[dict[str, Any]], head: str, model: str, artifact: str) -> list[dict[str, Any]]:
    """L4 rows: P([B]) with / without BOS and the induction head's attention to BOS, A and B."""
    att = {(r["condition"], r["key_label"]): r["value"] for r in rows if r["quantity"] == "attention"}
    pb = {r["condition"]: r for r in rows if r["quantity"] == "p_B"}
    n = pb["with_bos"]["n_samples"]
    out: list[tuple[str, str, Any, str]] = [
        ("L4", "p_b_with_bos", pb["with_bos"]["value"], f"mean over {n} samples (sd {pb['with_bos']['sd']:.3g})"),
        ("L4", "p_b_without_bos", pb["without_bos"]["value"],
         f"mean over {n} samples (sd {pb['without_bos']['sd']:.3g})"),
        ("L4", "induction_row_with_bos_bos", att[("with_bos", "BOS")], f"{head}, final [A] -> BOS"),
        ("L4", "induction_row_with_bos_b", att[("with_bos", "B")], f"{head}, final [A] -> B"),
        ("L4", "induction_row_without_bos_a", att[("without_bos", "A")], f"{head}, final [A] -> A at position 0"),
        ("L4", "induction_row_without_bos_b", att[("without_bos", "B")], f"{head}, final [A] -> B"),
    ]
    with_bos = pb["with_bos"]["value"]
    out.append(("L4", "p_b_without_over_with", pb["without_bos"]["value"] / with_bos if with_bos > 0 else None,
                "P([B]) without BOS / with BOS" if with_bos > 0 else "P([B]) with BOS is 0: no ratio"))
    return scorecard(out, model, artifact)


def read_roles(path: str) -> dict[str, str]:
    """``{role: head}`` from a ``head_roles.csv`` written by rule random_token_patterns (head
    :data:`NONE` for a role no head fills)."""
    return {r: row["head_name"] for r, row in read_role_rows(path).items()}


def read_role_rows(path: str) -> dict[str, dict[str, Any]]:
    """``{role: row}`` of a ``head_roles.csv`` (:func:`find_roles`' columns)."""
    from posmech.store.tables import read_table

    df = read_table(path)
    missing = [r for r in ROLES if r not in set(df["role"])]
    if missing:
        raise PosmechError(f"{path}: no row for role(s) {', '.join(missing)}; rerun random_token_patterns")
    if "head_name" not in df:
        raise PosmechError(f"{path}: written before the per-head column contract (no `head_name` column); "
                           "rerun random_token_patterns")
    if "candidate" not in df:
        raise PosmechError(f"{path}: written before role thresholds (no `candidate` column); rerun random_token_patterns")
    return {str(r["role"]): r for r in df.to_dict("records")}
