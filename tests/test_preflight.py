"""Checks before any job runs (issue 13, cases 1, 4, 5, 16): every problem names its key."""

import copy
import json
import re
from pathlib import Path

import pytest
import yaml

from posmech.core.config import load_schema, validate_config
from posmech.core.errors import PosmechError
from posmech.pipeline.preflight import (
    device_problems,
    jobs_run_locally,
    known_shape,
    preflight,
    strict_load,
)

REPO = Path(__file__).resolve().parents[1]
SCHEMA = load_schema(REPO / "workflow/schemas/config.schema.yaml")


def ci():
    return validate_config(yaml.safe_load((REPO / "config/ci.yaml").read_text()), copy.deepcopy(SCHEMA), str(REPO))


def _err(cfg, **kw):
    with pytest.raises(PosmechError) as info:
        preflight(cfg, SCHEMA, REPO, **kw)
    return str(info.value)


@pytest.mark.parametrize("name", ["demo.yaml", "ci.yaml"])
def test_shipped_offline_configs_pass(name):
    cfg = validate_config(yaml.safe_load((REPO / "config" / name).read_text()), SCHEMA, str(REPO))
    preflight(cfg, SCHEMA, REPO, configfiles=[REPO / "config" / name], base=REPO)


# ---------------------------------------------------------------- case 4: duplicate keys
def test_duplicate_section_is_refused_by_name(tmp_path):
    text = (REPO / "config/ci.yaml").read_text() + "\ncache:\n  batch_size: 4\n"
    p = tmp_path / "dup.yaml"
    p.write_text(text)
    assert yaml.safe_load(text)["cache"] == {"batch_size": 4}  # what YAML alone does: keeps the last
    msg = _err(ci(), configfiles=[p])
    assert "duplicate key 'cache'" in msg and str(p) in msg and "again on line" in msg


def test_duplicate_nested_key_is_refused(tmp_path):
    p = tmp_path / "dup.yaml"
    p.write_text("models:\n  demo:\n    train:\n      corpus: bible\n      steps: 5\n      steps: 60\n")
    with pytest.raises(PosmechError, match="duplicate key 'steps'.*line 5.*line 6"):
        strict_load(p)


# ---------------------------------------------------------------- case 1: every named file
def test_missing_induction_prompt_is_named():
    cfg = ci()
    cfg["interventions"]["induction_intervention"]["prompt"] = "resources/prompts/nope.yaml"
    msg = _err(cfg)
    assert "interventions.induction_intervention.prompt" in msg and "nope.yaml" in msg and "does not exist" in msg


def test_missing_averaging_prompts_is_named(tmp_path):
    cfg = ci()
    cfg["posembed_averaging"]["prompts"] = str(tmp_path / "gone.yaml")
    msg = _err(cfg)
    assert "posembed_averaging.prompts" in msg and "gone.yaml" in msg


