"""A local model directory that disagrees with itself is named before any job (issue 45,
item 5): its tokenizer files missing, or its config.json's width, layers, vocabulary or
heads not those of its safetensors weights (read from the headers only). Each problem names
the config key of the directory, the config.json key and both values, in the one round of
the other config problems; an intact directory gives none."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from posmech.core.config import load_schema, validate_config
from posmech.core.errors import PosmechError
from posmech.models.model_dir import shape_problems, token_embedding, tokenizer_problem, weight_shapes
from posmech.pipeline.preflight import local_model_problems, preflight
from tests import tiny_archs

REPO = Path(__file__).resolve().parents[1]
SCHEMA = load_schema(REPO / "workflow/schemas/config.schema.yaml")
SECTIONS = ("kernels", "contextual", "neurons", "interventions", "attn_only", "posembed_averaging", "taxonomy",
            "anatomy", "geometry", "posembed_attention", "cache", "tokenize")


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    """A random-init GPT-2 (2 layers, 32 wide, 4 heads, 96 tokens) and its character tokenizer."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=tiny_archs.N_CTX, **tiny_archs.COMMON)
    return tiny_archs._save(GPT2LMHeadModel(cfg), tmp_path_factory.mktemp("m") / "gpt2", seed=0)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    """A random-init Llama (2 layers, 32 wide, 4 query and 2 key/value heads of 8, 96 tokens)."""
    return tiny_archs.llama(tmp_path_factory.mktemp("m") / "llama")


def edited(src: Path, dest: Path, **keys) -> Path:
    """A copy of model directory ``src`` at ``dest`` with ``keys`` set in its config.json."""
    shutil.copytree(src, dest)
    cfg = json.loads((dest / "config.json").read_text())
    cfg.update(keys)
    (dest / "config.json").write_text(json.dumps(cfg, indent=2))
    return dest


def with_model(d: Path, *sections: str, name: str = "mine") -> dict:
    """ci.yaml with model ``name`` at ``d``, in ``sections`` only (the demo model in all)."""
    cfg = validate_config(yaml.safe_load((REPO / "config/ci.yaml").read_text()), copy.deepcopy(SCHEMA), str(REPO))
    cfg["models"][name] = {"source": str(d), "n_ctx": None, "device": "cpu", "dtype": "float32",
                           "processing": "compatibility", "prepend_bos": True, "revision": "main", "engine": "auto"}
    for s in SECTIONS:
        cfg[s]["models"] = ["demo", name] if s in sections else ["demo"]
    return cfg


def problems(cfg: dict) -> list[str]:
    """The problems of the whole pre-run check, one per item."""
    with pytest.raises(PosmechError) as info:
        preflight(cfg, SCHEMA, REPO)
    return str(info.value).split("\n  - ")[1:]


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_an_intact_directory_passes(arch, gpt2_dir, llama_dir):
    d = {"gpt2": gpt2_dir, "llama": llama_dir}[arch]
    preflight(with_model(d, "contextual"), SCHEMA, REPO)
    assert shape_problems(d, json.loads((d / "config.json").read_text())) == []
    assert tokenizer_problem(d) is None


@pytest.mark.parametrize("arch, key, value, words", [
    ("gpt2", "n_embd", 64, "`n_embd` is 64 but the weights are 32 wide (the token embedding "
                           "`transformer.wte.weight` in model.safetensors is [96, 32])"),
    ("llama", "hidden_size", 64, "`hidden_size` is 64 but the weights are 32 wide (the token embedding "
                                 "`model.embed_tokens.weight` in model.safetensors is [96, 32])"),
    ("gpt2", "n_layer", 3, "`n_layer` is 3 but the weights have 2 layers (0-1: the last is `transformer.h.1.…`)"),
    ("llama", "num_hidden_layers", 3, "`num_hidden_layers` is 3 but the weights have 2 layers (0-1: the last is "
                                      "`model.layers.1.…`)"),
    ("gpt2", "n_layer", 1, "`n_layer` is 1 but the weights have 2 layers"),
    ("gpt2", "vocab_size", 100, "`vocab_size` is 100 but the token embedding `transformer.wte.weight` in "
                                "model.safetensors is [96, 32]: 96 tokens"),
    ("llama", "vocab_size", 50257, "`vocab_size` is 50257 but the token embedding `model.embed_tokens.weight` in "
                                   "model.safetensors is [96, 32]: 96 tokens"),
    ("llama", "num_attention_heads", 8, "`num_attention_heads` 8 x head size `head_dim` 8 = 64, but "
                                        "`model.layers.0.self_attn.q_proj.weight` in model.safetensors is [32, 32] "
                                        "(32 wide)"),
    ("llama", "num_key_value_heads", 4, "`num_key_value_heads` 4 x head size `head_dim` 8 = 32, but "
                                        "`model.layers.0.self_attn.k_proj.weight` in model.safetensors is [16, 32]"),
])
def test_a_config_json_that_disagrees_with_its_weights_is_named(tmp_path, gpt2_dir, llama_dir, arch, key, value,
                                                                words):
    d = edited({"gpt2": gpt2_dir, "llama": llama_dir}[arch], tmp_path / "m", **{key: value})
    found = problems(with_model(d))
    mine = [p for p in found if "models.mine.source" in p]
    assert len(mine) == 1, found
    assert mine[0].startswith(f"config key `models.mine.source`: '{d / 'config.json'}': ")
    assert words in mine[0], mine[0]
    assert "correct that key in config.json" in mine[0]


