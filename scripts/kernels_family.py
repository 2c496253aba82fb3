"""Rule kernels: the kernels family's job for one model (docs/workflow.md, "Families"):
positional_kernels, etc_table, kernel_heatmaps, in one process (posmech.runner.run_family)."""

import etc_table
import kernel_heatmaps
import positional_kernels

from posmech.runner import run_family

run_family(snakemake, [  # noqa: F821
    (positional_kernels.main, {}),
    (etc_table.main, {"h5": "positional_kernels__h5"}),
    (kernel_heatmaps.main, {"h5": "positional_kernels__h5", "table": "etc_table__table"}),
])
