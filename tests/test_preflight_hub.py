"""A Hub model that cannot be fetched is a preflight error (before any job) naming its key
and the fixes: its ``source`` a Hub id, not fetched yet, not in the local Hugging Face
cache, and the Hub unreachable (``HF_HUB_OFFLINE``). A model in the cache is not an error:
``fetch_model`` copies it without the Hub (tested on a cache built here, in the Hugging
Face cache layout, holding tests/tiny_archs.py's OPT)."""

from __future__ import annotations

import shutil

import pytest
import yaml

from posmech.core.config import load_schema, validate_config
from posmech.core.errors import PosmechError
from posmech.models.loading import cached_hub_snapshot, fetch_hub_model
from posmech.pipeline.preflight import hub_problems, preflight
from tests import tiny_archs
from tests.workflow.conftest import REPO

SCHEMA = load_schema(REPO / "workflow" / "schemas" / "config.schema.yaml")
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache in ``tmp_path`` and the Hub offline."""
    from huggingface_hub import constants

    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def cache_model(cache, repo, src, commit=COMMIT, ref="main"):
    """``src``'s files as the cache's snapshot ``commit`` of ``repo`` (ref ``ref``)."""
    root = cache / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / ref).write_text(commit)
    snap = root / "snapshots" / commit
    shutil.copytree(src, snap)
    return snap


def config(tmp_path, source="someorg/tiny-opt"):
    cfg = yaml.safe_load((REPO / "config" / "ci.yaml").read_text())
    cfg["models"] = {"mine": {"source": source, "revision": "main"}}
    return validate_config(cfg, SCHEMA, base=str(tmp_path))


def test_uncached_hub_model_offline_is_named_before_any_job(tmp_path, hub_cache):
    cfg = config(tmp_path)
    (msg,) = hub_problems(cfg, tmp_path)
    assert msg.startswith("config key `models.mine.source`: Hub model 'someorg/tiny-opt' (revision 'main')")
    assert "HF_HUB_OFFLINE is set" in msg and "save_pretrained(dir)" in msg and "huggingface-cli download" in msg
    assert "`source`" in msg and "config/demo.yaml" in msg
    with pytest.raises(PosmechError, match="`models.mine.source`"):
        preflight(cfg, SCHEMA, REPO, base=tmp_path)
    preflight(cfg, SCHEMA, REPO, base=tmp_path, fetches_here=False)  # a dry run fetches nothing
    # fetched already: nothing to download
    hf = tmp_path / "resources/models/mine/hf"
    hf.mkdir(parents=True)
    (hf / "config.json").write_text("{}")
    assert hub_problems(cfg, tmp_path) == []


def test_cached_hub_model_is_fetched_offline(tmp_path, hub_cache):
    src = tiny_archs.opt(tmp_path / "opt")
    snap = cache_model(hub_cache, "someorg/tiny-opt", src)
    assert cached_hub_snapshot("someorg/tiny-opt", "main") == snap
    assert cached_hub_snapshot("someorg/tiny-opt", "v2") is None  # another revision is not cached
    cfg = config(tmp_path / "work")
    assert hub_problems(cfg, tmp_path / "work") == []
    man = fetch_hub_model("mine", {"source": "someorg/tiny-opt", "revision": "main"}, tmp_path / "out")
    assert (man["kind"], man["resolved_revision"], man["architecture"]["model_type"]) == ("hub", COMMIT, "opt")
    hf = tmp_path / "out" / man["hf_dir"]
    assert (hf / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()
    assert not (hf / "model.safetensors").is_symlink() and (hf / "tokenizer_config.json").is_file()


def test_uncached_hub_model_offline_fetch_names_the_ways_on(tmp_path, hub_cache):
    with pytest.raises(PosmechError, match="HF_HUB_OFFLINE is set") as err:
        fetch_hub_model("mine", {"source": "someorg/tiny-opt", "revision": "main"}, tmp_path / "out")
    assert "config/demo.yaml" in str(err.value) and not (tmp_path / "out" / "hf").exists()


def test_a_hub_checkpoint_is_fetched_at_its_revision_and_its_commit_recorded(tmp_path, hub_cache):
    """`revisions: [step1, step2]` (posmech.models.checkpoints): each checkpoint is the Hub
    model at that revision; its manifest records the revision asked for and the commit it
    resolved to (the cache's snapshot of that ref). A revision missing from the cache is a
    preflight error naming `revisions`."""
    from posmech.models.checkpoints import add_checkpoints

    src = tiny_archs.opt(tmp_path / "opt")
    cache_model(hub_cache, "someorg/tiny-opt", src)
    step1 = "1111111111111111111111111111111111111111"
    root = hub_cache / "models--someorg--tiny-opt"
    (root / "refs" / "step1").write_text(step1)
    shutil.copytree(src, root / "snapshots" / step1)
    cfg = config(tmp_path / "work")
    cfg["models"]["mine"]["revisions"] = ["step1", "step2"]
    problems = hub_problems(cfg, tmp_path / "work")
    assert len(problems) == 1 and "`models.mine.revisions`" in problems[0] and "'step2'" in problems[0]
    cfg["models"]["mine"]["revisions"] = ["step1"]
    assert hub_problems(cfg, tmp_path / "work") == []
    add_checkpoints(cfg)
    entry = cfg["models"]["mine@step1"]
    man = fetch_hub_model("mine@step1", {"source": entry["source"], "revision": entry["revision"]}, tmp_path / "out")
    assert (man["name"], man["revision"], man["resolved_revision"]) == ("mine@step1", "step1", step1)
