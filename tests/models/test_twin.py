"""Random-init twins (posmech.models.twin): the config entries, the weights, the verdict columns."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from posmech.core.config import weights_entry
from posmech.core.errors import PosmechError
from posmech.verdicts.findings import FINDINGS_COLUMNS, TWIN_COLUMNS, with_twins
from posmech.models.handbuilt import AttnOnlySpec, save_attn_only_dir
from posmech.models.twin import add_twins, build_twin, build_twin_dir, tl_initialisation, twins_of
from tests import tiny_archs


def _config(**twins):
    return {
        "models": {"a": {"source": "/m/a", "revision": "main", "device": "cpu", "n_ctx": 16},
                   "b": {"train": {"corpus": "bible"}, "device": "auto", "n_ctx": None}},
        "kernels": {"models": ["b"], "corpus": None},
        "attn_only": {"models": []},
        "twins": twins,
    }


def test_add_twins_copies_the_analysis_keys_not_the_weights_source():
    cfg = _config(enabled=True, trained=True, seed=7)
    assert add_twins(cfg) == ["a-twin", "b-twin"]
    assert cfg["models"]["a-twin"] == {"device": "cpu", "n_ctx": 16, "twin_of": "a", "seed": 7}
    assert cfg["models"]["b-twin"] == {"device": "auto", "n_ctx": None, "twin_of": "b", "seed": 7}
    # a section listing a model lists its twin; an empty list (every model) stays empty
    assert cfg["kernels"]["models"] == ["b", "b-twin"] and cfg["attn_only"]["models"] == []
    assert twins_of(cfg) == {"a-twin": "a", "b-twin": "b"}
    # the default null (`init`) adds no key: every job's params as before `twins.weights`;
    # `shuffled` is in the entry, so its jobs' params (and build_twin's) differ from init's
    cfg = _config(weights="shuffled")
    add_twins(cfg)
    assert cfg["models"]["a-twin"]["twin_weights"] == "shuffled"
    assert weights_entry(cfg["models"]["a-twin"]) == {"twin_of": "a", "seed": 0, "twin_weights": "shuffled"}
    assert weights_entry({"twin_of": "a", "seed": 0}) == {"twin_of": "a", "seed": 0}
    with pytest.raises(PosmechError, match=r"`twins\.weights`"):
        add_twins(_config(weights="scaled"))


def test_add_twins_on_by_default_for_untrained_models_off_when_asked_and_for_chosen_models_only():
    """The null by default: every model the run does not train gets a twin (here `a`, a
    local directory), a trained one (`b`) only with `trained`; `enabled: false` turns them off;
    `models` chooses, trained or not."""
    cfg = _config()
    assert add_twins(cfg) == ["a-twin"] and list(cfg["models"]) == ["a", "b", "a-twin"]
    assert add_twins(_config(trained=True)) == ["a-twin", "b-twin"]
    cfg = _config(enabled=False)
    assert add_twins(cfg) == [] and list(cfg["models"]) == ["a", "b"]
    cfg = _config(enabled=True, models=["b"])
    assert add_twins(cfg) == ["b-twin"] and "a-twin" not in cfg["models"]


def test_a_model_named_like_a_twin_is_an_error_naming_the_key():
    cfg = _config(enabled=True)
    cfg["models"]["a-twin"] = {"source": "/m/x"}
    with pytest.raises(PosmechError, match=r"`models\.a-twin`.*twin of model 'a'"):
        add_twins(cfg)


def test_hf_twin_same_config_and_shapes_new_seeded_weights(tmp_path):
    parent = tiny_archs.llama(tmp_path / "llama")
    build_twin_dir(parent, tmp_path / "t1", seed=0)
    build_twin_dir(parent, tmp_path / "t2", seed=0)
    build_twin_dir(parent, tmp_path / "t3", seed=1)
    p = load_file(str(parent / "model.safetensors"))
    t1, t2, t3 = (load_file(str(tmp_path / t / "model.safetensors")) for t in ("t1", "t2", "t3"))
    assert set(t1) == set(p) and all(t1[k].shape == p[k].shape for k in p)
    w = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(t1[w], p[w]) and torch.equal(t1[w], t2[w]) and not torch.equal(t1[w], t3[w])
    # Llama's own initialisation: normal(0, initializer_range), RMSNorm scales one
    cfg = json.loads((parent / "config.json").read_text())
    assert float(t1[w].std()) == pytest.approx(cfg["initializer_range"], rel=0.1)
    assert torch.equal(t1["model.norm.weight"], torch.ones_like(t1["model.norm.weight"]))
    assert json.loads((tmp_path / "t1" / "config.json").read_text())["model_type"] == "llama"
    assert (tmp_path / "t1" / "tokenizer.json").read_text() == (parent / "tokenizer.json").read_text()


def test_tl_legacy_twin_is_transformer_lens_initialisation(tmp_path):
    parent = save_attn_only_dir(AttnOnlySpec(n_ctx=8, d_vocab=12), tmp_path / "attn")
    build_twin_dir(parent, tmp_path / "t", seed=3)
    p, t = load_file(str(parent / "model.safetensors")), load_file(str(tmp_path / "t" / "model.safetensors"))
    assert set(t) == set(p)
    cfg = json.loads((parent / "config.json").read_text())
    std = cfg.get("initializer_range") or 0.8 / math.sqrt(cfg["d_model"])
    for name, x in t.items():
        last = name.rsplit(".", 1)[-1]
        if last.startswith("W_"):
            assert float(x.float().std()) == pytest.approx(std, rel=0.25), name
        elif last.startswith("b_") or last == "b":
            assert not x.any(), name
        elif last == "w":
            assert torch.equal(x, torch.ones_like(x)), name
    again = tl_initialisation(p, cfg, seed=3)
    assert all(torch.equal(again[k], t[k]) for k in t)


def _assert_shuffled(parent: dict, twin: dict, shuffled: set[str]) -> None:
    """Each tensor of ``shuffled`` in ``twin`` holds exactly ``parent``'s entries (sorted equal)
    in another order (unless all its entries are equal); every other tensor is unchanged."""
    assert set(twin) == set(parent)
    for k, x in twin.items():
        assert x.shape == parent[k].shape and x.dtype == parent[k].dtype, k
        if k in shuffled:
            assert torch.equal(x.flatten().sort().values, parent[k].flatten().sort().values), k
            assert torch.equal(x, parent[k]) == bool((parent[k] == parent[k].flatten()[0]).all()), k
        else:
            assert torch.equal(x, parent[k]), k


def test_shuffled_hf_twin_permutes_each_parameter_keeps_ties_and_is_seeded(tmp_path):
    """`twins.weights: shuffled` on a Hugging Face model (a tiny GPT-2: tied input/output
    embeddings, learned positions, Conv1D weights): every parameter tensor of the twin is a
    permutation of the model's own (the same sorted entries, so the same norm and largest
    entries) and differs from it; the tied embedding stays tied (shuffled once); the same seed
    gives the same twin, another seed another."""
    from transformers import AutoModelForCausalLM

    parent = tiny_archs.BUILDERS["gpt2"](tmp_path / "gpt2")
    model = AutoModelForCausalLM.from_pretrained(parent)
    with torch.no_grad():  # biases and LayerNorm gains are parameters too: not constant here, so shuffling shows
        for _, w in model.named_parameters():
            if w.ndim == 1:
                w.copy_(torch.randn(w.shape, generator=torch.Generator().manual_seed(w.numel())))
    model.save_pretrained(parent)
    for out, seed in (("t1", 0), ("t2", 0), ("t3", 1)):
        build_twin_dir(parent, tmp_path / out, seed=seed, weights="shuffled")
    p = load_file(str(parent / "model.safetensors"))
    t1, t2, t3 = (load_file(str(tmp_path / t / "model.safetensors")) for t in ("t1", "t2", "t3"))
    params = {n for n, _ in model.named_parameters()}
    assert params == set(p) and {"transformer.wte.weight", "transformer.h.0.ln_1.weight"} <= params
    _assert_shuffled(p, t1, params)
    assert all(torch.equal(t1[k], t2[k]) for k in t1) and not torch.equal(t1["transformer.wte.weight"],
                                                                          t3["transformer.wte.weight"])
    twin = AutoModelForCausalLM.from_pretrained(tmp_path / "t1")
    assert twin.lm_head.weight.data_ptr() == twin.transformer.wte.weight.data_ptr()
    assert torch.equal(twin.transformer.wte.weight, t1["transformer.wte.weight"])
    assert json.loads((tmp_path / "t1" / "config.json").read_text()) == json.loads((parent / "config.json").read_text())


def test_shuffled_twin_keeps_a_random_model_s_scale_where_init_does_not(tmp_path):
    """The motivating case (issue 43): a random Qwen2 drawn at standard deviation 0.2
    (tests/tiny_archs.py); its `init` twin is drawn at the family's 0.02, its `shuffled`
    twin keeps each matrix's norm (and, the rotary `inv_freq` being a buffer, loads as one)."""
    parent = tiny_archs.BUILDERS["qwen2"](tmp_path / "qwen2")
    build_twin_dir(parent, tmp_path / "init", seed=0)
    build_twin_dir(parent, tmp_path / "shuffled", seed=0, weights="shuffled")
    p, i, s = (load_file(str(d / "model.safetensors")) for d in (parent, tmp_path / "init", tmp_path / "shuffled"))
    w = "model.layers.0.self_attn.q_proj.weight"
    assert float(p[w].std()) == pytest.approx(0.2, rel=0.1) and float(i[w].std()) == pytest.approx(0.02, rel=0.1)
    assert float(s[w].norm()) == pytest.approx(float(p[w].norm()), rel=1e-5) and not torch.equal(s[w], p[w])


