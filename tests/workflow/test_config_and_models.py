"""The DAG refuses bad configs before any job, takes local models, and fails fast offline."""


import pytest
import yaml

from posmech.data.tokens import read_tokens
from posmech.models import handbuilt as hb

from .conftest import REPO, snakemake


def _write(tmp_path, cfg):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _ci():
    return yaml.safe_load((REPO / "config/ci.yaml").read_text())


@pytest.mark.parametrize(
    "mutate, key",
    [
        (lambda c: c["models"]["demo"].update(devise="cpu"), "models.demo"),
        (lambda c: c["models"]["demo"]["train"].update(steps="ten"), "models.demo.train.steps"),
        (lambda c: c["models"].update(local={"source": "./missing-model"}), "models.local.source"),
        (lambda c: c.update(tokenize={"models": ["gpt3"]}), "tokenize.models"),
        (lambda c: c.update(corpora={}), "corpora"),
    ],
    ids=["unknown-key", "wrong-type", "missing-path", "unknown-model", "empty-corpora"],
)
def test_bad_config_fails_before_any_job(tmp_path, mutate, key):
    cfg = _ci()
    mutate(cfg)
    proc = snakemake(tmp_path, "-n", configfile=_write(tmp_path, cfg), timeout=120)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "invalid configuration" in out and key in out
    assert "Traceback" not in out
    assert not (tmp_path / "resources").exists() and not (tmp_path / "logs").exists()


def test_unseen_local_model_goes_through_model_rules(tmp_path):
    spec = hb.positional_spec(n_ctx=24, n_layer=1, n_head=1, d_head=25)
    model_dir = hb.save_model_dir(spec, tmp_path / "never-seen-model")
    cfg = _ci()
    cfg["models"] = {"handmade": {"source": str(model_dir), "device": "cpu", "processing": "raw"}}
    # its 24 positions: the kernels' query positions must lie within them (checked before any job)
    cfg["kernels"].update(etc_positions=[16, 23], heatmap_max_position=23, etc_heatmap_position=23)
    cfg["contextual"].update(positions=[16, 22], variance_positions=[8, 16, 22])
    cfg["corpora"]["bible"]["n_documents"] = 5
    work = tmp_path / "work"
    work.mkdir()
    proc = snakemake(work, "results/handmade/tokens/bible.h5", configfile=_write(tmp_path, cfg), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    toks = read_tokens(work / "results/handmade/tokens/bible.h5")
    assert toks.n_documents == 5 and toks.lengths().max() == 24
    manifest = (work / "resources/models/handmade/manifest.json").read_text()
    assert '"kind": "local"' in manifest


def test_full_study_offline_stops_with_the_ways_on(tmp_path):
    proc = snakemake(tmp_path, configfile=REPO / "config/config.yaml", timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "config/demo.yaml" in out and "`source`" in out
    # stopped before any job (preflight: the Hub models are neither fetched nor cached), naming each key
    assert "checked before any job runs" in out and "`models.gpt2.source`" in out
    assert not (tmp_path / "logs").exists()
    assert not list(tmp_path.rglob("*.partial"))
    assert not (tmp_path / "resources/models/gpt2/manifest.json").exists()


def test_local_model_that_disagrees_with_itself_stops_before_any_job(tmp_path):
    """A local directory whose config.json says 3 layers on 2 layers' weights, and that has
    no tokenizer files (issue 45, item 5): the run stops before any job naming both, and the
    outputs of an earlier run are left as they were."""
    import json

    from tests import tiny_archs

    d = tiny_archs.llama(tmp_path / "llama")
    cfg_json = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg_json, "num_hidden_layers": 3}))
    (d / "tokenizer.json").unlink()
    cfg = _ci()
    cfg["models"]["mine"] = {"source": str(d), "device": "cpu", "processing": "raw"}
    work = tmp_path / "work"
    earlier = {work / "results/mine/tokens/bible.h5": b"an earlier run's tokens",
               work / "results/demo/tokens/bible.h5": b"the demo model's tokens"}
    for p, data in earlier.items():
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    proc = snakemake(work, "results/mine/tokens/bible.h5", configfile=_write(tmp_path, cfg), timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "checked before any job runs" in out and "Traceback" not in out
    assert f"config key `models.mine.source`: '{d / 'config.json'}': `num_hidden_layers` is 3 but the weights " \
           "have 2 layers" in out, out[-3000:]
    assert f"config key `models.mine.source`: '{d}' has no tokenizer files" in out
    assert "0 tokens" not in out
    assert {p: p.read_bytes() for p in earlier} == earlier
    assert not (work / "logs").exists() and not (work / "resources/models/mine").exists()
