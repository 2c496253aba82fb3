"""The posembed rules' library (``posembed_averaging``, ``posembed_attention``; docs/workflow.md,
"Families"): interventions on positional embeddings (P2–P4), group averaging of ``W_pos`` rows.

:func:`group_average` replaces each contiguous group of ``k`` rows (positions) by the
group's mean; :func:`averaged_W_pos` swaps a bridge's positional embedding matrix for
its group-averaged version inside a ``with`` block and restores the original bitwise on
exit (also when the block raises).  Both are used by the positional-embedding rules and
by other interventions (e.g. averaging the residual stream's positional component).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from posmech.analyses.attention import check_head, head_columns, mean_prev_token_mass, window
from posmech.core.errors import PosmechError, mean_over
from posmech.core.progress import logged
from posmech.store.tables import claim_columns

ArrayT = TypeVar("ArrayT")


def check_group_size(k: Any, key: str = "k") -> int:
    """``k`` as a positive int, else :class:`PosmechError` naming ``key``."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise PosmechError(f"{key}: group size must be a positive integer, got {k!r}")
    return int(k)


def group_average(x: ArrayT, k: int, dim: int = 0) -> ArrayT:
    """Average ``x`` along ``dim`` in contiguous groups of ``k`` (``[g·k, (g+1)·k)``).

    ``x``: numpy array or torch tensor, e.g. ``W_pos [n, d]`` (``dim=0``) or a residual
    stream ``[batch, pos, d]`` (``dim=1``).  Returns the same type and shape; every
    position of a group holds the group's mean.  When ``n`` is not a multiple of ``k``
    the last group is the remaining ``n mod k`` positions.  ``k = 1`` returns an exact
    copy (bitwise equal); ``k >= n`` averages everything into one group.
    """
    k = check_group_size(k)
    if isinstance(x, np.ndarray):
        if k == 1 or x.shape[dim] == 0:
            return x.copy()
        xt = np.moveaxis(x, dim, 0)
        group = np.arange(xt.shape[0]) // k  # group of each position
        sums = np.zeros((group[-1] + 1, *xt.shape[1:]), dtype=np.float64)
        np.add.at(sums, group, xt)
        means = (sums / np.bincount(group).reshape(-1, *([1] * (xt.ndim - 1)))).astype(x.dtype)
        return np.ascontiguousarray(np.moveaxis(means[group], 0, dim))
    import torch

    if k == 1 or x.shape[dim] == 0:  # type: ignore[attr-defined]
        return x.clone()  # type: ignore[attr-defined,no-any-return]
    xt = x.movedim(dim, 0)  # type: ignore[attr-defined]
    n, rest = xt.shape[0], tuple(xt.shape[1:])
    full = (n // k) * k
    pieces = []
    if full:
        g = xt[:full].reshape(n // k, k, *rest).mean(1, keepdim=True)
        pieces.append(g.expand(n // k, k, *rest).reshape(full, *rest))
    if full < n:
        pieces.append(xt[full:].mean(0, keepdim=True).expand(n - full, *rest))
    return torch.cat(pieces, 0).movedim(0, dim).contiguous()  # type: ignore[no-any-return]


@contextlib.contextmanager
def swapped_parameter(param: Any, value: Any) -> Iterator[Any]:
    """Copy ``value`` into the live tensor ``param`` for the block; restore it bitwise after."""
    import torch

    saved = param.detach().clone()
    try:
        with torch.no_grad():
            param.copy_(value)
        yield param
    finally:
        with torch.no_grad():
            param.copy_(saved)


@contextlib.contextmanager
def averaged_W_pos(bridge: Any, k: int) -> Iterator[Any]:
    """Run the block with ``bridge.W_pos`` averaged in contiguous groups of ``k`` rows.

    The live parameter is overwritten in place (so every forward pass in the block sees
    it) and restored bitwise on exit, also on error.  Yields the bridge.  ``k = 1`` leaves
    every forward pass bitwise unchanged.
    """
    k = check_group_size(k)
    try:
        W = bridge.W_pos
    except AttributeError as err:
        raise PosmechError(
            f"the model has no learned absolute positional embedding matrix W_pos ({err}); "
            "leave it out of the `models` list of the W_pos-averaging rules"
        ) from None
    with swapped_parameter(W, group_average(W.detach(), k, dim=0)):
        yield bridge


# --------------------------------------------------------------------------- P2, P3
def next_token_loss(bridge: Any, documents: list[np.ndarray]) -> tuple[float, int]:
    """Summed next-token cross-entropy (nats, float64) over every predicted position of
    ``documents`` (token-id arrays, one forward pass each) and the number of predictions.
    The log-softmax is taken a chunk of positions at a time
    (:func:`posmech.analyses.readout.next_token_logprobs`), so memory does not grow with
    ``n x d_vocab``."""
    from posmech.analyses.readout import next_token_logprobs, unembedding_rows

    total, count = 0.0, 0
    W_U_T = unembedding_rows(bridge)
    for doc in logged(documents, what="documents (next-token loss)"):
        if len(doc) < 2:
            continue
        total -= float(next_token_logprobs(bridge, doc, W_U_T=W_U_T).double().sum())
        count += len(doc) - 1
    return total, count


def posembed_averaging(
    bridge: Any, ks: list[int], documents: list[np.ndarray], prompts: list[Any], prepend_bos: bool,
) -> pd.DataFrame:
    """P2/P3: for each ``k``, with ``W_pos`` averaged in groups of ``k`` (restored after
    each), the mean next-token loss on ``documents`` and each prompt target's probability.

    Returns tidy rows: ``k, quantity`` (``loss`` | ``probability``), ``prompt``,
    ``target``, ``value``, ``n_predictions`` (loss) / ``n_prompt_tokens``,
    ``prompt_truncated``, ``top_token``, ``top_token_probability`` (probability rows).
    """
    from posmech.analyses.readout import target_probabilities
    from posmech.data.prompts import prompt_token_ids, variant_token_ids

    tok = bridge.tokenizer
    n_ctx = bridge.cfg.n_ctx
    prepared = []
    for p in prompts:
        variants = {name: variant_token_ids(tok, vs) for name, vs in p.targets.items()}
        longest = max(len(v) for vs in variants.values() for v in vs)
        ids, truncated = prompt_token_ids(tok, p.text, prepend_bos, n_ctx - (longest - 1))
        prepared.append((p, variants, ids, truncated))
    rows: list[dict[str, Any]] = []
    for k in ks:
        with averaged_W_pos(bridge, k):
            total, count = next_token_loss(bridge, documents)
            loss = mean_over(total, count, "the next-token loss of `posembed_averaging`: its documents have no "
                             "token to predict (all empty or a single token); use a `posembed_averaging.corpus` "
                             "with non-empty documents")
            rows.append({"k": k, "quantity": "loss", "prompt": "", "target": "", "value": loss,
                         "n_predictions": count})
            for p, variants, ids, truncated in prepared:
                probs, top, top_p = target_probabilities(bridge, ids, variants)
                for name, value in probs.items():
                    rows.append({
                        "k": k, "quantity": "probability", "prompt": p.id, "target": name, "value": value,
                        "n_prompt_tokens": len(ids), "prompt_truncated": truncated, "top_token": tok.decode([top]),
                        "top_token_probability": top_p,
                    })
    return pd.DataFrame(rows)


def max_unchanged_k(df: pd.DataFrame, loss_tolerance: float, probability_tolerance: float) -> int:
    """Largest ``k`` such that for every ``k' <= k`` the loss differs from the ``k = 1`` loss by
    at most ``loss_tolerance`` nats *either way* (|loss(k') − loss(1)| ≤ tolerance: a large drop
    is a change as much as a rise — "output essentially unchanged") and every prompt target
    probability moves by at most ``probability_tolerance`` (absolute) from ``k = 1``.  ``df``
    from :func:`posembed_averaging`."""
    base = df[df["k"] == 1].set_index(["quantity", "prompt", "target"])["value"]
    if base.empty:
        raise PosmechError("posembed_averaging: the k grid must contain 1 (the intact model)")
    best = 1
    for k in sorted(df["k"].unique()):
        cur = df[df["k"] == k].set_index(["quantity", "prompt", "target"])["value"]
        diff = cur - base
        loss_ok = bool((diff.xs("loss", level="quantity").abs() <= loss_tolerance).all())
        probs = diff.drop("loss", level="quantity", errors="ignore")
        if not (loss_ok and bool((probs.abs() <= probability_tolerance).all())):
            break
        best = int(k)
    return best


#: the group size of the post's P3/P4/P15 interventions (k = 10)
POST_K = 10


def repeat_min_row(df: pd.DataFrame, targets: dict[str, str], model: str, artifact: str,
                   k_post: int = POST_K) -> dict[str, Any]:
    """P3's finding row ``p_repeat_min_k10``: the smallest probability of the repeated word
    (``targets``: prompt id → its expected target) over the prompts, intact (k = 1) and with
    ``W_pos`` averaged at ``k_post`` or, when the grid lacks it, the largest grid k in
    ``2..k_post``; no value (and why) when there is none."""
    ks = sorted(int(k) for k in df["k"].unique() if 1 < int(k) <= k_post)
    row = {"claim": "P3", "model": model, "quantity": f"p_repeat_min_k{k_post}", "artifact": artifact}
    if not ks or not targets:
        why = "no group size 2..%d in posembed_averaging.ks" % k_post if not ks else "no repeat prompt"
        return {**row, "value": None, "detail": why}
    k = ks[-1]
    probs = df[(df["quantity"] == "probability") & df["k"].isin([1, k])]
    sel = probs[[targets.get(p) == t for p, t in zip(probs["prompt"], probs["target"])]]
    lowest = sel.loc[sel["value"].idxmin()]
    return {**row, "value": float(lowest["value"]),
            "detail": f"smallest over {len(targets)} prompt(s) and k in (1, {k}) of P(repeated word): "
                      f"{lowest['prompt']} at k = {int(lowest['k'])}"}


def averaging_table(df: pd.DataFrame, model: str) -> pd.DataFrame:
    """P2/P3's table from :func:`posembed_averaging`'s rows, in place: the columns ``claim``
    (``P2`` for the held-out loss rows, ``P2,P3`` for the prompt probabilities, which both
    read) and ``model`` put in front; returns ``df``."""
    return claim_columns(df, df["quantity"].map({"loss": "P2"}).fillna("P2,P3"), model)


def averaging_scorecard(df: pd.DataFrame, best: int, targets: dict[str, str], loss_tolerance: float,
                        probability_tolerance: float, model: str, figure: str, artifact: str) -> list[dict[str, Any]]:
    """P2 and P3 rows of rule posembed_averaging from its table ``df`` (``quantity``, ``k``,
    ``prompt``, ``target``, ``value``) and ``targets`` (prompt id → its repeated word, the
    expected continuation), in the prompts' order:

    * P2 ``max_unchanged_k`` — ``best`` (:func:`max_unchanged_k`): the largest group size k
      whose W_pos averaging keeps the held-out loss within ``loss_tolerance`` nats (either way) and the
      prompt probabilities within ``probability_tolerance`` of the intact model;
    * P3 ``p_<word>_intact`` and ``p_<word>_k10`` — per prompt, the probability of its
      repeated word, intact (k = 1) and with W_pos averaged in groups of 10; when the grid
      lacks k = 10, the ``p_<word>_k10`` row has no value and says so in its detail (the
      scorecard's reason);
    * P3 ``p_repeat_min_k10`` — :func:`repeat_min_row`."""
    rows = [{"claim": "P2", "quantity": "max_unchanged_k", "value": best, "artifact": figure,
             "detail": f"loss within {loss_tolerance} nats either way and probabilities within {probability_tolerance}"}]
    grid = sorted(int(k) for k in df["k"].unique())
    for prompt, target in targets.items():
        for k in (1, POST_K):
            quantity = f"p_{target}_{'intact' if k == 1 else f'k{k}'}"
            hit = df[(df["k"] == k) & (df["prompt"] == prompt) & (df["target"] == target)]
            if len(hit):
                rows.append({"claim": "P3", "quantity": quantity,
                             "value": float(hit["value"].iloc[0]), "detail": f"prompt {prompt}", "artifact": artifact})
            elif k not in grid:
                rows.append({"claim": "P3", "quantity": quantity, "value": None, "artifact": artifact,
                             "detail": f"prompt {prompt}: the post's group size k = {k} is not in this run's "
                                       f"grid k = {', '.join(map(str, grid))} (posembed_averaging.ks)"})
    rows.append(repeat_min_row(df, targets, model, artifact))
    return [{**r, "model": model} for r in rows]


# --------------------------------------------------------------------------- P4
def head_pattern(bridge: Any, doc: np.ndarray, layer: int, head: int) -> np.ndarray:
    """One head's attention pattern on a document: ``[n, n]`` float64 (query, key)."""
    name = f"L{layer}H{head}"
    return head_patterns(bridge, doc, [name])[name]


def pattern_similarity(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """Similarity of two attention (sub)matrices of equal shape: ``cosine_similarity`` of
    the flattened matrices, ``mean_abs_diff`` (per entry) and ``mean_row_tv`` (mean over
    rows of the total-variation distance ½·Σ|a − b|)."""
    fa, fb = a.ravel(), b.ravel()
    denom = float(np.linalg.norm(fa) * np.linalg.norm(fb))
    return {
        "cosine_similarity": float(fa @ fb / denom) if denom > 0 else float("nan"),
        "mean_abs_diff": float(np.abs(a - b).mean()),
        "mean_row_tv": float(0.5 * np.abs(a - b).sum(-1).mean()),
    }


# --------------------------------------------------------------------------- documents
def read_doc_index(path: str) -> np.ndarray:
    """``documents/doc_index`` of a tokens file ``[n_documents]`` (index in the corpus source)."""
    from posmech.store.hdf5 import open_artifact

    with open_artifact(path, "tokens") as f:
        return np.asarray(f["documents/doc_index"][()])


def heldout_documents(
    tokens: Any, doc_index: np.ndarray, corpus_doc_index: list[int], manifest: dict[str, Any], corpus: str,
    n_documents: int,
) -> tuple[list[np.ndarray], str]:
    """Documents of a :class:`~posmech.data.tokens.TokenSet` on which the model was not trained.

    For a model trained by the pipeline on ``corpus`` (manifest ``kind: train``), those at
    positions ``i % heldout_every == 0`` of the corpus file (``corpus_doc_index``: the
    ``doc_index`` of each line, in order; ``doc_index``: the tokens file's, see
    :func:`read_doc_index`), as in training; otherwise every document.
    Returns the first ``n_documents`` and a description of the selection.
    """
    train = manifest.get("train_config") or {}
    if manifest.get("kind") == "train" and train.get("corpus") == corpus:
        every = int(train["heldout_every"])
        position = {int(d): i for i, d in enumerate(corpus_doc_index)}
        keep = [j for j, d in enumerate(doc_index) if position.get(int(d), 1) % every == 0]
        how = f"held out from training (every {every}-th document of corpus {corpus!r})"
    else:
        keep = list(range(tokens.n_documents))
        how = f"all documents of corpus {corpus!r} (the model was not trained by the pipeline on it)"
    keep = keep[:n_documents]
    if not keep:
        raise PosmechError(f"no held-out document of corpus {corpus!r} to measure the loss on")
    return [tokens.doc(j) for j in keep], how


def head_patterns(bridge: Any, doc: np.ndarray, heads: list[str]) -> dict[str, np.ndarray]:
    """Attention patterns ``[n, n]`` float64 of several heads (``L{l}H{h}``) in one forward pass."""
    import torch

    wanted: dict[int, list[tuple[str, int]]] = {}
    for name in heads:
        layer, h = check_head(bridge, name)
        wanted.setdefault(layer, []).append((name, h))
    out: dict[str, np.ndarray] = {}

    def make(layer: int) -> Any:
        def hook(pattern: Any, hook: Any) -> None:
            for name, h in wanted[layer]:
                out[name] = pattern[0, h].double().cpu().numpy()
        return hook

    device = next(bridge.parameters()).device
    hooks = [(f"blocks.{layer}.attn.hook_pattern", make(layer)) for layer in wanted]
    with torch.inference_mode(), bridge.hooks(fwd_hooks=hooks):
        bridge(torch.as_tensor(np.asarray(doc, dtype=np.int64), device=device)[None], return_type=None)
    return out


def posembed_attention(
    bridge: Any, doc: np.ndarray, heads: list[str], start: int, size: int, k: int,
) -> tuple[pd.DataFrame, list[tuple[str, np.ndarray, np.ndarray]], tuple[int, int]]:
    """P4: each head's attention on ``doc`` intact vs with ``W_pos`` averaged in groups of ``k``.

    Returns ``(metrics, panels, (start, size))``: one metrics row per head with the
    previous-token mass (window query rows and whole document) intact and averaged, and
    :func:`pattern_similarity` of the ``size × size`` window (``cosine_similarity``,
    ``mean_abs_diff``; ``mean_row_tv`` over the window's full query rows); ``panels``
    ``(head, intact [size, size], averaged [size, size])``; the window actually used
    (clamped by :func:`window`).
    """
    start, size = window(len(doc), start, size)
    intact = head_patterns(bridge, doc, heads)
    with averaged_W_pos(bridge, k):
        averaged = head_patterns(bridge, doc, heads)
    sl = slice(start, start + size)
    rows, panels = [], []
    for h in heads:
        a, b = intact[h], averaged[h]
        sim = pattern_similarity(a[sl, sl], b[sl, sl])
        sim["mean_row_tv"] = pattern_similarity(a[sl], b[sl])["mean_row_tv"]
        rows.append({
            **head_columns(h), "k": k, "window_start": start, "window_size": size, "document_length": len(doc),
            "prev_token_mass_intact": mean_prev_token_mass(a, sl), "prev_token_mass_averaged": mean_prev_token_mass(b, sl),
            "prev_token_mass_intact_document": mean_prev_token_mass(a),
            "prev_token_mass_averaged_document": mean_prev_token_mass(b), **sim,
        })
        panels.append((h, a[sl, sl], b[sl, sl]))
    return pd.DataFrame(rows), panels, (start, size)


def attention_table(df: pd.DataFrame, chosen: dict[str, list[str]], model: str) -> pd.DataFrame:
    """P4's table from :func:`posembed_attention`'s rows (one per head, the sharp head first,
    then the early heads ``chosen["early"]``), in place: the columns ``claim`` (P4), ``model``
    and ``role`` (``sharp`` / ``early``) put in front; returns ``df``."""
    df.insert(0, "role", ["sharp"] + ["early"] * len(chosen["early"]))
    return claim_columns(df, "P4", model)


def attention_scorecard(df: pd.DataFrame, k: int, start: int, size: int, model: str,
                        figure: str) -> list[dict[str, Any]]:
    """P4's row of rule posembed_attention from :func:`posembed_attention`'s table ``df``
    (first row: the sharp head): ``pattern_similarity_k<k>`` — the cosine similarity of the
    sharp head's attention pattern on the ``size`` x ``size`` window at position ``start``,
    intact against W_pos averaged in groups of ``k``; the detail gives its previous-token mass
    in both."""
    sharp = df.iloc[0]
    return [{"claim": "P4", "model": model, "quantity": f"pattern_similarity_k{k}",
             "value": float(sharp["cosine_similarity"]), "artifact": figure,
             "detail": f"{sharp['head_name']}, cosine of the {size}x{size} window at {start}; previous-token mass "
                       f"{sharp['prev_token_mass_intact']:.3f} -> {sharp['prev_token_mass_averaged']:.3f}"}]
