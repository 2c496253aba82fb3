"""Analysis ``attention_statistics``, the taxonomy family's first: one forward pass over the
web-text documents for the diagonal taxonomy (P6, P7) and the score taxa (P13):
``results/{model}/taxonomy/attention_statistics.h5``.

Both analyses read every head of every layer on the same kind of input — the first
``n_documents`` documents of a corpus that fill the context — and by default on the same
documents (``taxonomy`` and ``anatomy`` sections with the same corpus and context).  Run
separately, they cost two forward passes per document; here a document that both need is
run **once**, with the hooks of both collectors
(:class:`~posmech.analyses.taxonomy.DiagonalCollector`: ``hook_pattern`` reduced to
diagonal sums; :class:`~posmech.analyses.anatomy.ProfileCollector`: ``hook_q`` /
``hook_k`` reduced to row windows).  A document is shared when it is the same token
sequence in both lists (compared element by element, so two sections on different corpora
or contexts simply share nothing); the documents only one section needs run with that
section's hooks alone.  Each section keeps its own documents, counts and batch size, so the
numbers equal those of two separate passes (to float32 rounding of the engine's kernels).

The pass stores only accumulations; the classification (thresholds, pins, early-head
count) is done by the light rules ``diagonal_taxonomy`` and ``score_taxa`` from this file,
so changing a threshold does not rerun the model.

Layout (``kind`` ``attention_statistics``):

* ``diagonals/sums [n_layers, n_heads, n_ctx]`` float64, ``diagonals/counts [n_ctx]``
  int64, ``diagonals/detector_sum [n_layers, n_heads]`` float64 and attributes
  ``n_documents``, ``n_tokens``, ``exclude_first_query``
  (:class:`~posmech.analyses.taxonomy.DiagonalStats`);
* ``profiles/windows [n_layers, n_heads, n_rows, 2W+1]`` float32, ``profiles/document
  [n_rows]``, ``profiles/query [n_rows]`` and attributes ``window``, ``n_documents``,
  ``n_tokens``, ``max_abs_diff_vs_hook_attn_scores``
  (:class:`~posmech.analyses.anatomy.ScoreProfiles`) — present only when the model
  is one of the ``anatomy`` section's models;
* root attributes: ``n_shared_documents`` (documents run once for both), and the
  sections' parameters.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from posmech.analyses.attention import Collector, run_collectors
from posmech.analyses.anatomy import ProfileCollector, ScoreProfiles, row_features
from posmech.analyses.taxonomy import DiagonalCollector, DiagonalStats
from posmech.core.errors import PosmechError
from posmech.settings.anatomy import AnatomySettings

KIND = "attention_statistics"


@dataclass
class ProfileOptions:
    """The ``anatomy`` section's keys that shape the P13 rows."""

    window: int
    rows_per_document: int | None = None
    first_query: int | None = None
    batch_size: int = 1

    @classmethod
    def of(cls, settings: AnatomySettings) -> ProfileOptions:
        """The options of the ``anatomy`` section's settings."""
        return cls(settings.window, settings.rows_per_document, settings.first_query, settings.batch_size)