def test_shuffled_tl_legacy_twin_permutes_parameters_keeps_buffers(tmp_path):
    """A legacy TransformerLens checkpoint (the attn-only stand-in): every W_*, b_*, LayerNorm
    tensor of its state dict is a permutation of the model's, the causal mask and IGNORE are
    kept; seeded."""
    from posmech.models.loading import MANIFEST, prepare_local_model, read_manifest
    from posmech.models.twin import tl_parameter_kind

    # the checkpoint as the Hub ships it (model_final.pth + config.json), converted by its model's rule
    legacy = save_attn_only_dir(AttnOnlySpec(n_ctx=8, d_vocab=12), tmp_path / "attn", weights="pth")
    prepare_local_model("m", {"source": str(legacy)}, tmp_path / "m")
    parent = Path(read_manifest(tmp_path / "m" / MANIFEST)["hf_dir"])
    for d in ("t", "u"):
        build_twin(f"m-{d}", {"twin_of": "m", "seed": 3, "twin_weights": "shuffled"}, tmp_path / "m" / MANIFEST, tmp_path / d)
    p, t, u = (load_file(str(d / "model.safetensors")) for d in (parent, tmp_path / "t/hf", tmp_path / "u/hf"))
    params = {k for k in p if tl_parameter_kind(k) is not None}
    assert {k for k in p if k.endswith((".mask", ".IGNORE"))} and not params & {k for k in p if k.endswith(".mask")}
    assert any(k.endswith("W_Q") for k in params) and any(k.endswith("W_pos") for k in params)
    _assert_shuffled(p, t, params)
    assert all(torch.equal(t[k], u[k]) for k in t)


