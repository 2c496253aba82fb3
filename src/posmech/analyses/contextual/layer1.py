"""Claim K10: how positional the real attention rows of layer 1 are (rule ``layer1_patterns``),
with its scorecard rows."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from posmech.analyses.attention import head_name
from posmech.analyses.contextual.decomposition import etc, renormalised, tv


# --------------------------------------------------------------------------- K10
def layer_rows(bridge: Any, ids: np.ndarray, n: int, layer: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """One forward pass of ``ids[: n + 1]``: the attention rows at ``n`` of every head of
    ``layer`` ``[H, n + 1]`` and the post-ln1 embedding at ``n`` ``[d_model]``."""
    import torch

    store: dict[str, np.ndarray] = {}

    def grab(key: str, index: Any) -> Any:
        def fn(t: Any, hook: Any) -> Any:
            store[key] = t[index].double().cpu().numpy()
            return t
        return fn

    dev = next(bridge.parameters()).device
    toks = torch.as_tensor(np.asarray(ids[: n + 1], dtype=np.int64), device=dev)[None]
    hooks = [(f"blocks.{layer}.attn.hook_pattern", grab("pattern", (0, slice(None), n))),
             (f"blocks.{layer}.ln1.hook_out", grab("x", (0, n)))]
    with torch.inference_mode():
        bridge.run_with_hooks(toks, fwd_hooks=hooks, return_type=None)
    return store["pattern"], store["x"]


def layer1_table(rows: np.ndarray, kernel: np.ndarray, n: int, k0: int, threshold: float, model: str,
                 layer: int = 1) -> pd.DataFrame:
    """K10: per head of ``layer``, TV between its real attention row at ``n`` and its
    positional kernel (K1's definition at the same ``n``), both over keys ``k0..n``
    renormalised; ``mostly_positional`` when the TV is below ``threshold``.  ``rows,
    kernel [H, ≥ n + 1]``."""
    r, k = renormalised(rows[:, : n + 1], k0), renormalised(kernel[:, : n + 1], k0)
    d = tv(r, k)
    H = rows.shape[0]
    return pd.DataFrame({"claim": "K10", "model": model, "layer": layer, "head": np.arange(H),
                         "head_name": [head_name(layer, h) for h in range(H)], "n": n,
                         "tv_row_vs_kernel": d, "etc_row": etc(r), "etc_kernel": etc(k),
                         "row_mass_before_k0": rows[:, :k0].sum(axis=-1), "mostly_positional": d < threshold})


# --------------------------------------------------------------------------- scorecard rows (K10)
LAYER1_QUANTITIES = ("mostly_positional_heads", "mostly_positional_fraction")


def layer1_scorecard(table: pd.DataFrame, title: str, n: int, max_tv: float, model: str, figure: str,
                     artifact: str) -> list[dict[str, Any]]:
    """K10 rows from :func:`layer1_table` (column ``mostly_positional``: the head's real
    layer-1 row on ``title`` at position ``n`` is within total variation ``max_tv`` of its
    positional kernel):

    * ``layer1_patterns`` — the word ``figures``;
    * ``mostly_positional_heads`` — the layer-1 heads that are mostly positional;
    * ``mostly_positional_fraction`` — their number over the number of layer-1 heads."""
    heads = table[table["mostly_positional"]]["head_name"].tolist()
    rows = [{"claim": "K10", "quantity": "layer1_patterns", "value": "figures", "detail": f"{title}, n = {n}",
             "artifact": figure},
            {"claim": "K10", "quantity": "mostly_positional_heads", "value": heads,
             "detail": f"layer-1 heads whose real row is within TV {max_tv} of their "
             f"positional kernel ({len(heads)} of {len(table)})", "artifact": artifact},
            {"claim": "K10", "quantity": "mostly_positional_fraction", "value": len(heads) / len(table),
             "detail": f"{len(heads)} of {len(table)} layer-1 heads within TV {max_tv} of their "
             "positional kernel", "artifact": artifact}]
    return [{**r, "model": model} for r in rows]
