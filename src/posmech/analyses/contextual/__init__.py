"""Contextual attention heads in layer 0 (claims K6–K10, seed post 004), one module a job:

* :mod:`~posmech.analyses.contextual.weights` — layer 0's weights read from a model's files
  (:class:`Layer0Weights`), unsupported position schemes refused;
* :mod:`~posmech.analyses.contextual.decomposition` — the layer-0 decomposition (its
  definitions and shapes in that module's docstring): LayerNorm scale, positional and
  content scores, softmax denominators per text, the artifact ``layer0.h5`` and rule
  ``layer0_decomposition``'s scorecard rows (the ``contextual`` section's positions are
  resolved and checked by :func:`posmech.settings.positions_for`);
* :mod:`~posmech.analyses.contextual.patterns` — K6 positional patterns and K7 head classes;
* :mod:`~posmech.analyses.contextual.softmax_denominators` — K8 spread of the denominators
  across texts and K9 the independent model of their variance;
* :mod:`~posmech.analyses.contextual.layer1` — K10, layer-1 rows against their positional kernels.

Every public name is re-exported here (``from posmech.analyses.contextual import X``); the
modules import one another directly, never through this package."""

from __future__ import annotations

from posmech.analyses.contextual.decomposition import (
    DESCRIPTIONS,
    KIND,
    RULE,
    Decomposition,
    Layer0File,
    TextKeys,
    build_decomposition,
    check_contexts,
    choose_texts,
    decompose,
    decomposition_scorecard,
    denominators,
    etc,
    ln_scale_summary,
    positional_pattern,
    read_decomposition,
    renormalised,
    single_token,
    softmax,
    tv,
    visible_keys,
)
from posmech.analyses.contextual.layer1 import LAYER1_QUANTITIES, layer1_scorecard, layer1_table, layer_rows
from posmech.analyses.contextual.patterns import (
    CLASSES,
    HEAD_CLASS_QUANTITIES,
    classify,
    duplicate_scores,
    head_class_scorecard,
    head_classes,
    positional_pattern_scorecard,
    positional_pattern_table,
    positional_patterns,
    window_grid,
)
from posmech.analyses.contextual.softmax_denominators import (
    BROAD_CLASSES,
    broad_spread_row,
    denominator_scorecard,
    denominator_spread,
    denominator_table,
    loglog_fit,
    loglog_fit_or_reason,
    most_varying,
    resampled_variance,
    variance_model,
    variance_scorecard,
    variance_table,
    within_text_variance,
)
from posmech.analyses.contextual.weights import (
    DIRECT_TYPES,
    Layer0Weights,
    as_float64,
    hf_param,
    layer0_state,
    load_weights,
    refuse_unsupported,
    weights_from_hf,
    weights_from_tl,
)

__all__ = [
    "BROAD_CLASSES", "CLASSES", "DESCRIPTIONS", "HEAD_CLASS_QUANTITIES", "KIND", "LAYER1_QUANTITIES", "RULE",
    "DIRECT_TYPES", "Decomposition", "Layer0File", "Layer0Weights", "TextKeys", "as_float64", "broad_spread_row",
    "build_decomposition", "check_contexts", "choose_texts", "classify", "decompose", "decomposition_scorecard",
    "denominator_scorecard", "denominator_spread", "denominator_table", "denominators", "duplicate_scores", "etc",
    "head_class_scorecard", "head_classes", "hf_param", "layer0_state", "layer1_scorecard", "layer1_table",
    "layer_rows", "ln_scale_summary", "load_weights", "loglog_fit", "loglog_fit_or_reason", "most_varying",
    "positional_pattern", "positional_pattern_scorecard", "positional_pattern_table", "positional_patterns",
    "read_decomposition", "refuse_unsupported", "renormalised", "resampled_variance",
    "single_token", "softmax", "tv", "variance_model", "variance_scorecard", "variance_table", "weights_from_hf",
    "visible_keys", "weights_from_tl", "window_grid", "within_text_variance",
]
