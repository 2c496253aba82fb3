"""A changed config section reruns its family's jobs: each rule gets its section's settings
as a plain-dict param (``SETTINGS.<section>.as_param()``, posmech.settings), which Snakemake
records; a settings object itself would be left out of the record, and a changed section
would rerun nothing. Checked with dry runs on the complete CI-sized run (not with
``--list-changes params``: Snakemake 9.27 lists every job's last output there, changed
or not)."""

from __future__ import annotations

import pytest
import yaml

from tests.workflow.conftest import REPO, snakemake

# one key of each section, its changed value, and the rule of the section's family
CHANGES = {
    "taxonomy": ("early_top_n", 3, "taxonomy"),
    "anatomy": ("figure_heads", 2, "anatomy"),
    "geometry": ("seed", 7, "geometry"),
    "interventions": ("zoom_start", 1, "interventions"),
    "kernels": ("seed", 7, "kernels"),
    "contextual": ("seed", 7, "contextual"),
    "neurons": ("n_auto", 2, "neurons"),
    "attn_only": ("seed", 7, "attn_only"),
    "posembed_averaging": ("loss_tolerance", 0.5, "posembed_averaging"),
    "posembed_attention": ("k", 2, "posembed_attention"),
    "cache": ("chunk_tokens", 64, "cache_activations"),
}


def _rerun(workdir, configfile):
    """``{rule: why}`` of the jobs a dry run would run, from its ``rule <name>:`` blocks."""
    proc = snakemake(workdir, "-n", configfile=configfile)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out, rule = {}, None
    for line in proc.stdout.splitlines():
        if line.startswith(("rule ", "localrule ")) and line.rstrip().endswith(":"):
            rule = line.split()[1].rstrip(":")
        elif rule and line.strip().startswith("reason:"):
            out.setdefault(rule, line.strip())
    return out


def test_the_run_as_configured_reruns_nothing(ci_run):
    assert _rerun(ci_run, REPO / "config" / "ci.yaml") == {}


@pytest.mark.parametrize("section", list(CHANGES))
def test_a_changed_section_reruns_its_rule(ci_run, tmp_path, section):
    key, value, where = CHANGES[section]
    config = yaml.safe_load((REPO / "config" / "ci.yaml").read_text())
    config.setdefault(section, {})[key] = value
    configfile = tmp_path / "changed.yaml"
    configfile.write_text(yaml.safe_dump(config))
    rerun = _rerun(ci_run, configfile)
    assert where in rerun, (section, rerun)
    # the section's recorded param changed: on its rule, or on a rule before it that reads the
    # section too (anatomy's: taxonomy's shared pass, whose new outputs then rerun anatomy)
    recorded = f"'__settings__': '{section}'"
    assert any("Params have changed" in why and recorded in why for why in rerun.values()), (section, rerun)
