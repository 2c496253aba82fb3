"""Rule contextual: the contextual family's job for one model (docs/workflow.md, "Families"):
layer0_decomposition, layer0_positional_patterns, layer0_head_classes, softmax_denominators,
denominator_variance, layer1_patterns, in one process (posmech.runner.run_family)."""

import denominator_variance
import layer0_decomposition
import layer0_head_classes
import layer0_positional_patterns
import layer1_patterns
import softmax_denominators

from posmech.runner import run_family

run_family(snakemake, [  # noqa: F821
    (layer0_decomposition.main, {}),
    (layer0_positional_patterns.main, {"h5": "layer0_decomposition__h5"}),
    (layer0_head_classes.main, {"h5": "layer0_decomposition__h5"}),
    (softmax_denominators.main, {"h5": "layer0_decomposition__h5", "classes": "layer0_head_classes__table"}),
    (denominator_variance.main, {"h5": "layer0_decomposition__h5", "classes": "layer0_head_classes__table"}),
    (layer1_patterns.main, {"h5": "layer0_decomposition__h5"}),
])
