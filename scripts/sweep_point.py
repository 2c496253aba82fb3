"""Rule sweep_<model>: one checkpoint's point of the dynamics sweep, the followed rules in
one process without figures (posmech.pipeline.sweep, posmech.pipeline.runner.run_sweep_point)."""

from importlib import import_module

from posmech.pipeline.runner import run_sweep_point

run_sweep_point(snakemake, import_module)  # noqa: F821
