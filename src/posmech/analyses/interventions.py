"""Interventions on a running model around previous-token heads (P5, P14, P15, P16).

Every intervention is a list of TransformerLens forward hooks on a ``TransformerBridge``
(``(hook_name, fn)`` pairs, see :func:`knockout_hooks`, :func:`residual_shift_hook`,
:func:`redirect_hook`, :func:`scale_head_hook`), run through :func:`run_hooked`, which
adds them for one forward pass under ``torch.inference_mode()`` and removes them on exit
(also on error): the model's weights are never touched, so it is unchanged afterwards.

The experiments (one per rule) take token arrays and head names and return tidy rows
(lists of dicts) plus the small matrices their figures show:

* :func:`prev_knockout` (P5): attention to the previous position is zeroed at every
  ``period``-th query position in some layers (all heads), with and without
  renormalising the row; the sharp head's previous-token mass before/after.
* :func:`extended_averaging` (P15): the positional component of the residual stream
  (the token-averaged extended embeddings ``E_l``) is replaced by its group average
  just before a layer, i.e. ``group_average(E_l, k) - E_l`` is added at
  ``blocks.l.hook_resid_pre``; each measured head's previous-token mass before/after.
* :func:`repeated_tokens` (P14): the sharp head's previous-token mass at queries whose
  previous token equals the current one vs elsewhere.
* :func:`induction_intervention` (P16): the sharp head's attention rows are redirected
  and its output scaled on a repeat prompt; probabilities of continuations before/after.

Conventions: a head is ``"L{layer}H{head}"``; a document is an int array ``[T]`` of token
ids (BOS first when the model prepends one); a head's *previous-token mass* at query
``q >= 1`` is ``pattern[q, q - 1]`` (query 0 has no previous position and is never
counted).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from posmech.analyses.attention import check_head, equal_length_batches, parse_head, prev_token_mass, window_block
from posmech.core.errors import PosmechError
from posmech.settings.interventions import InterventionsSettings

LOG = logging.getLogger(__name__)

Hook = tuple[str, Callable[..., Any]]


# --------------------------------------------------------------------------- pure helpers
def knockout_rows(n_pos: int, period: int, phase: int = 0) -> np.ndarray:
    """Boolean ``[n_pos]``: query positions ``q >= 1`` with ``q % period == phase`` (the
    rows whose attention to ``q - 1`` is knocked out)."""
    if period < 1 or not 0 <= phase < period:
        raise PosmechError(f"knock-out period must be >= 1 and 0 <= phase < period (got {period}, {phase})")
    q = np.arange(n_pos)
    return (q >= 1) & (q % period == phase)


def repeat_queries(tokens: np.ndarray) -> np.ndarray:
    """Boolean ``[T]``: queries ``q >= 1`` whose previous token equals the current token."""
    t = np.asarray(tokens)
    out = np.zeros(len(t), dtype=bool)
    out[1:] = t[1:] == t[:-1]
    return out


def extended_shift(E: np.ndarray, k: int, first: int, group_average: Callable[[np.ndarray, int], np.ndarray]) -> np.ndarray:
    """``delta [n_ctx, d_model]`` adding which to a residual stream replaces its positional
    component ``E`` by the group-of-``k`` average: rows ``first..`` are averaged in
    contiguous groups starting at ``first`` (rows before ``first``, e.g. a BOS position,
    get zero)."""
    E = np.asarray(E, dtype=np.float64)
    delta = np.zeros_like(E)
    delta[first:] = group_average(E[first:], k) - E[first:]
    return delta


def token_span(offsets: Sequence[tuple[int, int]], start: int, end: int) -> tuple[int, int]:
    """Indices ``(first, last)`` of the tokens covering characters ``[start, end)`` given a
    fast tokenizer's offset mapping."""
    idx = [i for i, (a, b) in enumerate(offsets) if b > start and a < end and b > a]
    if not idx:
        raise PosmechError(f"no token covers characters {start}..{end} of the prompt")
    return idx[0], idx[-1]


def minimal_sequences(seqs: Iterable[Sequence[int]]) -> list[tuple[int, ...]]:
    """Distinct token sequences, dropping any that extends another (their probabilities would
    be counted twice when summed); order of first appearance kept."""
    uniq = list(dict.fromkeys(tuple(int(t) for t in s) for s in seqs if len(s)))
    return [s for s in uniq if not any(o != s and s[: len(o)] == o for o in uniq)]


# --------------------------------------------------------------------------- hooks
def knockout_hooks(layers: Iterable[int], rows: np.ndarray, renormalise: bool) -> list[Hook]:
    """Hooks zeroing ``pattern[:, :, q, q - 1]`` for every query ``q`` in ``rows`` (bool
    ``[T]``) in every head of ``layers``; with ``renormalise`` each such row is divided by
    its remaining sum (a row with nothing left stays zero)."""
    q = np.flatnonzero(rows)
    q = q[q >= 1]

    def fn(pattern: Any, hook: Any) -> Any:
        import torch

        T = pattern.shape[-2]
        qq = torch.as_tensor(q[q < T], device=pattern.device)
        p = pattern.clone()
        p[..., qq, qq - 1] = 0.0
        if renormalise and len(qq):
            sub = p[..., qq, :]
            s = sub.sum(-1, keepdim=True)
            p[..., qq, :] = torch.where(s > 0, sub / torch.where(s > 0, s, torch.ones_like(s)), sub)
        return p

    return [(f"blocks.{int(layer)}.attn.hook_pattern", fn) for layer in layers]


