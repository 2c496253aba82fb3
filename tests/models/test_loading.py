import json

import numpy as np
import pytest
import torch

from posmech.core.errors import PosmechError
from posmech.models import handbuilt as hb
from posmech.models.loading import (
    check_hf_dir,
    fetch_hub_model,
    load_bridge,
    prepare_local_model,
    read_manifest,
)
from posmech.models.training import build_char_tokenizer
from tests.conftest import flip_bytes


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
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))  # gpt2 not cached
    with pytest.raises(PosmechError) as info:
        fetch_hub_model("gpt2", {"source": "gpt2", "revision": "main"}, tmp_path / "gpt2")
    msg = str(info.value)
    assert "config/demo.yaml" in msg and "source" in msg
    assert not (tmp_path / "gpt2").exists()


def test_cuda_without_gpu_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    from posmech.models.loading import resolve_device

    with pytest.raises(PosmechError, match="device"):
        resolve_device("cuda")
    assert resolve_device("auto") == "cpu"


@pytest.mark.float32
def test_compatibility_mode_preserves_logits(prev_token_model_dir):
    m = {"hf_dir": str(prev_token_model_dir), "name": "x"}
    x = torch.tensor([[0, 3, 5, 7, 9, 11]])
    with torch.inference_mode():
        raw = load_bridge(m, device="cpu", processing="raw")(x)
        compat = load_bridge(m, device="cpu", processing="compatibility")(x)
    # compatibility mode centres the unembedding: logits agree up to a per-position constant
    d = (raw - compat).numpy()
    np.testing.assert_allclose(d - d.mean(-1, keepdims=True), 0, atol=1e-4)


def _legacy_dir(path):
    """A tiny legacy TransformerLens checkpoint directory (TL config.json + TL-property
    state dict as safetensors), as fetch_model writes for NeelNanda/* repos."""
    from safetensors.torch import save_file

    L, H, dm, dh, n, V = 2, 2, 8, 4, 10, 20
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=g)

    sd = {"embed.W_E": r(V, dm), "pos_embed.W_pos": r(n, dm), "ln_final.w": torch.ones(dm),
          "ln_final.b": torch.zeros(dm), "unembed.W_U": r(dm, V), "unembed.b_U": torch.zeros(V)}
    for layer in range(L):
        sd[f"blocks.{layer}.ln1.w"], sd[f"blocks.{layer}.ln1.b"] = torch.ones(dm), torch.zeros(dm)
        for x in "QKV":
            sd[f"blocks.{layer}.attn.W_{x}"], sd[f"blocks.{layer}.attn.b_{x}"] = r(H, dm, dh), r(H, dh)
        sd[f"blocks.{layer}.attn.W_O"], sd[f"blocks.{layer}.attn.b_O"] = r(H, dh, dm), r(dm)
    path.mkdir()
    save_file(sd, str(path / "model.safetensors"))
    cfg = dict(d_model=dm, n_layers=L, d_mlp=-1, d_head=dh, n_heads=H, n_ctx=n, d_vocab=V,
               act_fn="solu_ln", attn_only=True, normalization_type="LN", tokenizer_name=None)
    (path / "config.json").write_text(json.dumps(cfg))
    hb.char_tokenizer(V).save_pretrained(path)
    return path, sd


