import json

import numpy as np
import pytest
import torch

from posmech import handbuilt as hb
from posmech.errors import PosmechError
from posmech.models import (
    build_char_tokenizer,
    check_hf_dir,
    fetch_hub_model,
    load_bridge,
    prepare_local_model,
    read_manifest,
)


def test_char_tokenizer_roundtrip_and_bos():
    tok = build_char_tokenizer(["abc def", "xyz!"])
    ids = tok("bad fez").input_ids
    assert tok.decode(ids) == "bad fez"
    assert tok.bos_token_id == 0 and 0 not in ids and len(ids) == 7


def test_local_model_manifest_and_bridge(tmp_path, prev_token_model_dir):
    m = prepare_local_model("mine", {"source": str(prev_token_model_dir)}, tmp_path)
    assert m["kind"] == "local" and m["resolved_revision"].startswith("local:")
    assert read_manifest(tmp_path)["hf_dir"] == str(prev_token_model_dir)
    bridge = load_bridge(m, device="cpu", processing="raw")
    with torch.inference_mode():
        logits = bridge(torch.zeros(1, 5, dtype=torch.long))
    assert logits.shape == (1, 5, 40)


def test_local_dir_without_safetensors_is_refused(tmp_path):
    spec = hb.positional_spec(n_ctx=4, n_layer=1, n_head=1)
    d = hb.save_model_dir(spec, tmp_path / "m")
    for f in d.glob("*.safetensors"):
        f.rename(f.with_suffix(".bin"))
    with pytest.raises(PosmechError, match="safetensors"):
        check_hf_dir(d, "config key `models.m.source`")


def test_unknown_processing_mode(prev_token_model_dir):
    with pytest.raises(PosmechError, match="processing"):
        load_bridge({"hf_dir": str(prev_token_model_dir), "name": "x"}, device="cpu", processing="weird")


def test_missing_manifest_names_rule(tmp_path):
    with pytest.raises(PosmechError, match="fetch_model"):
        read_manifest(tmp_path / "nope" / "manifest.json")


def test_hub_fetch_offline_fails_fast_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PosmechError) as info:
        fetch_hub_model("gpt2", {"source": "gpt2", "revision": "main"}, tmp_path / "gpt2")
    msg = str(info.value)
    assert "config/demo.yaml" in msg and "source" in msg
    assert not (tmp_path / "gpt2").exists()


def test_cuda_without_gpu_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    from posmech.models import resolve_device

    with pytest.raises(PosmechError, match="device"):
        resolve_device("cuda")
    assert resolve_device("auto") == "cpu"


def test_compatibility_mode_preserves_logits(prev_token_model_dir):
    m = {"hf_dir": str(prev_token_model_dir), "name": "x"}
    x = torch.tensor([[0, 3, 5, 7, 9, 11]])
    with torch.inference_mode():
        raw = load_bridge(m, device="cpu", processing="raw")(x)
        compat = load_bridge(m, device="cpu", processing="compatibility")(x)
    # compatibility mode centres the unembedding: logits agree up to a per-position constant
    d = (raw - compat).numpy()
    np.testing.assert_allclose(d - d.mean(-1, keepdims=True), 0, atol=1e-4)