def residual_shift_hook(layer: int, delta: np.ndarray) -> Hook:
    """Hook adding ``delta[:T]`` (``[n_ctx, d_model]``) to ``blocks.{layer}.hook_resid_pre``."""

    def fn(resid: Any, hook: Any) -> Any:
        import torch

        T = resid.shape[1]
        d = torch.as_tensor(delta[:T], dtype=resid.dtype, device=resid.device)
        return resid + d

    return (f"blocks.{int(layer)}.hook_resid_pre", fn)


def redirect_hook(layer: int, head: int, redirects: dict[int, int]) -> Hook:
    """Hook setting head ``(layer, head)``'s pattern row ``q`` to a one-hot on key
    ``redirects[q]`` (``key <= q``) for every query in ``redirects``."""
    for q, k in redirects.items():
        if not 0 <= k <= q:
            raise PosmechError(f"redirect of query {q} to key {k}: the key must be at or before the query")

    def fn(pattern: Any, hook: Any) -> Any:
        p = pattern.clone()
        for q, k in redirects.items():
            p[:, head, q, :] = 0.0
            p[:, head, q, k] = 1.0
        return p

    return (f"blocks.{int(layer)}.attn.hook_pattern", fn)


def scale_head_hook(layer: int, head: int, factor: float) -> Hook:
    """Hook multiplying head ``(layer, head)``'s ``hook_z`` by ``factor`` (its output to the
    residual stream, ``z @ W_O``, scales with it; the shared ``b_O`` does not)."""

    def fn(z: Any, hook: Any) -> Any:
        z = z.clone()
        z[:, :, head] = z[:, :, head] * factor
        return z

    return (f"blocks.{int(layer)}.attn.hook_z", fn)


def fingerprint(bridge: Any) -> str:
    """sha256 over every parameter and buffer of ``bridge`` (names, shapes, bytes)."""
    import hashlib

    import torch

    h = hashlib.sha256()
    for name, t in bridge.state_dict().items():
        h.update(f"{name}{tuple(t.shape)}{t.dtype}".encode())
        if t.numel():
            h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


@contextlib.contextmanager
def unchanged(bridge: Any) -> Iterator[None]:
    """Check that the block leaves ``bridge``'s weights bitwise as they were and no hook
    behind; :class:`PosmechError` otherwise (an intervention must never leak)."""
    before = fingerprint(bridge)
    yield
    leftover = [n for n, hp in bridge.hook_dict.items() if getattr(hp, "fwd_hooks", None)]
    if fingerprint(bridge) != before or leftover:
        raise PosmechError(
            "an intervention changed the model's weights or left hooks behind "
            f"({', '.join(leftover[:5]) or 'weights changed'}); this is a bug in posmech.analyses.interventions"
        )


@contextlib.contextmanager
def _inference() -> Iterator[None]:
    import torch

    with torch.inference_mode():
        yield


def run_hooked(
    bridge: Any, tokens: np.ndarray, hooks: Sequence[Hook] = (), capture: Sequence[tuple[int, int]] = (),
    logits: bool = False,
) -> tuple[dict[tuple[int, int], np.ndarray], np.ndarray | None]:
    """One forward pass of ``tokens [T]`` (or of a batch ``[B, T]``) with ``hooks`` added
    (removed afterwards).

    Returns ``(patterns, logits)``: ``patterns[(l, h)]`` float64 ``[T, T]`` (``[B, T, T]``),
    the attention pattern of each head in ``capture`` *as used* (after any hook on its
    layer's ``hook_pattern``), and the final logits float64 ``[T, d_vocab]``
    (``[B, T, d_vocab]``) when ``logits``."""
    import torch

    toks = np.asarray(tokens, dtype=np.int64)
    one = toks.ndim == 1
    got: dict[tuple[int, int], np.ndarray] = {}
    grab = []
    for layer, head in capture:

        def fn(p: Any, hook: Any, layer: int = layer, head: int = head) -> None:
            got[(layer, head)] = p[:, head].detach().to("cpu", torch.float64).numpy()

        grab.append((f"blocks.{layer}.attn.hook_pattern", fn))
    x = torch.as_tensor(toks[None] if one else toks, device=bridge.cfg.device)
    with _inference(), bridge.hooks(fwd_hooks=[*hooks, *grab]):
        out = bridge(x, return_type="logits" if logits else None)  # None: may stop after the last hook
    lg = out.detach().to("cpu", torch.float64).numpy() if logits else None
    if one:
        got = {k: v[0] for k, v in got.items()}
        lg = None if lg is None else lg[0]
    return got, lg