def test_malformed_prompt_yaml_is_named(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("prompt: [unclosed\n")
    cfg = ci()
    cfg["interventions"]["induction_intervention"]["prompt"] = str(bad)
    msg = _err(cfg)
    assert "interventions.induction_intervention.prompt" in msg and "not valid YAML" in msg


def test_directory_as_prompt_file(tmp_path):
    cfg = ci()
    cfg["posembed_averaging"]["prompts"] = str(tmp_path)
    assert "is not a file" in _err(cfg)


# ---------------------------------------------------------------- cases 5, 16: the model's shape
def test_pin_to_undefined_model_is_an_error():
    cfg = ci()
    cfg["taxonomy"]["pin"] = {"gpt2": {"sharp": "L4H11"}}
    msg = _err(cfg)
    assert "taxonomy.pin.gpt2" in msg and "no model 'gpt2'" in msg


def test_pin_to_nonexistent_head_is_an_error():
    cfg = ci()  # demo: 2 layers, 2 heads
    cfg["taxonomy"]["pin"] = {"demo": {"sharp": "L1H1", "early": ["L0H5"]}}
    msg = _err(cfg)
    assert "taxonomy.pin.demo" in msg and "no head L0H5" in msg and "L1H1" not in msg.split("no head")[1][:6]


def test_n_ctx_beyond_a_local_models_context(prev_token_model_dir):
    cfg = ci()
    cfg["models"]["hb"] = {"source": str(prev_token_model_dir), "n_ctx": 13, "device": "cpu",
                           "dtype": "float32", "processing": "compatibility", "prepend_bos": True}
    shape = known_shape("hb", cfg["models"]["hb"])
    assert (shape.n_ctx, shape.n_layers, shape.n_heads) == (12, 2, 2)
    msg = _err(cfg)
    assert "models.hb.n_ctx" in msg and "13" in msg and "context of 12" in msg
    cfg["models"]["hb"]["n_ctx"] = 12
    # hb's 12 positions are too few for ci.yaml's positions (kernels, contextual, interventions,
    # attn_only: position_problems) and its tokenizer lacks the induction prompt's characters
    for section in ("kernels", "contextual", "interventions", "attn_only", "neurons", "posembed_averaging"):
        cfg[section]["models"] = ["demo"]
    preflight(cfg, SCHEMA, REPO)


def test_n_ctx_checked_against_a_fetched_models_config(tmp_path):
    hf = tmp_path / "resources/models/gpt2/hf"
    hf.mkdir(parents=True)
    (hf / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_positions": 1024, "n_embd": 768,
                                              "n_layer": 12, "n_head": 12}))
    cfg = ci()
    cfg["models"]["gpt2"] = {"source": "gpt2", "n_ctx": 2048}
    assert "models.gpt2.n_ctx" in _err(cfg, base=tmp_path)
    # not fetched yet: its n_ctx unknown, not refused (whether it can be fetched: tests/test_preflight_hub.py)
    preflight(cfg, SCHEMA, REPO, base=tmp_path / "elsewhere", fetches_here=False)


def test_knockout_phase_at_or_beyond_period():
    cfg = ci()
    cfg["interventions"]["prev_knockout"].update(period=3, phase=3)
    assert "interventions.prev_knockout.phase" in _err(cfg)


def test_knockout_layer_out_of_range():
    cfg = ci()
    cfg["interventions"]["prev_knockout"]["layers"] = [0, 99]
    msg = _err(cfg)
    assert "interventions.prev_knockout.layers" in msg and "no layer 99" in msg


def test_etc_positions_beyond_the_context():
    cfg = ci()  # demo n_ctx 32: positions 0..31
    cfg["kernels"]["etc_positions"] = [16, 32]
    msg = _err(cfg)
    assert "kernels.etc_positions" in msg and "positions [32]" in msg and "context of 32 tokens" in msg