def test_build_twin_records_its_weights_and_refuses_unknown_ones(tmp_path):
    from posmech.models.loading import MANIFEST, prepare_local_model

    parent = tiny_archs.BUILDERS["gpt2"](tmp_path / "gpt2")
    prepare_local_model("m", {"source": str(parent)}, tmp_path / "m")
    pm = tmp_path / "m" / MANIFEST
    man = build_twin("m-twin", {"twin_of": "m", "seed": 0, "twin_weights": "shuffled"}, pm, tmp_path / "m-twin")
    assert (man["twin_weights"], man["source"]) == ("shuffled", "twin of m (shuffled)")
    # a damaged shuffled twin is rebuilt from its model's weights, not from its config alone
    from posmech.models.loading import weights_fix

    assert "from the weights of 'm'" in weights_fix(man)
    assert "from the config.json of 'm'" in weights_fix({**man, "twin_weights": "init"})
    assert build_twin("m-t", {"twin_of": "m", "seed": 0}, pm, tmp_path / "m-t")["twin_weights"] == "init"
    with pytest.raises(PosmechError, match=r"`twins\.weights`.*'random'.*init, shuffled"):
        build_twin_dir(parent, tmp_path / "x", seed=0, weights="random")


def test_origin_from_verdicts_alone_learned_null_or_empty():
    """Without the findings (a table of verdicts only) the origin comes from the twin's verdict:
    learned where the twin fails, null where it holds too, no null without a twin."""
    rows = [("P6", "m", "holds", 0.5), ("P6", "m-twin", "holds", 0.4),
            ("P7", "m", "holds", 0.05), ("P7", "m-twin", "fails", 0.6),
            ("K1", "m", "fails", 0.1), ("K1", "m-twin", "holds", 0.9),
            ("K7", "m", "holds", 0.3), ("K7", "m-twin", "not measurable", None),
            ("P6", "n", "holds", 0.5)]
    t = pd.DataFrame([{"claim": c, "model": m, "verdict": v, "value": x, "reason": "r"} for c, m, v, x in rows],
                     columns=FINDINGS_COLUMNS)
    out = with_twins(t, {"m-twin": "m"}).set_index(["claim", "model"])
    assert list(out.reset_index().columns) == FINDINGS_COLUMNS + TWIN_COLUMNS
    assert out.loc[("P6", "m"), "origin"] == "on null" and out.loc[("P6", "m"), "twin_value"] == 0.4
    assert out.loc[("P7", "m"), "origin"] == "learned" and out.loc[("P7", "m"), "twin_verdict"] == "fails"
    assert out.loc[("K1", "m"), "origin"] == ""  # fails on the model: nothing to attribute
    assert out.loc[("K7", "m"), "origin"] == ""  # the twin cannot say
    assert out.loc[("P6", "n"), "twin_verdict"] == "" and out.loc[("P6", "m-twin"), "twin_of"] == "m"
    assert out.loc[("P6", "n"), "origin"] == "no null" and out.loc[("P6", "m-twin"), "origin"] == ""