#: documents of equal length run together, up to this many tokens per pass: a GPT-2
#: document of 1024 tokens runs alone (a batch costs more CPU per token there), the demo's
#: 32-character documents 32 at a time (one pass each would cost ~8 ms of Python overhead
#: for ~0.3 ms of arithmetic). Results equal single-document passes to float32 rounding.
BATCH_TOKENS = 1024


def hooked_passes(
    bridge: Any, docs: Sequence[np.ndarray], conditions: Callable[[int], dict[str, Sequence[Hook]]],
    capture: Sequence[tuple[int, int]], batch_tokens: int | None = None,
) -> Iterator[tuple[int, np.ndarray, dict[str, dict[tuple[int, int], np.ndarray]]]]:
    """For each document, in order: ``(j, doc, patterns)`` with ``patterns[cond][(l, h)]``
    ``[T, T]`` the captured patterns of one pass per condition, ``conditions(T)`` giving the
    hooks of each condition for documents of ``T`` tokens.  Consecutive documents of equal
    length share passes, up to ``batch_tokens`` tokens (default :data:`BATCH_TOKENS`);
    progress goes to the rule's log."""
    from posmech.core.progress import Progress

    budget = BATCH_TOKENS if batch_tokens is None else batch_tokens
    progress = Progress(len(docs))
    for s in equal_length_batches([len(d) for d in docs], lambda T: budget // T):
        batch = np.stack([np.asarray(d, dtype=np.int64) for d in docs[s]])
        got = {c: run_hooked(bridge, batch, hooks, capture)[0] for c, hooks in conditions(batch.shape[1]).items()}
        for b, j in enumerate(range(s.start, s.stop)):
            yield j, docs[j], {c: {lh: p[b] for lh, p in g.items()} for c, g in got.items()}
        progress.update(s.stop)
    progress.finish()


# --------------------------------------------------------------------------- P5
@dataclass
class Zoom:
    """A ``[n, n]`` window of a head's pattern at positions ``start..start+n`` per condition."""

    head: str
    start: int
    matrices: dict[str, np.ndarray] = field(default_factory=dict)
    marks: np.ndarray | None = None  # bool [n]: rows to mark (knocked-out / repeated queries)


def _mass_rows(mass: np.ndarray, sets: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    """Mean previous-token mass per query set; ``mass [T - 1]`` for queries 1..T-1."""
    out = []
    for name, sel in sets.items():
        s = sel[1:]
        out.append({"query_set": name, "n_queries": int(s.sum()),
                    "prev_mass": float(mass[s].mean()) if s.any() else float("nan")})
    return out


KNOCKOUT_CONDITIONS = ("intact", "knockout", "knockout_renormalised")
#: the conditions P5's claim reads (``prev_token_mass_ratio_knocked``, :func:`knockout_scorecard`):
#: all a random-init twin's null computes (:func:`posmech.core.null.only_claims`; config
#: ``twins.claims_only``)
CLAIMED_KNOCKOUT_CONDITIONS = ("intact", "knockout")


def prev_knockout(
    bridge: Any, docs: Iterable[np.ndarray], sharp: str, layers: Sequence[int], period: int, phase: int = 0,
    zoom: int = 50, zoom_start: int = 0, conditions: Sequence[str] = KNOCKOUT_CONDITIONS,
) -> tuple[list[dict[str, Any]], Zoom]:
    """P5: knock out attention to the previous position at queries ``q % period == phase``
    in every head of ``layers``; measure ``sharp``'s previous-token mass.

    Rows: one per (document, condition ∈ ``conditions`` (default every one: intact, knockout,
    knockout_renormalised), query_set ∈ {all, knocked, other}) with ``document, condition,
    query_set, n_queries, prev_mass``; one forward pass per document and condition.  The zoom
    shows the first document's window for every condition."""
    unknown = sorted(set(conditions) - set(KNOCKOUT_CONDITIONS))
    if unknown or "intact" not in conditions:
        raise PosmechError(f"prev_knockout: conditions {list(conditions)} must include 'intact' and be among "
                           f"{list(KNOCKOUT_CONDITIONS)} (workflow bug)")
    lh = check_head(bridge, sharp)
    for layer in layers:
        if not 0 <= int(layer) < bridge.cfg.n_layers:
            raise PosmechError(f"knock-out layer {layer} does not exist (model has {bridge.cfg.n_layers} layers)")
    rows: list[dict[str, Any]] = []
    z = Zoom(sharp, zoom_start)

    def hooks(T: int) -> dict[str, list[Hook]]:
        ko = knockout_rows(T, period, phase)
        every = {"intact": lambda: [], "knockout": lambda: knockout_hooks(layers, ko, renormalise=False),
                 "knockout_renormalised": lambda: knockout_hooks(layers, ko, renormalise=True)}
        return {c: every[c]() for c in KNOCKOUT_CONDITIONS if c in conditions}

    for j, doc, by_condition in hooked_passes(bridge, list(docs), hooks, [lh]):
        T = len(doc)
        ko = knockout_rows(T, period, phase)
        sets = {"all": np.arange(T) >= 1, "knocked": ko, "other": (np.arange(T) >= 1) & ~ko}
        for cond, pats in by_condition.items():
            for r in _mass_rows(prev_token_mass(pats[lh]), sets):
                rows.append({"document": j, "n_tokens": T, "condition": cond, **r})
            if j == 0:
                z.matrices[cond] = window_block(pats[lh], zoom_start, zoom)
                z.marks = ko[zoom_start : zoom_start + zoom]
    return rows, z


# --------------------------------------------------------------------------- P15
def extended_averaging(
    bridge: Any, docs: Iterable[np.ndarray], heads: Sequence[str], deltas: dict[int, np.ndarray],
    zoom: int = 50, zoom_start: int = 0,
) -> tuple[list[dict[str, Any]], list[Zoom]]:
    """P15: for each layer ``l`` in ``deltas`` add ``deltas[l]`` (see :func:`extended_shift`)
    at ``blocks.l.hook_resid_pre``; measure every head of ``heads`` at or after ``l``.

    Rows: one per (document, head, averaged_layer, condition ∈ {intact, averaged}) with
    ``layer, head`` (of the head measured), ``head_name, averaged_layer, condition, n_queries, prev_mass`` (queries 1..T-1).
    Zooms: per head, the first document's window intact and averaged just before the
    head's own layer (``averaged_L{l}``) when that layer is in ``deltas``."""
    parsed = {h: check_head(bridge, h) for h in heads}
    capture = list(dict.fromkeys(parsed.values()))
    zooms = {h: Zoom(h, zoom_start) for h in heads}
    rows: list[dict[str, Any]] = []

    def conditions(T: int) -> dict[Any, list[Hook]]:
        for delta in deltas.values():
            if delta.shape[0] < T:
                raise PosmechError(f"extended embeddings cover {delta.shape[0]} positions, the document has {T}")
        return {"intact": [], **{layer: [residual_shift_hook(layer, delta)] for layer, delta in deltas.items()}}

    for j, doc, by_condition in hooked_passes(bridge, list(docs), conditions, capture):
        T = len(doc)
        base = by_condition["intact"]
        masses = {h: prev_token_mass(base[parsed[h]]) for h in heads}
        for h in heads:
            if j == 0:
                zooms[h].matrices["intact"] = window_block(base[parsed[h]], zoom_start, zoom)
        for layer in deltas:
            pats = by_condition[layer]
            for h in heads:
                hl = parsed[h][0]
                if hl < layer:
                    continue
                after = prev_token_mass(pats[parsed[h]])
                for cond, m in (("intact", masses[h]), ("averaged", after)):
                    rows.append({"document": j, "n_tokens": T, "layer": hl, "head": parsed[h][1], "head_name": h,
                                 "averaged_layer": layer,
                                 "condition": cond, "n_queries": T - 1, "prev_mass": float(m.mean())})
                if j == 0 and hl == layer:
                    zooms[h].matrices[f"averaged_L{layer}"] = window_block(pats[parsed[h]], zoom_start, zoom)
    return rows, [zooms[h] for h in heads]


# --------------------------------------------------------------------------- P14
def repeated_tokens(
    bridge: Any, docs: Iterable[np.ndarray], sharp: str, zoom: int = 50, context: int = 10,
) -> tuple[list[dict[str, Any]], Zoom | None]:
    """P14: ``sharp``'s previous-token mass at queries whose previous token is the same
    token (``repeat``) vs all other queries ``q >= 1`` (``other``).

    Rows: one per (document, query_set) with ``n_queries, prev_mass, self_mass`` (mean
    attention to the query's own position).  Zoom: a window starting ``context`` positions
    before the first repeat of the first document that has one (rows with a repeat marked)."""
    lh = check_head(bridge, sharp)
    rows: list[dict[str, Any]] = []
    z: Zoom | None = None
    for j, doc, by_condition in hooked_passes(bridge, list(docs), lambda T: {"intact": []}, [lh]):
        T = len(doc)
        rep = repeat_queries(doc)
        P = by_condition["intact"][lh]
        mass, selfm = prev_token_mass(P), np.diagonal(P)[1:]
        for name, sel in (("repeat", rep), ("other", (np.arange(T) >= 1) & ~rep)):
            s = sel[1:]
            rows.append({
                "document": j, "n_tokens": T, "query_set": name, "n_queries": int(s.sum()),
                "prev_mass": float(mass[s].mean()) if s.any() else float("nan"),
                "self_mass": float(selfm[s].mean()) if s.any() else float("nan"),
            })
        if z is None and rep.any():
            start = max(0, min(int(np.flatnonzero(rep)[0]) - context, T - zoom))
            z = Zoom(sharp, start, {"intact": window_block(P, start, zoom)}, rep[start : start + zoom])
    return rows, z


# --------------------------------------------------------------------------- P16
@dataclass
class InductionPrompt:
    """A repeat prompt tokenized for one model.

    ``tokens [T]`` (BOS first when prepended); ``positions[word] = (first, last)`` token
    indices of each word of the repeated triple's first occurrence; ``redirects`` query →
    key positions; ``targets[name]`` the continuation token sequences summed for that name."""

    tokens: np.ndarray
    positions: dict[str, tuple[int, int]]
    redirects: dict[int, int]
    targets: dict[str, list[tuple[int, ...]]]
    dropped: dict[str, list[str]]
    spec: dict[str, Any]


INDUCTION_FORMAT = "format in resources/prompts/induction_ninja.yaml"


def induction_spec_problems(spec: Any) -> list[str]:
    """What is wrong with the content of an induction prompt file (before any tokenizer):
    a mapping with ``prompt`` (text), ``words`` (``a``, ``b``, ``c``: non-empty strings whose
    concatenation occurs in the prompt), ``redirect`` (a list of ``{query, key}``) and
    ``targets`` (name → non-empty list of strings).  Empty list: nothing wrong."""
    if spec is None:
        return [f"the file is empty ({INDUCTION_FORMAT})"]
    if not isinstance(spec, dict):
        return [f"expected a mapping with keys prompt, words, redirect, targets, found a {type(spec).__name__} "
                f"({INDUCTION_FORMAT})"]
    out = [f"missing key `{k}` ({INDUCTION_FORMAT})" for k in ("prompt", "words", "redirect", "targets")
           if k not in spec]
    text, words = spec.get("prompt"), spec.get("words")
    if "prompt" in spec and (not isinstance(text, str) or not text):
        out.append("`prompt` must be a non-empty string")
    if "words" in spec:
        if not isinstance(words, dict) or any(not isinstance(words.get(w), str) or not words.get(w) for w in "abc"):
            out.append(f"`words` must map a, b and c to non-empty strings (found {words!r})")
        elif isinstance(text, str) and text:
            triple = "".join(words[w] for w in "abc")
            if triple not in text:
                out.append(f"the prompt {text!r} does not contain `words` a+b+c = {triple!r}")
    red = spec.get("redirect")
    if "redirect" in spec and (not isinstance(red, list) or not all(isinstance(r, dict) for r in red)):
        out.append("`redirect` must be a list of {query: ..., key: ...} mappings")
    tg = spec.get("targets")
    if "targets" in spec and (not isinstance(tg, dict) or not tg or not all(
            isinstance(v, list) and v and all(isinstance(x, str) for x in v) for v in tg.values())):
        out.append("`targets` must map each target name to a non-empty list of strings")
    return out


def build_induction_prompt(
    spec: dict[str, Any], tokenizer: Any, bos_id: int | None, n_ctx: int, where: str = "induction prompt file",
) -> InductionPrompt:
    """Tokenize a prompt file's content (see ``resources/prompts/induction_ninja.yaml``).

    The triple ``words.a + words.b + words.c`` is located (first occurrence) in
    ``spec['prompt']``; each redirect ``{query: x, key: y}`` sends the sharp head's row at
    the *first* token of word ``x`` to the *last* token of word ``y`` (``y`` may be
    ``before_a``: the token just before word ``a``); the key must precede the query.  Every variant of a
    target is tokenized on its own; variants whose token sequence extends another's are
    dropped (recorded in ``dropped``), so the summed probabilities are of disjoint events."""
    problems = induction_spec_problems(spec)
    if problems:
        raise PosmechError(f"{where}: " + "; ".join(problems))
    text, words = spec["prompt"], spec["words"]
    triple = "".join(words[w] for w in ("a", "b", "c"))
    at = text.find(triple)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), list(enc["offset_mapping"])
    shift = 0
    if bos_id is not None:
        ids, shift = [int(bos_id), *ids], 1
    positions, start = {}, at
    for w in ("a", "b", "c"):
        try:
            first, last = token_span(offsets, start, start + len(words[w]))
        except PosmechError as err:
            raise PosmechError(f"{where}: word {words[w]!r}: {err} (characters unknown to the tokenizer?)") from None
        positions[w] = (first + shift, last + shift)
        start += len(words[w])
    positions["before_a"] = (positions["a"][0] - 1, positions["a"][0] - 1)
    redirects = {}
    for r in spec["redirect"]:
        if r.get("query") not in ("a", "b", "c") or r.get("key") not in positions:
            raise PosmechError(
                f"{where}: redirect {r!r} needs `query` in a, b, c and `key` in a, b, c, before_a"
            )
        q, k = positions[r["query"]][0], positions[r["key"]][1]
        if not 0 <= k < q:
            raise PosmechError(
                f"{where}: redirect {r!r} sends query {q} to key {k}; a head can only attend "
                "to earlier positions (choose a key word before the query word)"
            )
        redirects[q] = k
    targets, dropped = {}, {}
    longest = 0
    for name, variants in spec["targets"].items():
        seqs = [list(tokenizer(v, add_special_tokens=False)["input_ids"]) for v in variants]
        keep = minimal_sequences(seqs)
        targets[name] = keep
        dropped[name] = [v for v, s in zip(variants, seqs) if tuple(s) not in keep]
        longest = max([longest, *(len(s) for s in keep)])
    if len(ids) + longest - 1 > n_ctx:
        raise PosmechError(
            f"{where}: the prompt is {len(ids)} tokens (+{longest - 1} continuation) but the model's context "
            f"is {n_ctx}; choose a shorter prompt file (`interventions.induction_intervention.prompt`, "
            "e.g. resources/prompts/induction_short.yaml)"
        )
    return InductionPrompt(np.asarray(ids, dtype=np.int64), positions, redirects, targets, dropped, spec)


INDUCTION_CONDITIONS = ("baseline", "redirect", "scale", "redirect_scale")
#: the conditions P16's claim reads (``p_redirected_after``, :func:`induction_scorecard`): all a
#: random-init twin's null computes (:func:`posmech.core.null.only_claims`; config
#: ``twins.claims_only``)
CLAIMED_CONDITIONS = ("redirect_scale",)


def induction_intervention(
    bridge: Any, prompt: InductionPrompt, sharp: str, scale: float,
    conditions: Sequence[str] = INDUCTION_CONDITIONS,
) -> tuple[list[dict[str, Any]], dict[str, np.ndarray]]:
    """P16: probabilities of each target under four conditions: ``baseline``, ``redirect``
    (sharp head's rows redirected), ``scale`` (its output × ``scale``) and ``redirect_scale``
    (both: the post's intervention).

    Rows: one per (condition, target) with ``probability``.  Also returns the sharp head's
    pattern (``[T, T]``, as used) at baseline and redirected, for the figure.  Each condition
    is one batched teacher-forced pass over every target's variants
    (:func:`posmech.analyses.readout.target_probabilities`); the patterns are read in the same
    passes (prompt positions, first row). ``conditions``: those computed, in
    :data:`INDUCTION_CONDITIONS`' order (a twin's null: :data:`CLAIMED_CONDITIONS`); the
    patterns returned are those of the computed ones."""
    from posmech.analyses.readout import target_probabilities

    unknown = [c for c in conditions if c not in INDUCTION_CONDITIONS]
    if unknown or not conditions:
        raise PosmechError(f"induction_intervention: conditions {list(conditions)} must be some of "
                           f"{list(INDUCTION_CONDITIONS)} (workflow bug)")

    layer, head = check_head(bridge, sharp)
    red = redirect_hook(layer, head, prompt.redirects)
    sc = scale_head_hook(layer, head, scale)
    hooks = {"baseline": [], "redirect": [red], "scale": [sc], "redirect_scale": [red, sc]}
    n = len(prompt.tokens)
    patterns: dict[str, np.ndarray] = {}

    def grab(cond: str) -> list[Hook]:
        import torch

        def fn(p: Any, hook: Any) -> None:
            if cond not in patterns:  # the first pass's first row (every row holds the prompt)
                patterns[cond] = p[0, head, :n, :n].detach().to("cpu", torch.float64).numpy()

        return [(f"blocks.{layer}.attn.hook_pattern", fn)] if cond in ("baseline", "redirect") else []

    rows = []
    for cond in (c for c in INDUCTION_CONDITIONS if c in conditions):
        probs, _, _ = target_probabilities(bridge, prompt.tokens, prompt.targets, [*hooks[cond], *grab(cond)])
        rows += [{"condition": cond, "target": name, "probability": probs[name]} for name in prompt.targets]
    return rows, {c: patterns[c] for c in ("baseline", "redirect") if c in patterns}


# --------------------------------------------------------------------------- tables
def select_documents(toks: Any, n_documents: int, min_tokens: int, max_tokens: int | None) -> list[np.ndarray]:
    """The first ``n_documents`` documents of a token set (``posmech.data.tokens.TokenSet``) with at
    least ``min_tokens`` tokens, each cut to ``max_tokens`` (``None``: as stored)."""
    out = []
    for j in range(toks.n_documents):
        d = toks.doc(j)
        if len(d) >= min_tokens:
            out.append(np.asarray(d[:max_tokens] if max_tokens else d, dtype=np.int64))
        if len(out) == n_documents:
            break
    if not out:
        raise PosmechError(
            f"no document of the corpus has at least {min_tokens} tokens; lower `interventions.min_tokens`"
        )
    if len(out) < n_documents:
        LOG.warning("only %d documents with >= %d tokens (asked for %d)", len(out), min_tokens, n_documents)
    return out


def knockout_layers(layers: Sequence[int] | None, sharp: str) -> list[int]:
    """The configured knock-out layers, or (``None``) every layer before the sharp head's."""
    return sorted(int(x) for x in layers) if layers is not None else list(range(parse_head(sharp)[0]))


def tidy(rows: list[dict[str, Any]], claim: str, model: str, params: dict[str, Any]) -> Any:
    """A tidy frame: ``claim``, ``model``, the rows' columns, then every parameter as a
    column (lists joined with ``;``)."""
    import pandas as pd

    df = pd.DataFrame(rows)
    df.insert(0, "model", model)
    df.insert(0, "claim", claim)
    for k, v in params.items():
        df[k] = ";".join(map(str, v)) if isinstance(v, (list, tuple)) else v
    return df


def pooled(df: Any, by: list[str]) -> Any:
    """Previous-token mass pooled over documents (weighted by ``n_queries``), per ``by``."""
    d = df[df["n_queries"] > 0].dropna(subset=["prev_mass"])
    w = d["prev_mass"] * d["n_queries"]
    g = w.groupby([d[c] for c in by]).sum() / d.groupby(by)["n_queries"].sum()
    return g


#: a knock-out that moves the sharp head's pooled previous-token mass (all queries) by less
#: than this is called "no effect" in the P5 figure's title and scorecard rows (a choice: the
#: post's "strongly disrupted" is far beyond it)
NO_EFFECT = 0.02


def layers_words(layers: list[int]) -> str:
    """``"layer 0"`` or ``"layers 0–3"``."""
    return f"layers {layers[0]}–{layers[-1]}" if len(layers) > 1 else f"layer {layers[0]}"


def queries_words(period: int, phase: int = 0) -> str:
    """``"every query"``, ``"every 5th query (q % 5 == 0)"``: the queries a knock-out touches."""
    if period == 1:
        return "every query"
    suffix = "th" if period % 100 in (11, 12, 13) else {1: "st", 2: "nd", 3: "rd"}.get(period % 10, "th")
    nth = f"{period}{suffix}"
    return f"every {nth} query (q % {period} == {phase})"


def knockout_verdict(intact: float, knockout: float, head: str, layers: list[int]) -> str | None:
    """P5 in words when the knock-out moves ``head``'s pooled previous-token mass by less
    than :data:`NO_EFFECT` (``None`` otherwise): the head does not rely on the knocked-out
    layers' attention to the previous position.  The figure and the scorecard both use it."""
    change = knockout - intact
    if not abs(change) < NO_EFFECT:
        return None
    return (f"no effect (prev-token mass {change:+.3f}): {head} does not rely on {layers_words(layers)}'s "
            "attention to the previous position")


def knockout_scorecard(df: Any, model: str, artifact: str) -> list[dict[str, Any]]:
    """P5 scorecard rows: pooled masses and the after/before ratio (all queries), with
    :func:`knockout_verdict`'s words when the knock-out has no effect; with no layer to knock
    out (sharp head in layer 0) the ratios are left empty with the reason.  The details say
    what this run used: the head, the layers knocked out, which queries (``period``,
    ``phase``) and over how many documents."""
    m = pooled(df, ["condition", "query_set"])
    head = df["head_name"].iloc[0]
    docs = f"{df['document'].nunique()} document(s)" if "document" in df else "the documents"
    computed = set(df["condition"])
    # a twin's null computes only the conditions P5's claim reads (config twins.claims_only): the others' rows say so
    skipped = ("not computed: a random-init twin's null computes only the conditions P5's claim reads "
               f"({', '.join(CLAIMED_KNOCKOUT_CONDITIONS)}; config twins.claims_only)")
    rows = [{"claim": "P5", "model": model, "quantity": f"prev_token_mass_{c}",
             **({"value": float(m[(c, "all")]), "detail": f"{head}, all queries >= 1 of {docs}"} if c in computed
                else {"value": None, "detail": skipped}), "artifact": artifact}
            for c in KNOCKOUT_CONDITIONS]
    layers = df["layers"].iloc[0]
    if layers is None or (isinstance(layers, float) and np.isnan(layers)) or str(layers) == "":
        why = (f"nothing to knock out: the sharp head {head} is in layer 0, so no earlier layer can carry "
               "the previous position")
        return rows + [{"claim": "P5", "model": model, "quantity": q, "value": None, "detail": why, "artifact": artifact}
                       for q in ("prev_token_mass_ratio", "prev_token_mass_ratio_renormalised",
                                 "prev_token_mass_ratio_knocked")]
    knocked = [int(x) for x in str(layers).split(";")]
    where = f"{layers_words(knocked)}, {queries_words(int(df['period'].iloc[0]), int(df['phase'].iloc[0]))}"
    for c, q in (("knockout", "prev_token_mass_ratio"), ("knockout_renormalised", "prev_token_mass_ratio_renormalised")):
        if c not in computed:
            rows.append({"claim": "P5", "model": model, "quantity": q, "value": None, "detail": skipped,
                         "artifact": artifact})
            continue
        verdict = knockout_verdict(float(m[("intact", "all")]), float(m[(c, "all")]), head, knocked)
        rows.append({"claim": "P5", "model": model, "quantity": q, "value": float(m[(c, "all")] / m[("intact", "all")]),
                     "detail": (f"{verdict}; " if verdict else "") + f"{head}: {c} / intact, all queries of {docs}; "
                               f"knocked-only {m[(c, 'knocked')]:.3f} vs {m[('intact', 'knocked')]:.3f}; knocked out: {where}",
                     "artifact": artifact})
    # the finding's quantity: only the queries whose previous position was knocked out (every
    # period-th), where the post's disruption happens; over all queries most are untouched
    rows.append({"claim": "P5", "model": model, "quantity": "prev_token_mass_ratio_knocked",
                 "value": float(m[("knockout", "knocked")] / m[("intact", "knocked")]),
                 "detail": f"{head}: knockout / intact at the knocked-out queries only, {docs}; knocked out: {where}",
                 "artifact": artifact})
    return rows


def damage(df: Any) -> dict[str, float]:
    """P15: relative loss ``(intact − averaged) / intact`` of each head's pooled mass when
    the layer averaged is the head's own."""
    own = df[df["averaged_layer"] == df["layer"]]
    m = pooled(own, ["head_name", "condition"])
    return {h: float((m[(h, "intact")] - m[(h, "averaged")]) / m[(h, "intact")]) for h in own["head_name"].unique()}


def extended_scorecard(df: Any, model: str, artifact: str) -> list[dict[str, Any]]:
    m = pooled(df[df["averaged_layer"] == df["layer"]], ["head_name", "condition"])
    return [{"claim": "P15", "model": model, "quantity": f"damage_{h}", "value": v,
             "detail": f"{h} prev-token mass {m[(h, 'intact')]:.3f} -> {m[(h, 'averaged')]:.3f} "
                       f"(role {df.loc[df['head_name'] == h, 'role'].iloc[0]})", "artifact": artifact}
            for h, v in damage(df).items()] + [damage_gap_row(df, model, artifact)]


def damage_gap_row(df: Any, model: str, artifact: str) -> dict[str, Any]:
    """P15's finding row ``early_minus_sharp_damage``: the mean relative damage
    (:func:`damage`) of the early heads in a layer below the sharp head's, minus the sharp
    head's; no value, and why, without such an early head."""
    row = {"claim": "P15", "model": model, "quantity": "early_minus_sharp_damage", "artifact": artifact}
    d = damage(df)
    first = df.groupby("head_name")[["role", "layer"]].first()
    sharp = [h for h in first.index if first.loc[h, "role"] == "sharp" and h in d]
    if not sharp:
        return {**row, "value": None, "detail": "no sharp head was averaged at its own layer"}
    s = sharp[0]
    early = [h for h in first.index if first.loc[h, "role"] == "early" and h in d
             and int(first.loc[h, "layer"]) < int(first.loc[s, "layer"])]
    if not early:
        return {**row, "value": None, "detail": f"no early previous-token head in a layer below the sharp head {s}"}
    mean_early = float(np.mean([d[h] for h in early]))
    return {**row, "value": mean_early - d[s],
            "detail": f"mean damage of {', '.join(early)} {mean_early:.3f} minus {s}'s {d[s]:.3f}"}


def repeated_scorecard(df: Any, model: str, artifact: str) -> list[dict[str, Any]]:
    m = pooled(df, ["query_set"])
    n = df.groupby("query_set")["n_queries"].sum()
    rep, oth = float(m.get("repeat", np.nan)), float(m.get("other", np.nan))
    head = df["head_name"].iloc[0]
    return [
        {"claim": "P14", "model": model, "quantity": "prev_token_mass_repeat", "value": rep,
         "detail": f"{head}, {int(n.get('repeat', 0))} repeated queries", "artifact": artifact},
        {"claim": "P14", "model": model, "quantity": "prev_token_mass_other", "value": oth,
         "detail": f"{head}, {int(n.get('other', 0))} other queries", "artifact": artifact},
        {"claim": "P14", "model": model, "quantity": "repeat_token_blip", "value": oth - rep,
         "detail": f"{head}: previous-token mass on the {int(n.get('other', 0))} other queries minus on the "
                   f"{int(n.get('repeat', 0))} repeated ones", "artifact": artifact},
    ]


def induction_scorecard(df: Any, model: str, artifact: str, redirected: str | None = None) -> list[dict[str, Any]]:
    """P16 rows: every target's probability per condition, and ``p_redirected_after``, the
    probability of ``redirected`` (the target named after the prompt's word c) after the
    intervention (no value when no target has that name)."""
    out = []
    head = df["head_name"].iloc[0]
    for cond, suffix in (("baseline", "baseline"), ("redirect_scale", "after"), ("redirect", "redirect_only")):
        for _, r in df[df["condition"] == cond].iterrows():
            out.append({"claim": "P16", "model": model, "quantity": f"p_{r['target']}_{suffix}",
                        "value": float(r["probability"]),
                        "detail": f"{head}, {cond}, variants summed", "artifact": artifact})
    after = df[(df["condition"] == "redirect_scale") & (df["target"] == redirected)]
    out.append({"claim": "P16", "model": model, "quantity": "p_redirected_after",
                "value": float(after["probability"].iloc[0]) if len(after) else None,
                "detail": f"{head}: P({redirected}) after redirecting and scaling its output" if len(after)
                else f"the prompt has no target named {redirected!r} (after its word c)", "artifact": artifact})
    return out


def table_meta(man: dict[str, Any], entry: dict[str, Any], settings: InterventionsSettings,
               heads: dict[str, list[str]], **extra: Any) -> dict[str, Any]:
    """Metadata lines of an intervention table: model provenance, chosen heads, the
    ``interventions`` section as ``settings`` gives it (corpus as configured, null too)."""
    from posmech.core.config import config_hash

    cfg = settings.as_dict()
    return {"model_source": man.get("source"), "resolved_revision": man.get("resolved_revision"),
            "processing": entry["processing"], "chosen_heads": heads, "interventions_config": cfg,
            "config_hash": config_hash({"model": entry, "interventions": cfg}), **extra}
