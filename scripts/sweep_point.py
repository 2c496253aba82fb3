"""Rule sweep_<model>: one checkpoint's point of the dynamics sweep, the followed rules in
one process without figures (posmech.sweep, posmech.runner.run_sweep_point)."""

from posmech.runner import run_sweep_point

run_sweep_point(snakemake)  # noqa: F821