def test_cuda_without_gpu_when_jobs_run_here(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = ci()
    cfg["models"]["demo"]["device"] = "cuda"
    assert "models.demo.device" in " ".join(device_problems(cfg, jobs_run_here=True))
    assert device_problems(cfg, jobs_run_here=False) == []


def test_every_problem_is_reported_at_once():
    cfg = ci()
    cfg["interventions"]["prev_knockout"].update(period=2, phase=5, layers=[7])
    cfg["taxonomy"]["pin"] = {"nope": {"sharp": "L0H0"}}
    msg = _err(cfg)
    assert msg.count("\n  - ") == 3


def test_executor_from_the_command_line(tmp_path):
    assert jobs_run_locally(["snakemake", "--cores", "8"], {})
    assert not jobs_run_locally(["snakemake", "--executor", "slurm"], {})
    assert not jobs_run_locally(["snakemake", "-e=slurm"][:1] + ["--executor=slurm"], {})
    assert not jobs_run_locally(["snakemake", "--workflow-profile", str(REPO / "profiles/slurm")], {})
    assert jobs_run_locally(["snakemake", "--workflow-profile", str(REPO / "profiles/default")], {})
    assert not jobs_run_locally(["snakemake"], {"SNAKEMAKE_PROFILE": str(REPO / "profiles/slurm")})


def test_n_ctx_beyond_context_is_an_error_at_run_time_too(prev_token_model_dir):
    """For a hub model not fetched when the run starts, the tokenize rule refuses it."""
    from posmech.models.loading import analysis_context

    assert analysis_context("m", {"n_ctx": None}, prev_token_model_dir) == 12
    assert analysis_context("m", {"n_ctx": 8}, prev_token_model_dir) == 8
    with pytest.raises(PosmechError, match="models.m.n_ctx.*beyond the model's context of 12"):
        analysis_context("m", {"n_ctx": 13}, prev_token_model_dir)


# ---------------------------------------------------------------- issue 32: what the config's files reveal
def _prompts(tmp_path, text, name="p.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_empty_and_misshapen_prompt_files_are_named(tmp_path):
    cfg = ci()
    cfg["posembed_averaging"]["prompts"] = _prompts(tmp_path, "", "empty.yaml")
    cfg["interventions"]["induction_intervention"]["prompt"] = _prompts(tmp_path, "", "ind.yaml")
    msg = _err(cfg)
    assert "config key `posembed_averaging.prompts`" in msg and "empty.yaml' is empty" in msg
    assert "config key `interventions.induction_intervention.prompt`" in msg and "ind.yaml" in msg
    assert "the file is empty" in msg and "NoneType" not in msg
    cfg["posembed_averaging"]["prompts"] = _prompts(tmp_path, "- a\n- b\n", "list.yaml")
    cfg["interventions"]["induction_intervention"]["prompt"] = _prompts(tmp_path, "prompt: x\n", "ind2.yaml")
    msg = _err(cfg)
    assert "list.yaml' is a list, not a mapping" in msg
    assert "missing key `words`" in msg and "missing key `targets`" in msg and "ind2.yaml" in msg


def test_prompt_id_not_in_the_prompt_file_is_named():
    cfg = ci()
    cfg["posembed_averaging"]["prompt_ids"] = ["apple_orange", "pear_plum"]
    msg = _err(cfg)
    assert "prompt_ids" in msg and "'pear_plum'" in msg and "apple_orange" in msg


def test_induction_words_missing_from_the_prompt_text(tmp_path):
    spec = yaml.safe_load((REPO / "resources/prompts/induction_chars.yaml").read_text())
    spec["prompt"] = "Lo OxRamEwe; Lo Ox".replace("Ram", "Rom")
    cfg = ci()
    cfg["interventions"]["induction_intervention"]["prompt"] = _prompts(tmp_path, yaml.safe_dump(spec))
    msg = _err(cfg)
    assert "does not contain `words` a+b+c = 'OxRamEwe'" in msg


def test_context_keys_beyond_the_models_context():
    cfg = ci()  # the trained demo model: context 32 (its train section)
    cfg["taxonomy"]["context"] = 64
    cfg["anatomy"]["context"] = 33
    msg = _err(cfg)
    assert "config key `taxonomy.context`: 64 tokens is beyond the context of model 'demo', 32" in msg
    assert "config key `anatomy.context`: 33" in msg
    cfg["taxonomy"]["context"], cfg["anatomy"]["context"] = 32, 16
    preflight(cfg, SCHEMA, REPO)


def test_local_config_json_that_is_not_json_names_file_and_line(tmp_path, prev_token_model_dir):
    import shutil

    d = tmp_path / "m"
    shutil.copytree(prev_token_model_dir, d)
    text = (d / "config.json").read_text().splitlines()
    text[2] = text[2] + ",,"
    (d / "config.json").write_text("\n".join(text))
    cfg = ci()
    cfg["models"]["mine"] = {**cfg["models"]["demo"], "source": str(d)}
    del cfg["models"]["mine"]["train"]
    msg = _err(cfg)
    assert f"config key `models.mine.source`: '{d / 'config.json'}' is not valid JSON: line 3" in msg


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    from posmech.pipeline.preflight import check_config

    p = tmp_path / "bad.yaml"
    p.write_text("models:\n  demo:\n    train: {corpus: bible\n    device: cpu\n")
    with pytest.raises(PosmechError) as info:
        check_config([p], REPO)
    msg = str(info.value)
    assert str(p) in msg and "line 4, column 11" in msg and "begun on line 3" in msg


def test_check_config_cli_runs_every_check_in_one_round(tmp_path):
    import subprocess
    import sys

    cfg = yaml.safe_load((REPO / "config/ci.yaml").read_text())
    cfg["taxonomy"] = {**cfg.get("taxonomy", {}), "context": 64}
    cfg["posembed_averaging"]["prompt_ids"] = ["nope"]
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(cfg))
    proc = subprocess.run([sys.executable, "-m", "posmech", "check-config", str(p), "-d", str(tmp_path)],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 1
    assert "taxonomy.context" in proc.stderr and "'nope'" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "posmech", "check-config", str(REPO / "config/ci.yaml")],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    bad = tmp_path / "syntax.yaml"  # issue 45: Snakemake names neither the file nor the line of this
    bad.write_text("models:\n  demo: {source: x\n")
    proc = subprocess.run([sys.executable, "-m", "posmech", "check-config", str(bad)],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 1 and str(bad) in proc.stderr and "is not valid YAML (line 3" in proc.stderr
    assert "check-config config/demo.yaml" in (REPO / "Makefile").read_text()  # make demo runs it first


# ---------------------------------------------------------------- issue 28: positions, lengths, tokens
SECTIONS = ("kernels", "contextual", "neurons", "interventions", "attn_only", "posembed_averaging", "taxonomy",
            "anatomy", "geometry", "posembed_attention", "cache", "tokenize")


@pytest.fixture(scope="module")
def wide_dir(tmp_path_factory):
    """A random-init GPT-2 with a context of 96 (the character tokenizer of tests/tiny_archs.py)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from tests import tiny_archs

    cfg = GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=96, **tiny_archs.COMMON)
    return tiny_archs._save(GPT2LMHeadModel(cfg), tmp_path_factory.mktemp("wide") / "gpt2", seed=3)


def with_wide(wide_dir, *sections):
    """ci.yaml with a second model, `wide` (context 96), in ``sections`` only."""
    cfg = ci()
    cfg["models"]["wide"] = {"source": str(wide_dir), "n_ctx": None, "device": "cpu", "dtype": "float32",
                             "processing": "compatibility", "prepend_bos": True, "revision": "main", "engine": "auto"}
    for s in SECTIONS:
        cfg[s]["models"] = ["demo", "wide"] if s in sections else ["demo"]
    return cfg


def test_kernels_positions_are_checked_per_model_with_values_that_fit(wide_dir):
    cfg = with_wide(wide_dir, "kernels")
    preflight(cfg, SCHEMA, REPO)  # ci.yaml's positions (<= 31) fit both contexts
    cfg["kernels"].update(etc_positions=[16, 40, 90], etc_heatmap_position=90)
    msg = _err(cfg)
    assert ("config key `kernels.etc_positions`: model 'demo' has a context of 32 tokens (from "
            "models.demo.train): positions [40, 90] are beyond it; set kernels.etc_positions to values <= 31, "
            "e.g. [3, 6, 12, 19, 25, 31]") in msg
    assert "kernels.etc_heatmap_position`: model 'demo'" in msg
    assert "model 'wide'" not in msg  # 90 < 96: fits the wider model
    cfg["kernels"].update(etc_positions=None, etc_heatmap_position=None, heatmap_max_position=None)
    preflight(cfg, SCHEMA, REPO)  # null: scaled to each model's context


def test_etc_heatmap_position_must_be_a_computed_position():
    cfg = ci()
    cfg["kernels"].update(heatmap_max_position=10, etc_positions=[16, 31], etc_heatmap_position=20)
    msg = _err(cfg)
    assert "config key `kernels.etc_heatmap_position`: 20 is not a computed query position of model 'demo'" in msg
    cfg["kernels"]["etc_heatmap_position"] = 16
    preflight(cfg, SCHEMA, REPO)


def test_neurons_from_position_below_the_context():
    cfg = ci()  # demo: context 32, destination positions 1..30
    cfg["neurons"]["from_position"] = 30
    msg = _err(cfg)
    assert "config key `neurons.from_position`: model 'demo' has a context of 32 tokens" in msg
    assert "set it to at most 29, e.g. 3" in msg
    cfg["neurons"]["from_position"] = 29
    preflight(cfg, SCHEMA, REPO)
    cfg["neurons"]["from_position"] = None
    preflight(cfg, SCHEMA, REPO)


def test_interventions_min_tokens_within_the_context():
    cfg = ci()
    cfg["interventions"]["min_tokens"] = 33
    msg = _err(cfg)
    assert "config key `interventions.min_tokens`: model 'demo' has a context of 32 tokens" in msg and "none has 33" in msg
    cfg["interventions"]["min_tokens"] = None  # min(64, 32)
    preflight(cfg, SCHEMA, REPO)


def test_attn_only_sequences_within_the_context():
    cfg = ci()
    cfg["attn_only"]["induction_score"]["half_length"] = 16  # [BOS] R R = 33 tokens
    msg = _err(cfg)
    assert "config key `attn_only.induction_score.half_length`: model 'demo' has a context of 32" in msg
    assert "are 33 tokens; set it to at most 15, which fits" in msg  # the value that fits (issue 45)
    cfg["attn_only"]["induction_score"]["half_length"] = 15
    preflight(cfg, SCHEMA, REPO)


def test_contextual_positions_with_values_that_fit():
    cfg = ci()
    cfg["contextual"]["positions"] = [24, 31]
    msg = _err(cfg)
    assert "config key `contextual.positions` (model demo)" in msg and "[31]" in msg
    assert "values that fit it: positions [12, 22, 30]" in msg
    cfg["contextual"]["positions"] = None
    preflight(cfg, SCHEMA, REPO)


def test_destination_token_must_be_one_token_of_the_models_tokenizer(wide_dir):
    cfg = with_wide(wide_dir, "contextual")
    cfg["contextual"]["destination_token"] = " the"  # 4 characters: 4 tokens of a character tokenizer
    msg = _err(cfg)
    assert "config key `contextual.destination_token`: ' the' is 4 tokens" in msg and "(model 'wide')" in msg
    assert "its nearest single tokens: " in msg and "<|endoftext|>" not in msg
    cfg["contextual"]["destination_token"] = "t"
    preflight(cfg, SCHEMA, REPO)


def test_prompts_longer_than_the_context_are_named(wide_dir):
    cfg = with_wide(wide_dir, "interventions", "posembed_averaging")
    preflight(cfg, SCHEMA, REPO)  # ci.yaml's short prompts fit 96 characters
    cfg["interventions"]["induction_intervention"]["prompt"] = "resources/prompts/induction_ninja.yaml"
    cfg["posembed_averaging"]["prompts"] = "resources/prompts/repeat_string.yaml"
    msg = _err(cfg)
    assert re.search(r"`interventions.induction_intervention.prompt`: the prompt of .* is \d+ tokens for model "
                     r"'wide' \(BOS included\) and its context is 96", msg), msg
    assert re.search(r"`posembed_averaging.prompts`: prompt 'apple_orange' is \d+ tokens for model 'wide'", msg), msg


def test_several_position_errors_come_in_one_round(wide_dir):
    cfg = with_wide(wide_dir, "contextual")
    cfg["kernels"]["etc_positions"] = [16, 40]
    cfg["neurons"]["from_position"] = 31
    cfg["interventions"]["min_tokens"] = 64
    cfg["contextual"]["destination_token"] = " the"
    msg = _err(cfg)
    for key in ("kernels.etc_positions", "neurons.from_position", "interventions.min_tokens",
                "contextual.destination_token"):
        assert f"config key `{key}`" in msg, key
    # one round names exactly these keys (the destination token once per model whose tokenizer is on
    # disk: 'wide' always, 'demo' too once `make demo` has trained it); etc_heatmap_position 31 stays
    # a computed position: no error
    named = set(re.findall(r"\n  - config key `([^`]+)`", msg))
    assert named == {"kernels.etc_positions", "neurons.from_position", "interventions.min_tokens",
                     "contextual.destination_token"}, msg


def test_semantic_schema_and_preflight_problems_come_in_one_round(tmp_path):
    """A missing local model directory (config.semantic_problems), a position beyond the
    trained model's context and an attn_only query outside its sequences: one message."""
    from posmech.pipeline.preflight import check_config

    cfg = yaml.safe_load((REPO / "config/ci.yaml").read_text())
    cfg["models"]["gone"] = {"source": str(tmp_path / "no-such-model")}
    cfg["kernels"]["etc_positions"] = [16, 40]
    cfg["attn_only"]["query"] = 20
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(cfg))
    with pytest.raises(PosmechError) as info:
        check_config([p], REPO, base=tmp_path)
    msg = str(info.value)
    assert "config key `models.gone.source`: local model directory" in msg
    assert "config key `kernels.etc_positions`: model 'demo'" in msg
    assert "config key `attn_only.query`: 20 is not a query position" in msg


def test_reference_zoom_and_first_positions_within_the_context():
    cfg = ci()  # demo: context 32
    cfg["neurons"]["reference_position"] = 32
    cfg["interventions"]["zoom_start"] = 31
    cfg["geometry"]["first_position"] = 29
    msg = _err(cfg)
    assert "config key `neurons.reference_position`: model 'demo' has a context of 32 tokens: 32 is outside 1..31" in msg
    assert "config key `interventions.zoom_start`: model 'demo' has a context of 32" in msg
    assert "config key `geometry.first_position`: model 'demo' has a context of 32 tokens: 29 leaves fewer" in msg
    cfg["neurons"]["reference_position"], cfg["interventions"]["zoom_start"], cfg["geometry"]["first_position"] = 31, 30, 28
    preflight(cfg, SCHEMA, REPO)


def _bpe_dir(d: Path) -> Path:
    """A byte-level BPE tokenizer (GPT-2's kind) trained on a few lines, saved as transformers does."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = ["In the beginning God created the heaven and the earth.", "Request: repeat \"hello\" exactly!",
            "an ox, a ram and an ass; don't they're we've"] * 20
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                                   clean_up_tokenization_spaces=True)
    fast.save_pretrained(d)
    (d / "config.json").write_text("{}")
    return d


@pytest.mark.parametrize("kind", ["bpe", "chars"])
def test_json_tokenizer_gives_what_autotokenizer_gives(tmp_path, kind):
    """The checks read tokenizer.json without transformers (JsonTokenizer); what they use of
    it equals AutoTokenizer's for the same directory: ids, offsets, BOS, special ids, decode."""
    from posmech.models.loading import load_tokenizer
    from posmech.pipeline.preflight import JsonTokenizer
    from tests import tiny_archs

    if kind == "bpe":
        d = _bpe_dir(tmp_path / "bpe")
    else:
        from posmech.models.handbuilt import char_tokenizer

        d = tmp_path / "chars"
        char_tokenizer(tiny_archs.V).save_pretrained(d)
    ref, light = load_tokenizer(d), JsonTokenizer(d)
    assert (light.bos_token_id, len(light)) == (ref.bos_token_id, len(ref))
    assert light.all_special_ids == sorted(ref.all_special_ids)
    for text in [" the", "In the beginning, God!", "don't  they're ?", "Lo OxRamEwe; Lo Ox", "\u00e9t\u00e9 \u2014 ok"]:
        a = ref(text, add_special_tokens=False, return_offsets_mapping=True)
        b = light(text, add_special_tokens=False, return_offsets_mapping=True)
        assert b.input_ids == list(a["input_ids"]) and b["offset_mapping"] == [tuple(o) for o in a["offset_mapping"]]
        assert light.decode(b.input_ids) == ref.decode(a["input_ids"])
    assert [light.decode([i]) for i in range(len(ref))] == [ref.decode([i]) for i in range(len(ref))]