def test_a_width_only_the_attention_tells(tmp_path):
    """OPT's token embedding may be narrower than the model (``word_embed_proj_dim``): the
    width is then told by the attention projections, which no side of 48 fits."""
    d = edited(tiny_archs.opt(tmp_path / "opt"), tmp_path / "m", hidden_size=48)
    (msg,) = shape_problems(d, json.loads((d / "config.json").read_text()))
    assert "`hidden_size` is 48 but no side of layer 0's attention projections is 48 wide" in msg
    assert "`model.decoder.layers.0.self_attn.q_proj.weight` in model.safetensors is [32, 32]" in msg


def test_a_legacy_transformerlens_checkpoint_is_read_by_its_own_names(tmp_path):
    from posmech.models.handbuilt import AttnOnlySpec, save_attn_only_dir

    d = save_attn_only_dir(AttnOnlySpec(n_ctx=8, d_vocab=12), tmp_path / "tl")
    cfg = json.loads((d / "config.json").read_text())
    assert shape_problems(d, cfg) == [] and tokenizer_problem(d, cfg) is None
    assert token_embedding(weight_shapes(d), cfg["d_vocab"]) == "embed.W_E"
    (msg,) = shape_problems(d, {**cfg, "n_heads": cfg["n_heads"] + 1})
    assert f"`n_heads` is {cfg['n_heads'] + 1} but `blocks.0.attn.W_Q` in model.safetensors is [2, " in msg
    (msg,) = shape_problems(d, {**cfg, "d_vocab": 20})
    assert "`d_vocab` is 20 but the token embedding `embed.W_E`" in msg
    # a .pth checkpoint (converted by fetch_model): its tokenizer, or the `tokenizer_name` it gives
    pth = save_attn_only_dir(AttnOnlySpec(n_ctx=8, d_vocab=12), tmp_path / "pth", weights="pth", tokenizer=False)
    pcfg = json.loads((pth / "config.json").read_text())
    assert "nor a `tokenizer_name` in its config.json" in tokenizer_problem(pth, pcfg)
    assert tokenizer_problem(pth, {**pcfg, "tokenizer_name": "gpt2"}) is None
    cfg = with_model(pth)
    assert [p for p in local_model_problems(cfg) if "has no tokenizer files" in p]


@pytest.mark.parametrize("remove", [("tokenizer.json", "tokenizer_config.json"), ("tokenizer.json",)],
                         ids=["no-tokenizer-files", "tokenizer-config-only"])
def test_a_directory_without_its_tokenizer_is_named_not_counted_as_no_tokens(tmp_path, gpt2_dir, remove):
    d = tmp_path / "m"
    shutil.copytree(gpt2_dir, d)
    for f in remove:
        (d / f).unlink()
    found = problems(with_model(d, "contextual"))  # ci.yaml's destination_token ' ' is checked on it
    assert not [p for p in found if "0 tokens" in p or "destination_token" in p], found
    (msg,) = [p for p in found if "models.mine.source" in p]
    assert msg.startswith(f"config key `models.mine.source`: '{d}' has no tokenizer files (none of tokenizer.json; "
                          "vocab.json with merges.txt; vocab.txt; a sentencepiece *.model)")
    assert "copy the tokenizer files from where the model came from" in msg and ".save_pretrained(dir)" in msg


