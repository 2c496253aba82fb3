"""posmech.settings: one typed, frozen settings object per family, built from the validated
config section; its fields are exactly the schema's keys, written from the schema
(posmech.settings.schema_fields, ``make config-doc``; the schema stays the single source of
keys, defaults and documentation)."""

from __future__ import annotations

import copy
import dataclasses
import typing
from pathlib import Path

import pytest
import yaml

from posmech.core.config import load_schema, validate_config
from posmech.core.errors import PosmechError
from posmech.settings import MODULES, Settings, _settings_class, build, defaults, settings_class
from posmech.settings.reference import COMMAND, FIELDS_PATH, fields_source

REPO = Path(__file__).resolve().parents[1]
SCHEMA = load_schema(REPO / "workflow/schemas/config.schema.yaml")
CONFIGS = ["config/config.yaml", "config/demo.yaml", "config/ci.yaml", "config/own-model.yaml"]


def _validated(name: str) -> dict:
    config = yaml.safe_load((REPO / name).read_text())
    return validate_config(config, SCHEMA, base=str(REPO), semantic=False)


def _schema_keys(section_schema: dict) -> list[str]:
    return list(section_schema["properties"])


def _check_fields(cls: type[Settings], section_schema: dict, where: str) -> None:
    names = [f.name for f in dataclasses.fields(cls)]
    assert names == _schema_keys(section_schema), f"{where}: {cls.__name__} fields differ from the schema"
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        assert f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING, \
            f"{where}.{f.name}: a settings field has no default (the schema's applies)"
        nested = _settings_class(hints[f.name])
        sub = section_schema["properties"][f.name]
        if "properties" in sub:
            assert nested is not None, f"{where}.{f.name} is an object with keys: it needs a settings class"
            assert nested.section == f"{where}.{f.name}"
            _check_fields(nested, sub, f"{where}.{f.name}")
        else:
            assert nested is None


@pytest.mark.parametrize("section", list(MODULES))
def test_fields_are_the_schema_keys(section):
    _check_fields(settings_class(section), SCHEMA["properties"][section], section)


def test_the_fields_are_written_from_the_schema():
    assert fields_source(SCHEMA) == FIELDS_PATH.read_text(encoding="utf-8"), (
        f"src/posmech/settings/schema_fields.py is stale: its fields differ from the schema's keys; run {COMMAND}"
    )


@pytest.mark.parametrize("section", list(MODULES))
def test_a_settings_class_adds_no_field_to_the_written_ones(section):
    cls = settings_class(section)
    base = cls.__mro__[1]
    assert base.__module__ == "posmech.settings.schema_fields" and base.__name__ == cls.__name__[:-8] + "Fields"
    assert dataclasses.fields(cls) == dataclasses.fields(base) and cls.section == section


@pytest.mark.parametrize("name", CONFIGS)
def test_built_from_every_shipped_config(name):
    config = _validated(name)
    raw = copy.deepcopy(config)
    study = build(config)
    assert config == raw, "building the settings changed the config"
    for section in MODULES:
        s = study[section]
        assert type(s) is settings_class(section) and getattr(study, section) is s
        # frozen, immutable lists, nested objects typed
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(s, "models", ())
        assert isinstance(s.models, tuple)
        # as_dict: the config's own values, where the section left nothing to resolve
        back = s.as_dict()
        for key, value in raw[section].items():
            if getattr(type(s).from_section(raw[section]), key) == getattr(s, key):
                assert back[key] == value, f"{name}: {section}.{key}"


def test_a_key_missing_from_the_class_is_a_workflow_error():
    config = _validated("config/demo.yaml")
    section = dict(config["kernels"], not_a_key=1)
    with pytest.raises(PosmechError, match=r"`kernels`.*\['not_a_key'\].*workflow bug"):
        settings_class("kernels").from_section(section)
    section = {k: v for k, v in config["kernels"].items() if k != "k0"}
    with pytest.raises(PosmechError, match=r"fields \['k0'\] have no value"):
        settings_class("kernels").from_section(section)


def test_replace_and_scaled():
    config = _validated("config/demo.yaml")
    k = build(config).kernels
    k2 = k.replace(etc_positions=[5, 9])
    assert k2.etc_positions == (5, 9) and k.etc_positions != (5, 9)
    scaled = k.replace(etc_positions=None, heatmap_max_position=None, etc_heatmap_position=None).scaled(64)
    assert scaled.heatmap_max_position == 63
    assert scaled.etc_heatmap_position == max(scaled.etc_positions)
    assert all(isinstance(v, int) for v in scaled.etc_positions)


def test_defaults_are_the_schema_defaults():
    d = defaults("kernels", k0=3)
    assert type(d) is settings_class("kernels") and d.k0 == 3 and d.n_chapters == 8
    a = defaults("anatomy", taxa={"row_min": 0.5})
    assert a.taxa.row_min == 0.5 and a.taxa.dip_min == 0.5
    with pytest.raises(PosmechError, match="k0: -1 is less than the minimum of 0"):
        defaults("kernels", k0=-1)


def test_prepare_builds_the_study_of_the_demo_config(tmp_path, monkeypatch):
    """posmech.pipeline.study.prepare on config/demo.yaml: validated, twins and checkpoints added,
    settings built from the final config, and the schedule keeps the rotary model off the
    rules that need learned positions."""
    from posmech.pipeline.study import prepare

    monkeypatch.chdir(tmp_path)  # no lock, no fetched models here
    config = yaml.safe_load((REPO / "config/demo.yaml").read_text())
    study = prepare(config, SCHEMA, REPO, str(REPO / "resources/findings.yaml"), [], main_process=False,
                    runs_jobs_here=True, dry_run=True)
    assert study.twins == ["demo-twin", "demo-attn-twin", "demo-rope-twin"]
    assert study.twin_of["demo-rope-twin"] == "demo-rope"
    assert set(study.checkpoint_of.values()) == {"demo", "demo-attn"}
    assert study.models == list(config["models"]) and not set(study.final_models) & set(study.checkpoint_of)
    assert study.settings.kernels.means_corpus == next(iter(config["corpora"]))
    assert study.architectures["demo-rope"].positions == "rotary"
    assert "extended_positional_embeddings" in study.not_applicable["demo-rope"]
    assert study.schedule.runs_on("extended_positional_embeddings", ["demo", "demo-rope"]) == ["demo"]
    ckpt = next(iter(study.checkpoint_of))
    assert study.schedule.runs_on("diagonal_taxonomy", [ckpt]) == [ckpt]  # the sweep follows P6/P7
    assert study.schedule.runs_on("etc_heatmap", [ckpt]) == []


def test_neurons_models_are_those_with_an_mlp():
    from types import SimpleNamespace

    from posmech.settings.neurons import models

    config = {"models": {"a": {}, "attn": {"source": "NeelNanda/attn_only_2l"}, "b": {}}}
    archs = {"a": SimpleNamespace(has_mlp=True), "attn": None, "b": SimpleNamespace(has_mlp=False)}
    assert models(defaults("neurons"), config, archs) == ["a"]
    assert models(defaults("neurons", models=["a"]), config, archs) == ["a"]
    with pytest.raises(PosmechError, match=r"`neurons.models`: \['attn', 'b'\] have no MLP"):
        models(defaults("neurons", models=["b", "attn"]), config, archs)