def shared_prefix(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> int:
    """How many leading documents ``a`` and ``b`` have in common (equal token sequences)."""
    n = 0
    for x, y in zip(a, b):
        if len(x) != len(y) or not np.array_equal(x, y):
            break
        n += 1
    return n


def attention_statistics(
    bridge: Any, taxonomy_documents: Sequence[np.ndarray], taxonomy_batch_size: int = 1,
    exclude_first_query: bool = True, profile_documents: Sequence[np.ndarray] | None = None,
    profile_options: ProfileOptions | None = None, progress: bool = True,
) -> tuple[DiagonalStats, ScoreProfiles | None, int]:
    """Diagonal sums over ``taxonomy_documents`` and (when ``profile_documents`` is given)
    P13 row windows over ``profile_documents``, with one forward pass per document both
    lists share: ``(stats, profiles or None, n_shared_documents)``.

    Shared documents run in batches of ``min`` of the two batch sizes; the rest in their
    own section's batch size."""
    diag = DiagonalCollector(bridge.cfg, exclude_first_query)
    cols_t: tuple[Collector, ...] = (diag,)
    if profile_documents is None:
        run_collectors(bridge, [(d, cols_t) for d in taxonomy_documents], taxonomy_batch_size, progress)
        return diag.result(), None, 0
    if profile_options is None:
        raise PosmechError("attention_statistics: profile_documents given without profile_options")
    prof = ProfileCollector(bridge.cfg, profile_options.window, profile_options.rows_per_document,
                            profile_options.first_query)
    shared = shared_prefix(taxonomy_documents, profile_documents)
    both: tuple[Collector, ...] = (diag, prof)
    items = [(d, both) for d in taxonomy_documents[:shared]]
    run_collectors(bridge, items, min(taxonomy_batch_size, profile_options.batch_size), progress)
    rest_t = [(d, cols_t) for d in taxonomy_documents[shared:]]
    if rest_t:
        run_collectors(bridge, rest_t, taxonomy_batch_size, progress)
    rest_p = [(d, (prof,)) for d in profile_documents[shared:]]
    if rest_p:
        run_collectors(bridge, rest_p, profile_options.batch_size, progress)
    return diag.result(), prof.result(), shared


def write_statistics(path: str | os.PathLike[str], stats: DiagonalStats, profiles: ScoreProfiles | None,
                     attrs: dict[str, Any]) -> None:
    """Write ``attention_statistics.h5`` (layout in the module docstring)."""
    from posmech.store.hdf5 import artifact_writer, describe, set_attrs

    with artifact_writer(path, KIND, "attention_statistics", attrs) as f:
        g = f.create_group("diagonals")
        g.create_dataset("sums", data=stats.sums)
        g.create_dataset("counts", data=stats.counts)
        g.create_dataset("detector_sum", data=stats.detector_sum)
        set_attrs(g, {"n_documents": stats.n_documents, "n_tokens": stats.n_tokens})
        texts = {
            "diagonals/sums": "[n_layers, n_heads, n_ctx] float64 attention on key offset d (key = query - d) "
                              "summed over documents and query positions",
            "diagonals/counts": "[n_ctx] int64 number of (document, query) entries on each offset d",
            "diagonals/detector_sum": "[n_layers, n_heads] float64 sum over documents of TransformerLens's "
                                      "head_detector previous-token score",
        }
        if profiles is not None:
            p = f.create_group("profiles")
            p.create_dataset("windows", data=profiles.windows, compression="gzip", compression_opts=4, shuffle=True)
            p.create_dataset("document", data=profiles.documents)
            p.create_dataset("query", data=profiles.queries)
            set_attrs(p, {"window": profiles.window, "n_documents": profiles.n_documents,
                          "n_tokens": profiles.n_tokens,
                          "max_abs_diff_vs_hook_attn_scores": profiles.max_check_error})
            texts.update({
                "profiles/windows": "[n_layers, n_heads, n_rows, 2W+1] float32 raw scores q·k/scale of each "
                                    "sampled query row at keys query-W..query+W (future keys included)",
                "profiles/document": "[n_rows] 0-based index, among the anatomy documents, of each row's document",
                "profiles/query": "[n_rows] query position of each row",
            })
        describe(f, texts)


def _plain(v: Any) -> Any:
    """A numpy scalar as the Python number it holds (tables' metadata is JSON)."""
    return v.item() if isinstance(v, np.generic) else v


def read_statistics(path: str | os.PathLike[str], need_profiles: bool = False
                    ) -> tuple[DiagonalStats, ScoreProfiles | None, dict[str, Any]]:
    """``(stats, profiles or None, root attributes)`` of an ``attention_statistics.h5``;
    ``need_profiles``: :class:`PosmechError` naming the file when it has no profiles (the
    model is not one of the ``anatomy`` section's models)."""
    from posmech.store.hdf5 import attr_json, open_artifact

    with open_artifact(path, KIND) as f:
        attrs = {k: _plain(attr_json(f, k)) for k in f.attrs}
        g = f["diagonals"]
        ga = g.attrs
        stats = DiagonalStats(g["sums"][()], g["counts"][()], g["detector_sum"][()], int(ga["n_documents"]),
                              int(ga["n_tokens"]))
        profiles = None
        if "profiles" in f:
            p = f["profiles"]
            pa = p.attrs
            windows = p["windows"][()]
            profiles = ScoreProfiles(windows, row_features(windows), p["document"][()], p["query"][()],
                                     int(pa["window"]), int(pa["n_documents"]), int(pa["n_tokens"]),
                                     float(pa["max_abs_diff_vs_hook_attn_scores"]))
        elif need_profiles:
            raise PosmechError(f"{os.fspath(path)} has no P13 score profiles: its model is not one of the "
                               "`anatomy.models`; add it there (or run the rule for another model)")
    return stats, profiles, attrs
