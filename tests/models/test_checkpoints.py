"""Checkpoints as models of the run (posmech.models.checkpoints): names, entries, the
sections that list them, the sweep's points, and the errors the config alone can tell."""

import pytest

from posmech.core.errors import PosmechError
from posmech.models.checkpoints import add_checkpoints, checkpoints_of, step_of, sweep_points


def _config():
    return {
        "models": {
            "demo": {"train": {"corpus": "bible", "steps": 2000, "checkpoints": [500, 0, 50]}, "device": "cpu"},
            "pythia": {"source": "EleutherAI/pythia-70m", "revision": "main",
                       "revisions": ["step1000", "step3000"], "device": "cpu"},
            "plain": {"source": "gpt2", "revision": "main"},
            "demo-twin": {"twin_of": "demo", "seed": 0},
        },
        "taxonomy": {"models": ["demo", "plain"]},
        "kernels": {"models": []},
        "attn_only": {"models": ["plain"]},
    }


def test_each_checkpoint_is_a_model_named_model_at_revision_in_step_order():
    cfg = _config()
    added = add_checkpoints(cfg)
    assert added == ["demo@step0", "demo@step50", "demo@step500", "pythia@step1000", "pythia@step3000"]
    trained = cfg["models"]["demo@step50"]
    assert (trained["checkpoint_of"], trained["step"], trained["checkpoint_revision"]) == ("demo", 50, "step50")
    assert trained["train"] == cfg["models"]["demo"]["train"] and "source" not in trained
    hub = cfg["models"]["pythia@step3000"]
    # a Hub checkpoint is its model fetched at another revision
    assert (hub["source"], hub["revision"], hub["step"], "revisions" in hub) == (
        "EleutherAI/pythia-70m", "step3000", 3000, False)
    assert checkpoints_of(cfg) == {c: c.split("@")[0] for c in added}
    # listed where the model is listed; an empty list already means every model
    assert cfg["taxonomy"]["models"] == ["demo", "plain", "demo@step0", "demo@step50", "demo@step500"]
    assert cfg["kernels"]["models"] == [] and cfg["attn_only"]["models"] == ["plain"]
    # twins and models without checkpoints get none
    assert not [m for m in cfg["models"] if m.startswith(("plain@", "demo-twin@"))]


def test_the_sweep_ends_with_the_model_itself():
    cfg = _config()
    add_checkpoints(cfg)
    points = sweep_points(cfg)
    assert [(p["model"], p["revision"], p["step"], p["checkpoint"]) for p in points] == [
        ("demo", "step0", 0, "demo@step0"), ("demo", "step50", 50, "demo@step50"),
        ("demo", "step500", 500, "demo@step500"), ("demo", "final", 2000, "demo"),
        ("pythia", "step1000", 1000, "pythia@step1000"), ("pythia", "step3000", 3000, "pythia@step3000"),
        ("pythia", "final", None, "pythia"),
    ]


def test_step_of_reads_step_names_only():
    assert (step_of("step0"), step_of("step143000"), step_of("main"), step_of("step1a")) == (0, 143000, None, None)


@pytest.mark.parametrize("entry, key, words", [
    ({"train": {"corpus": "bible", "steps": 100, "checkpoints": [50, 100]}}, "train.checkpoints",
     "not before the last step"),
    ({"source": "./my-model", "revisions": ["step1"]}, "revisions", "a local directory has no revisions"),
    ({"source": "org/m", "revision": "step9", "revisions": ["step1", "step9"]}, "revisions", "own `revision`"),
])
def test_a_checkpoint_that_cannot_exist_is_an_error_naming_the_key(entry, key, words):
    with pytest.raises(PosmechError) as err:
        add_checkpoints({"models": {"m": entry}})
    assert f"`models.m.{key}`" in str(err.value) and words in str(err.value)
