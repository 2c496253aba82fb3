"""A changed config section reruns its family's jobs: each rule gets its section's settings
as a plain-dict param (``SETTINGS.<section>.as_param()``, posmech.settings), which Snakemake
records; a settings object itself would be left out of the record, and a changed section
would rerun nothing. Checked on the CI-sized run with ``--list-changes params``."""

from __future__ import annotations

import pytest
import yaml

from tests.workflow.conftest import REPO, snakemake

# one key of each section, its changed value, and an output directory of its rule
CHANGES = {
    "taxonomy": ("early_top_n", 3, "results/demo/taxonomy/"),
    "anatomy": ("figure_heads", 2, "results/demo/anatomy/"),
    "geometry": ("seed", 7, "results/demo/geometry/"),
    "interventions": ("zoom_start", 1, "results/demo/interventions/"),
    "kernels": ("seed", 7, "results/demo/kernels/"),
    "contextual": ("seed", 7, "results/demo/contextual/"),
    "neurons": ("n_auto", 2, "results/demo/neurons/"),
    "attn_only": ("seed", 7, "results/demo/attn_only/"),
    "posembed_averaging": ("loss_tolerance", 0.5, "results/demo/posembed/"),
    "posembed_attention": ("k", 2, "results/demo/posembed/"),
    "cache": ("chunk_tokens", 64, "results/demo/activations/"),
}


def _changed(workdir, configfile):
    proc = snakemake(workdir, "--list-changes", "params", configfile=configfile)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [line.strip() for line in proc.stdout.splitlines() if line.strip().startswith("results/")]


def test_the_run_as_configured_has_no_changed_params(ci_run):
    assert _changed(ci_run, REPO / "config" / "ci.yaml") == []


@pytest.mark.parametrize("section", list(CHANGES))
def test_a_changed_section_reruns_its_rule(ci_run, tmp_path, section):
    key, value, where = CHANGES[section]
    config = yaml.safe_load((REPO / "config" / "ci.yaml").read_text())
    config.setdefault(section, {})[key] = value
    configfile = tmp_path / "changed.yaml"
    configfile.write_text(yaml.safe_dump(config))
    changed = _changed(ci_run, configfile)
    assert any(p.startswith(where) for p in changed), (section, changed)
