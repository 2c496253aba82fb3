"""Rule sweep_<model>: one checkpoint's point of the dynamics sweep (or a twin's, or a figureless
model's), the followed rules in one process without figures (posmech.pipeline.sweep,
posmech.pipeline.runner.run_sweep_point). Each part's script is loaded from its path (script
`tokenize` shares its name with a standard-library module)."""

from posmech.pipeline.runner import run_sweep_point, script_modules

run_sweep_point(snakemake, script_modules())  # noqa: F821