@pytest.mark.float32
def test_tl_legacy_directory_loads_with_exact_attention(tmp_path):
    """attn-only-2l style checkpoints: layer-0 pattern equals a hand computation."""
    from posmech.models.loading import model_context

    d, sd = _legacy_dir(tmp_path / "legacy")
    m = prepare_local_model("leg", {"source": str(d)}, tmp_path / "manifest")
    assert model_context(d) == 10
    bridge = load_bridge(m, device="cpu", processing="raw")
    toks = [0, 3, 4, 5]
    with torch.inference_mode():
        _, cache = bridge.run_with_cache(torch.tensor([toks]))
    x = sd["embed.W_E"][toks] + sd["pos_embed.W_pos"][:4]
    x = x - x.mean(-1, keepdim=True)
    x = x / (x.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt()
    q = torch.einsum("pd,hde->hpe", x, sd["blocks.0.attn.W_Q"]) + sd["blocks.0.attn.b_Q"][:, None]
    k = torch.einsum("pd,hde->hpe", x, sd["blocks.0.attn.W_K"]) + sd["blocks.0.attn.b_K"][:, None]
    s = (q @ k.transpose(-1, -2)) / 2.0
    s = s.masked_fill(torch.triu(torch.ones(4, 4, dtype=torch.bool), 1), -1e9).softmax(-1)
    np.testing.assert_allclose(cache["blocks.0.attn.hook_pattern"][0].numpy(), s.numpy(), atol=1e-5)


def test_the_engine_loads_the_tokenizer_only_when_an_analysis_reads_it(tmp_path, prev_token_model_dir):
    """Most analyses read pre-tokenised documents: loading the model must not import
    ``transformers`` (~1.3 CPU s per job); reading ``.tokenizer`` gives the directory's
    tokenizer."""
    import subprocess
    import sys

    prepare_local_model("mine", {"source": str(prev_token_model_dir)}, tmp_path)
    code = f"""
import sys
from posmech.models.loading import load_model
m = load_model({str(tmp_path)!r}, "cpu", engine="posmech")
print("after load:", "transformers" in sys.modules)
from transformers import AutoTokenizer
direct = AutoTokenizer.from_pretrained({str(prev_token_model_dir)!r})
print("same vocabulary:", m.tokenizer.get_vocab() == direct.get_vocab() != {{}})
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "after load: False" in out
    assert "same vocabulary: True" in out


def test_weight_view_reads_bfloat16_weights(tmp_path):
    """numpy has no bfloat16: such tensors are read through torch (as float32)."""
    from safetensors.torch import save_file

    from posmech.models.loading import weight_view

    w = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    save_file({"transformer.h.0.ln_1.weight": w.to(torch.bfloat16), "transformer.wpe.weight": w},
              str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    hb.char_tokenizer(8).save_pretrained(tmp_path)
    view = weight_view({"hf_dir": str(tmp_path), "name": "bf16"})
    np.testing.assert_array_equal(view.transformer.h[0].ln_1.weight, w.numpy())
    np.testing.assert_array_equal(view.wpe.weight, w.numpy())
    assert view.h[0].mlp is None and view.config.to_dict() == {"model_type": "gpt2"}


# --------------------------------------------------------------------------- verified weights (issue 32)
def _local_copy(src, tmp_path):
    import shutil

    d = tmp_path / "weights"
    shutil.copytree(src, d)
    man_dir = tmp_path / "manifest"
    prepare_local_model("mine", {"source": str(d)}, man_dir)
    return d, man_dir


def test_manifest_records_the_full_sha256_of_every_weights_file(tmp_path, prev_token_model_dir):
    import hashlib

    d, man_dir = _local_copy(prev_token_model_dir, tmp_path)
    m = json.loads((man_dir / "manifest.json").read_text())
    files = sorted(p.name for p in d.glob("*.safetensors"))
    assert sorted(m["weights_sha256"]) == files
    for name in files:
        assert m["weights_sha256"][name] == hashlib.sha256((d / name).read_bytes()).hexdigest()
    # the 16-digit digest is what it was (old caches and tables compare it)
    h = hashlib.sha256()
    for name in files:
        h.update(name.encode())
        h.update((d / name).read_bytes())
    assert m["weights_sha256_16"] == h.hexdigest()[:16]


def test_flipped_weight_bytes_stop_every_load_naming_file_hashes_and_fix(tmp_path, prev_token_model_dir):
    """64 bytes flipped in the middle of the weights (the header still valid, the file
    still loads): read_manifest and every loader refuse it, naming the file, the recorded
    and the actual sha256, and the fix."""
    import hashlib

    from posmech.models import loading

    d, man_dir = _local_copy(prev_token_model_dir, tmp_path)
    good = read_manifest(man_dir)
    weights = d / "model.safetensors"
    recorded = good["weights_sha256"]["model.safetensors"]
    flip_bytes(weights)
    check_hf_dir(d, "k")  # the damage is invisible to the structural check
    actual = hashlib.sha256(weights.read_bytes()).hexdigest()
    with pytest.raises(PosmechError) as info:
        read_manifest(man_dir)
    msg = str(info.value)
    assert str(weights) in msg and recorded in msg and actual in msg and "manifest.json" in msg
    unverified = read_manifest(man_dir, verify=False)
    for load in (lambda: loading.load_model(unverified, "cpu"), lambda: load_bridge(unverified, "cpu"),
                 lambda: loading.weight_view(unverified), lambda: loading.load_hf(unverified)):
        with pytest.raises(PosmechError, match=actual):
            load()
    # the identity that fingerprints caches does not follow the damage: it is the manifest's,
    # and the load refuses the bytes; a re-recorded manifest has another identity
    prepare_local_model("mine", {"source": str(d)}, man_dir)
    assert loading.weights_identity(read_manifest(man_dir)) != loading.weights_identity(good)


def test_weights_are_hashed_once_then_checked_by_stat(tmp_path, prev_token_model_dir, monkeypatch):
    import os

    from posmech.models import loading

    d, man_dir = _local_copy(prev_token_model_dir, tmp_path)
    assert (man_dir / loading.VERIFIED).is_file()  # recorded when the manifest was written
    calls = []
    real = loading.file_sha256
    monkeypatch.setattr(loading, "file_sha256", lambda p: calls.append(p) or real(p))
    loading._VERIFIED_HERE.clear()
    read_manifest(man_dir)
    assert calls == []
    loading._VERIFIED_HERE.clear()
    st = (d / "model.safetensors").stat()
    os.utime(d / "model.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # touched: hashed again
    read_manifest(man_dir)
    assert [os.path.basename(p) for p in calls] == ["model.safetensors"]
    loading._VERIFIED_HERE.clear()
    read_manifest(man_dir)
    assert len(calls) == 1


def test_old_manifest_with_the_16_digit_digest_is_verified(tmp_path, prev_token_model_dir):
    d, man_dir = _local_copy(prev_token_model_dir, tmp_path)
    m = json.loads((man_dir / "manifest.json").read_text())
    del m["weights_sha256"]
    (man_dir / "manifest.json").write_text(json.dumps(m))
    (man_dir / "weights.verified.json").unlink()
    read_manifest(man_dir)
    flip_bytes(d / "model.safetensors")
    with pytest.raises(PosmechError, match=f"records {m['weights_sha256_16']}"):
        read_manifest(man_dir)


def test_added_weights_file_is_refused(tmp_path, prev_token_model_dir):
    import shutil

    d, man_dir = _local_copy(prev_token_model_dir, tmp_path)
    shutil.copy(d / "model.safetensors", d / "extra.safetensors")
    with pytest.raises(PosmechError, match="extra.safetensors"):
        read_manifest(man_dir)


def test_preflight_reports_damaged_weights_of_a_model_on_disk(tmp_path, prev_token_model_dir):
    from posmech.pipeline.preflight import weights_problems

    d, _ = _local_copy(prev_token_model_dir, tmp_path)
    prepare_local_model("mine", {"source": str(d)}, tmp_path / "resources/models/mine")
    cfg = {"models": {"mine": {"source": str(d)}, "absent": {"source": "gpt2"}}}
    assert weights_problems(cfg, tmp_path) == []
    flip_bytes(d / "model.safetensors")
    [msg] = weights_problems(cfg, tmp_path)
    assert "model.safetensors" in msg and "sha256" in msg and "manifest.json" in msg


PLAIN_TOKENIZER_JOB = """
import sys
from posmech.models.loading import load_tokenizer
tok = load_tokenizer(sys.argv[1])
print("class:", type(tok).__name__)
print("models imported:", "transformers.models.auto" in sys.modules)
from transformers import AutoTokenizer
auto = AutoTokenizer.from_pretrained(sys.argv[1])
text = "In the beginning God created the heaven and the earth."
print("same:", type(auto) is type(tok) and auto.get_vocab() == tok.get_vocab() != {}
      and auto.all_special_tokens == tok.all_special_tokens and auto.bos_token_id == tok.bos_token_id
      and auto(text)["input_ids"] == tok(text)["input_ids"])
"""


def test_a_plain_fast_tokenizer_loads_as_autotokenizer_would_without_transformers_models(tmp_path):
    """load_tokenizer: the demo models' tokenizer (a tokenizer.json, class TokenizersBackend)
    is loaded by its class directly — the same class, vocabulary, special tokens and ids as
    AutoTokenizer's — without importing transformers.models (~3.5 CPU s a job); a tokenizer of
    another class (GPT-2's) still goes through AutoTokenizer."""
    import subprocess
    import sys

    from transformers import GPT2TokenizerFast

    from posmech.models.training import build_char_tokenizer

    plain, gpt2 = tmp_path / "plain", tmp_path / "gpt2"
    tok = build_char_tokenizer(["In the beginning God created the heaven and the earth."])
    tok.save_pretrained(plain)
    GPT2TokenizerFast(tokenizer_object=tok.backend_tokenizer, bos_token="<|endoftext|>",
                      eos_token="<|endoftext|>").save_pretrained(gpt2)
    assert json.loads((gpt2 / "tokenizer_config.json").read_text())["tokenizer_class"] not in (
        "TokenizersBackend", "PreTrainedTokenizerFast")
    for d, direct in ((plain, True), (gpt2, False)):
        out = subprocess.run([sys.executable, "-c", PLAIN_TOKENIZER_JOB, str(d)], capture_output=True, text=True,
                             check=True).stdout
        assert "same: True" in out, out
        assert f"models imported: {not direct}" in out, out