def test_vocab_without_merges_is_no_tokenizer(tmp_path, gpt2_dir):
    d = tmp_path / "m"
    shutil.copytree(gpt2_dir, d)
    (d / "tokenizer.json").unlink()
    (d / "vocab.json").write_text("{}")
    assert "it has vocab.json without merges.txt" in tokenizer_problem(d)
    (d / "merges.txt").write_text("#version: 0.2\n")
    assert tokenizer_problem(d) is None


def test_sharded_weights_are_read_through_their_index(tmp_path):
    from transformers import LlamaForCausalLM

    src = tiny_archs.llama(tmp_path / "one")
    d = tmp_path / "sharded"
    LlamaForCausalLM.from_pretrained(src).save_pretrained(d, max_shard_size="20KB")
    shutil.copy(src / "tokenizer.json", d)
    shards = sorted(p.name for p in d.glob("*.safetensors"))
    assert len(shards) > 1 and (d / "model.safetensors.index.json").is_file()
    cfg = json.loads((d / "config.json").read_text())
    assert shape_problems(d, cfg) == [] and local_model_problems(with_model(d)) == []
    (msg,) = shape_problems(d, {**cfg, "num_hidden_layers": 5})
    assert "`num_hidden_layers` is 5 but the weights have 2 layers" in msg
    (d / shards[-1]).unlink()
    (msg,) = local_model_problems(with_model(d))
    assert f"shard(s) {shards[-1]} named by model.safetensors.index.json are missing" in msg


def test_weights_that_are_not_safetensors_are_named_once_without_a_shape_check(tmp_path, gpt2_dir):
    d = edited(gpt2_dir, tmp_path / "m", n_layer=3)
    (d / "model.safetensors").rename(d / "pytorch_model.bin")
    (msg,) = local_model_problems(with_model(d))
    assert msg == (f"config key `models.mine.source`: '{d}' has no .safetensors weights; posmech loads safetensors "
                   "only (re-save with `model.save_pretrained(dir, safe_serialization=True)`)")


def test_each_directory_is_read_once_from_its_headers(tmp_path, gpt2_dir, monkeypatch):
    """Two models on one directory: one message naming both keys, each header read once."""
    from posmech.models import loading

    d = edited(gpt2_dir, tmp_path / "m", n_embd=64)
    cfg = with_model(d)
    cfg["models"]["again"] = {**cfg["models"]["mine"], "processing": "raw"}
    reads = []
    real = loading.safetensors_header
    monkeypatch.setattr(loading, "safetensors_header", lambda p: reads.append(p) or real(p))
    (msg,) = local_model_problems(cfg)
    assert msg.startswith("config keys `models.mine.source`, `models.again.source`: ") and "`n_embd` is 64" in msg
    assert reads == [d / "model.safetensors"]


def test_one_round_with_the_other_problems(tmp_path, gpt2_dir):
    d = edited(gpt2_dir, tmp_path / "m", n_layer=3)
    (d / "tokenizer.json").unlink()
    cfg = with_model(d)
    cfg["kernels"]["etc_positions"] = [16, 40]
    found = problems(cfg)
    assert any("`n_layer` is 3" in p for p in found) and any("has no tokenizer files" in p for p in found)
    assert any(p.startswith("config key `kernels.etc_positions`") for p in found)


def test_check_config_stops_naming_the_mismatch_and_deletes_nothing(tmp_path, gpt2_dir):
    """``python -m posmech check-config`` on a config pointing at the directory: rc 1, the
    message, and the outputs already in the working directory untouched."""
    d = edited(gpt2_dir, tmp_path / "m", n_embd=64)
    work = tmp_path / "work"
    done = work / "results" / "mine" / "tokens" / "bible.h5"
    done.parent.mkdir(parents=True)
    done.write_bytes(b"an output of an earlier run")
    cfg = yaml.safe_load((REPO / "config/ci.yaml").read_text())
    cfg["models"]["mine"] = {"source": str(d), "device": "cpu"}
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(cfg))
    proc = subprocess.run([sys.executable, "-m", "posmech", "check-config", str(p), "-d", str(work)],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 1, proc.stderr
    assert (f"config key `models.mine.source`: '{d / 'config.json'}': `n_embd` is 64 but the weights are 32 wide"
            in proc.stderr), proc.stderr
    assert "Traceback" not in proc.stderr
    assert done.read_bytes() == b"an output of an earlier run"
    assert sorted(str(f.relative_to(work)) for f in work.rglob("*") if f.is_file()) == ["results/mine/tokens/bible.h5"]
