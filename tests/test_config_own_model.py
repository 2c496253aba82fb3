"""config/own-model.yaml, the template for running the study on one's own model (issue 28,
item 6): pointed at random-init tiny local models of other architectures and contexts
(tests/tiny_archs.py, no Hub), its checks before any job pass and Snakemake plans the DAG;
left as shipped, or without the short-context lines a small model needs, every problem is
reported in one round, each naming its key."""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from posmech.core.config import load_schema, redundant_keys, validate_config
from posmech.core.errors import PosmechError
from posmech.pipeline.preflight import check_config, known_shape, preflight
from tests import tiny_archs

REPO = Path(__file__).resolve().parents[1]
TEMPLATE = REPO / "config" / "own-model.yaml"
SCHEMA = load_schema(REPO / "workflow" / "schemas" / "config.schema.yaml")
BLOCK = re.compile(r"^# --- short context / character-level\n(.*?)^# --- end$", re.S | re.M)


def gpt2_dir(d: Path, n_ctx: int) -> Path:
    """A random-init 2-layer GPT-2 with a context of ``n_ctx`` (tiny_archs' tokenizer)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=n_ctx, **tiny_archs.COMMON)
    return tiny_archs._save(GPT2LMHeadModel(cfg), d, seed=7)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("own")
    return {"llama": tiny_archs.llama(root / "llama"), "gpt2": gpt2_dir(root / "gpt2", 96)}


def template_text(short: bool) -> str:
    """The template as shipped; ``short``: with its short-context lines uncommented."""
    text = TEMPLATE.read_text(encoding="utf-8")
    if short:
        block = BLOCK.search(text)
        assert block, "config/own-model.yaml lost its '# --- short context' ... '# --- end' block"
        text = text.replace(block.group(1), re.sub(r"^# ?", "", block.group(1), flags=re.M))
    return text


def pointed_at(tiny: dict[str, Path], short: bool) -> dict:
    """The template with `mine` a tiny Llama (context 32) and a second model, a GPT-2 with
    a context of 96, as a user would write them."""
    cfg = yaml.safe_load(template_text(short))
    cfg["models"]["mine"]["source"] = str(tiny["llama"])
    cfg["models"]["mine-gpt2"] = {"source": str(tiny["gpt2"])}
    return cfg


def test_template_parses_and_states_only_what_differs_from_the_schema():
    for short in (False, True):
        doc = yaml.safe_load(template_text(short))
        assert not redundant_keys(doc, SCHEMA), "own-model.yaml restates a schema default"
    assert "contextual" in yaml.safe_load(template_text(True)) and "contextual" not in yaml.safe_load(template_text(False))


def test_as_shipped_the_placeholder_source_is_named(tmp_path):
    with pytest.raises(PosmechError, match=r"models\.mine\.source.*does not exist"):
        check_config([TEMPLATE], REPO, base=tmp_path)


def test_two_tiny_models_of_other_contexts_pass_every_check_and_plan(tiny, tmp_path):
    cfg = pointed_at(tiny, short=True)
    shapes = {m: known_shape(m, cfg["models"][m]) for m in cfg["models"]}
    assert (shapes["mine"].n_ctx, shapes["mine-gpt2"].n_ctx) == (32, 96)
    path = tmp_path / "own.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    check_config([path], REPO, base=tmp_path)  # schema + every preflight check: no error
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    run = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--cores", "1", "--configfile", str(path),
                          "-d", str(tmp_path / "work")], cwd=REPO, capture_output=True, text=True, env=env,
                         timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = run.stdout + run.stderr
    for rule in ("kernels", "taxonomy", "geometry", "report"):  # families: docs/workflow.md
        assert f"rule {rule}:" in out, rule
    # rotary Llama: no W_pos analyses; the GPT-2 gets them
    assert "model mine (rotary" in out


def test_without_the_short_context_lines_every_problem_comes_in_one_round(tiny):
    cfg = validate_config(pointed_at(tiny, short=False), copy.deepcopy(SCHEMA), str(REPO))
    with pytest.raises(PosmechError) as info:
        preflight(cfg, SCHEMA, REPO)
    msg = str(info.value)
    problems = msg.split("\n  - ")[1:]
    # the char-level GPT-2 (context 96): " the" is 4 tokens, the posts' prompts are too long;
    # the Llama (context 32): the induction prompt is too long
    assert any("contextual.destination_token" in p and "mine-gpt2" in p and "nearest single tokens" in p
               for p in problems), msg
    assert any("interventions.induction_intervention.prompt" in p and "'mine'" in p for p in problems), msg
    assert any("interventions.induction_intervention.prompt" in p and "'mine-gpt2'" in p for p in problems), msg
    assert any("posembed_averaging.prompts" in p and "mine-gpt2" in p and "context is 96" in p for p in problems), msg
    # W_pos averaging does not run on the rotary Llama: its prompts are not checked for it
    assert not any("posembed_averaging.prompts" in p and "model 'mine'" in p for p in problems), msg
