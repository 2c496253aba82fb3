"""Context-scaled positions are resolved once (issue 48, item 2): posmech.settings.positions_for
scales a section's null positions to a model's context and checks them; preflight collects its
messages, a job calls it once and records the result, a reader takes the recorded values."""

from __future__ import annotations

from pathlib import Path

import pytest

from posmech.core.config import load_schema, schema_keys
from posmech.settings import PositionError, defaults, null_gives, positions_for

REPO = Path(__file__).resolve().parents[1]
SCHEMA = load_schema(REPO / "workflow" / "schemas" / "config.schema.yaml")


def test_a_null_key_is_resolved_for_the_context_and_a_given_one_kept():
    k = defaults("kernels")  # every query position null
    at32, at1024 = positions_for(k, 32, "m"), positions_for(k, 1024, "m")
    assert (at32.heatmap_max_position, at32.etc_positions, at32.etc_heatmap_position) == (31, (3, 6, 12, 19, 25, 31), 31)
    assert (at1024.heatmap_max_position, at1024.etc_positions, at1024.etc_heatmap_position) == (
        100, (100, 200, 400, 600, 800, 1000), 1000)  # the post's, at GPT-2's context
    given = k.replace(etc_positions=[8, 16], etc_heatmap_position=16)
    assert positions_for(given, 1024, "m").etc_positions == (8, 16)
    # a resolved section resolves to itself: what a job records is what a reader gets back
    assert positions_for(at32, 32, "m") == at32
    n = defaults("neurons")
    assert (positions_for(n, 32, "m").from_position, positions_for(n, 1024, "m").from_position) == (3, 100)


def test_an_impossible_position_names_the_key_and_what_fits():
    k = defaults("kernels", etc_positions=[16, 40], etc_heatmap_position=16)
    with pytest.raises(PositionError) as info:
        positions_for(k, 32, "demo", "models.demo.n_ctx")
    assert len(info.value.problems) == 1
    msg = info.value.problems[0]
    assert msg.startswith("config key `kernels.etc_positions`: model 'demo' has a context of 32 tokens "
                          "(from models.demo.n_ctx): positions [40] are beyond it")
    assert "set kernels.etc_positions to values <= 31, e.g. [3, 6, 12, 19, 25, 31]" in msg
    # the rule in the hint is the schema's words, not a restatement
    rule = schema_keys(SCHEMA)["kernels.etc_positions"]["x-scales-with-context"]
    assert f"(null gives {' '.join(rule.split())})" in msg and null_gives("kernels", "etc_positions") in msg
    with pytest.raises(PositionError, match=r"`neurons.from_position`.*set it to at most 29, e.g. 3 \(null gives "
                                            r"round\(100 / 1024 · n_ctx\)"):
        positions_for(defaults("neurons", from_position=30), 32, "demo")
    with pytest.raises(PositionError, match=r"`interventions.min_tokens`.*none has 40; set it to at most 32, e.g. 32 "
                                            r"\(null gives min\(64, n_ctx\)\)"):
        positions_for(defaults("interventions", min_tokens=40), 32, "demo")
    with pytest.raises(PositionError, match=r"`contextual.positions` \(model demo\): \[31\] beyond .*values that fit "
                                            r"it: positions \[12, 22, 30\]"):
        positions_for(defaults("contextual", positions=[24, 31]), 32, "demo")


def test_every_null_gives_hint_is_the_schemas_rule():
    from posmech.core.config import CONTEXT_SCALED

    keys = schema_keys(SCHEMA)
    for section, rules in CONTEXT_SCALED.items():
        for key in rules:
            assert null_gives(section, key) == "null gives " + " ".join(
                keys[f"{section}.{key}"]["x-scales-with-context"].split())


def test_a_section_recorded_as_configured_reads_back_at_the_recorded_context():
    """layer0.h5 records the contextual section as configured (nulls kept) and the model's
    context: its readers get, from those, what layer0_decomposition resolved."""
    p = defaults("contextual")
    job = positions_for(p, 32, "demo")
    assert (job.max_position, job.positions, job.classify_position, job.denominator_from, job.grid) == (
        30, (12, 22, 30), 30, 3, 5)
    assert p.recorded(p.as_dict(), 32, "demo") == job
    n = defaults("neurons")  # extended_tokens.h5 records the resolved section (neurons_config)
    resolved = positions_for(n, 32, "demo", max_position=30)
    assert n.recorded(resolved.as_dict()) == resolved and n.recorded(resolved.as_dict()).from_position == 3
