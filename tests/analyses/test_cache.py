"""The activation cache on models whose activations are known (hand-built) or computed
independently (Hugging Face ``hidden_states``), resumability after ``kill -9``, and the
rejection of partial/corrupt files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from posmech.analyses.cache import (
    CHECKPOINT,
    PARTIAL,
    cache_activations,
    load_capture,
    read_document,
    read_position_means,
    read_positions,
)
from posmech.data.tokens import TokenSet
from posmech.core.errors import PosmechError
from posmech.settings import defaults
from posmech.models import handbuilt as hb
from posmech.models.loading import load_bridge

N_CTX, D_VOCAB = 12, 30


def token_set(docs: list[np.ndarray]) -> TokenSet:
    off = np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype(np.int64)
    return TokenSet(np.concatenate(docs).astype(np.int32), off, {"config_hash": "test"},
                    [f"doc {j}" for j in range(len(docs))])


def random_docs(n: int, seed: int = 0, n_ctx: int = N_CTX) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, n_ctx + 1, size=n)
    lengths[0] = n_ctx
    return [np.concatenate([[0], rng.integers(1, D_VOCAB, size=k - 1)]).astype(np.int32) for k in lengths]


@pytest.fixture(scope="module")
def token_model(tmp_path_factory):
    """Hand-built model with zero attention/MLP outputs: the residual stream at every
    layer is exactly ``W_E[t] + W_pos[p]`` (rows centred, so compatibility mode's
    centring changes nothing)."""
    spec = hb.positional_spec(n_ctx=N_CTX, n_layer=2, n_head=2, d_vocab=D_VOCAB,
                              scores={(0, 1): hb.previous_token_scores(N_CTX)})
    rng = np.random.default_rng(1)
    W_E = rng.normal(size=(D_VOCAB, spec.d_model))
    spec.W_E = W_E - W_E.mean(axis=1, keepdims=True)
    spec.W_U = np.zeros((spec.d_model, D_VOCAB))
    path = hb.save_model_dir(spec, tmp_path_factory.mktemp("models") / "tokenmodel")
    return spec, path


def analytic(spec: hb.Spec, doc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """resid ``[len, d]`` and its layer norm (no affine, eps 1e-12) ``[len, d]``."""
    x = spec.W_E[doc] + spec.W_pos[: len(doc)]
    c = x - x.mean(axis=1, keepdims=True)
    return x, c / np.sqrt((c**2).mean(axis=1, keepdims=True) + 1e-12)


@pytest.mark.float32
@pytest.mark.parametrize("engine", ["bridge", "posmech"])
@pytest.mark.parametrize("processing", ["compatibility", "raw"])
def test_cache_equals_analytic_residual_stream(token_model, tmp_path, processing, engine):
    spec, path = token_model
    bridge = load_capture({"hf_dir": str(path), "name": "tok"}, "cpu", "float32", processing, engine)
    docs = random_docs(9)
    out = tmp_path / "acts.h5"
    summary = cache_activations(bridge, token_set(docs), out, defaults("cache", batch_size=4, storage_dtype="float32"),
                                {"model": "tok", "processing": processing})
    assert summary["n_documents"] == 9 and summary["resumed_from"] == 0
    for j, doc in enumerate(docs):
        x, ln = analytic(spec, doc)
        for layer in range(3):  # 2 blocks + final residual
            np.testing.assert_allclose(read_document(out, "resid_pre", layer, j), x, atol=2e-5)
        for layer in range(2):
            np.testing.assert_allclose(read_document(out, "ln1_out", layer, j), ln, atol=2e-4)
    mean, count = read_position_means(out, "resid_pre")
    assert mean.shape == (3, N_CTX, spec.d_model) and mean.dtype == np.float64
    lengths = np.array([len(d) for d in docs])
    np.testing.assert_array_equal(count, [(lengths > p).sum() for p in range(N_CTX)])
    for p in range(N_CTX):
        expected = np.mean([analytic(spec, d)[0][p] for d in docs if len(d) > p], axis=0)
        np.testing.assert_allclose(mean[:, p], np.broadcast_to(expected, (3, spec.d_model)), atol=2e-6)
    ln_mean, ln_count = read_position_means(out, "ln1_out")
    assert ln_mean.shape == (2, N_CTX, spec.d_model)
    np.testing.assert_array_equal(ln_count, count)
    expected = np.mean([analytic(spec, d)[1][3] for d in docs if len(d) > 3], axis=0)
    np.testing.assert_allclose(ln_mean[1, 3], expected, atol=2e-5)
    # positions 2..5 of every document at layer 1; NaN past a document's end
    block, lens = read_positions(out, "resid_pre", 1, 2, 6)
    short = int(np.argmin(lengths))
    np.testing.assert_allclose(block[0], analytic(spec, docs[0])[0][2:6], atol=2e-5)
    assert np.isnan(block[short, max(0, lengths[short] - 2):]).all()


def test_means_are_exact_whatever_the_storage_dtype(token_model, tmp_path):
    _, path = token_model
    bridge = load_bridge({"hf_dir": str(path), "name": "tok"}, device="cpu")
    tokens = token_set(random_docs(7, seed=3))
    means = {}
    for dtype in ("float16", "float32"):
        out = tmp_path / f"{dtype}.h5"
        cache_activations(bridge, tokens, out, defaults("cache", batch_size=3, storage_dtype=dtype), {"model": "tok"})
        means[dtype] = read_position_means(out, "resid_pre")[0]
        with h5py.File(out) as f:
            assert f["activations/resid_pre"].dtype == np.dtype(dtype)
    np.testing.assert_array_equal(means["float16"], means["float32"])
    a16 = read_document(tmp_path / "float16.h5", "ln1_out", 1, 2).astype(np.float64)
    a32 = read_document(tmp_path / "float32.h5", "ln1_out", 1, 2)
    assert np.abs(a16 - a32).max() < 1e-2 and np.abs(a16 - a32).max() > 0  # really stored in half precision


def _gpt2_dir(tmp_path: Path) -> Path:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=D_VOCAB, n_positions=N_CTX, n_embd=32, n_layer=2, n_head=4)
    return _save_with_ln1_affine(GPT2LMHeadModel(cfg), tmp_path)


def _save_with_ln1_affine(m: torch.nn.Module, path: Path) -> Path:
    """Give every ln_1 a non-trivial affine (so raw and compatibility modes differ) and
    save the model with a character tokenizer."""
    with torch.no_grad():
        for blk in m.transformer.h:
            blk.ln_1.weight.normal_(1.0, 0.3)
            blk.ln_1.bias.normal_(0.0, 0.3)
    m.save_pretrained(path, safe_serialization=True)
    hb.char_tokenizer(D_VOCAB).save_pretrained(path)
    return path


def _gpt_neo_dir(tmp_path: Path) -> Path:
    """A random GPT-Neo (TinyStories' architecture: Linear projections, no q/k/v biases,
    global and local attention layers) with a non-trivial ln_1 affine."""
    from transformers import GPTNeoConfig, GPTNeoForCausalLM

    torch.manual_seed(1)
    cfg = GPTNeoConfig(vocab_size=D_VOCAB, max_position_embeddings=N_CTX, hidden_size=32, num_layers=2,
                       num_heads=4, attention_types=[[["global", "local"], 1]], window_size=4)
    return _save_with_ln1_affine(GPTNeoForCausalLM(cfg), tmp_path)


def hf_reference(path: Path, docs: list[np.ndarray]) -> list[dict[str, np.ndarray]]:
    """Per document: ``hidden`` ``[L + 1, len, d]`` (block inputs, then ln_f's input) and
    ``ln1`` ``[L, len, d]`` (ln_1 outputs), from the Hugging Face model one document at a time."""
    from posmech.models.loading import load_hf

    model, _ = load_hf({"hf_dir": str(path), "name": "ref"})
    out = []
    for doc in docs:
        seen: dict[str, torch.Tensor] = {}
        hooks = [model.transformer.ln_f.register_forward_pre_hook(lambda m, a: seen.__setitem__("final", a[0]))]
        for i, blk in enumerate(model.transformer.h):
            hooks.append(blk.ln_1.register_forward_hook(lambda m, a, o, i=i: seen.__setitem__(f"ln{i}", o)))
        with torch.inference_mode():
            hs = model(torch.as_tensor(doc[None], dtype=torch.long), output_hidden_states=True).hidden_states
        for h in hooks:
            h.remove()
        L = len(model.transformer.h)
        out.append({
            "hidden": np.stack([hs[i][0].numpy() for i in range(L)] + [seen["final"][0].numpy()]),
            "ln1": np.stack([seen[f"ln{i}"][0].numpy() for i in range(L)]),
        })
    return out


@pytest.mark.float32
@pytest.mark.parametrize("engine", ["bridge", "posmech"])
@pytest.mark.parametrize("processing", ["raw", "compatibility"])
def test_cache_matches_huggingface_hidden_states(tmp_path, processing, engine):
    path = _gpt2_dir(tmp_path / "gpt2")
    docs = random_docs(6, seed=5)
    model = load_capture({"hf_dir": str(path), "name": "g"}, "cpu", "float32", processing, engine)
    out = tmp_path / "acts.h5"
    cache_activations(model, token_set(docs), out, defaults("cache", batch_size=4), {"model": "g"})
    with h5py.File(out) as f:
        assert f.attrs["engine"] == engine
    ref = hf_reference(path, docs)
    for j, r in enumerate(ref):
        hidden, ln1 = r["hidden"], r["ln1"]
        if processing == "compatibility":  # centred writing weights: the residual is centred;
            hidden = hidden - hidden.mean(-1, keepdims=True)  # ln1 is the LN without its affine
            ln1 = hidden[:-1] / np.sqrt((hidden[:-1] ** 2).mean(-1, keepdims=True) + 1e-5)
        for layer in range(3):
            got = read_document(out, "resid_pre", layer, j).astype(np.float64)
            np.testing.assert_allclose(got, hidden[layer], rtol=2e-3, atol=2e-3)
        for layer in range(2):
            got = read_document(out, "ln1_out", layer, j).astype(np.float64)
            np.testing.assert_allclose(got, ln1[layer], rtol=2e-3, atol=4e-3)
    mean, count = read_position_means(out, "resid_pre")
    lengths = np.array([len(d) for d in docs])
    p = 4
    expected = np.mean([r["hidden"][:, p] for r, n in zip(ref, lengths, strict=True) if n > p], axis=0)
    if processing == "compatibility":
        expected = expected - expected.mean(-1, keepdims=True)
    np.testing.assert_allclose(mean[:, p], expected, atol=1e-5)
    assert count[p] == (lengths > p).sum()


# --------------------------------------------------------------------------- resumability
CHILD = """
import sys, time, numpy as np
sys.path.insert(0, {tests!r})
from test_cache import token_set, random_docs
from posmech.analyses.cache import cache_activations
from posmech.settings import defaults
import posmech.analyses.cache as C
from posmech.models.loading import load_bridge
bridge = load_bridge({{"hf_dir": {model!r}, "name": "tok"}}, device="cpu")
orig = C.forward_batch
def slow(*a, **k):
    time.sleep(0.15)
    return orig(*a, **k)
C.forward_batch = slow
cache_activations(bridge, token_set(random_docs(40, seed=7)), {out!r}, defaults("cache", batch_size=2, checkpoint_seconds=0),
                  {{"model": "tok"}})
"""


def _datasets(path: Path) -> tuple[dict[str, np.ndarray], dict]:
    out = {}
    with h5py.File(path) as f:
        f.visititems(lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
        attrs = {k: v for k, v in f.attrs.items() if k not in ("created", "git_commit")}
    return out, attrs


def assert_same_file(a: Path, b: Path) -> None:
    (da, aa), (db, ab) = _datasets(a), _datasets(b)
    assert sorted(da) == sorted(db)
    for k in da:
        np.testing.assert_array_equal(da[k], db[k], err_msg=k)
    assert {k: str(v) for k, v in aa.items()} == {k: str(v) for k, v in ab.items()}


def test_kill_9_mid_run_then_rerun_equals_uninterrupted_run(token_model, tmp_path):
    _, model = token_model
    out = tmp_path / "killed" / "acts.h5"
    code = CHILD.format(tests=str(Path(__file__).parent), model=str(model), out=str(out))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE)
    ckpt = out.with_name(out.name + CHECKPOINT)
    deadline = time.time() + 120
    done = 0
    while time.time() < deadline and proc.poll() is None:
        if ckpt.exists():
            try:
                with np.load(ckpt) as z:
                    done = int(z["docs_done"])
            except (OSError, ValueError, KeyError):
                pass
            if done >= 8:
                break
        time.sleep(0.02)
    assert proc.poll() is None, f"child ended before it could be killed: {proc.stderr.read().decode()[-2000:]}"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not out.exists() and out.with_name(out.name + PARTIAL).exists()
    with pytest.raises(PosmechError):
        read_position_means(out, "resid_pre")

    bridge = load_bridge({"hf_dir": str(model), "name": "tok"}, device="cpu")
    tokens = token_set(random_docs(40, seed=7))
    summary = cache_activations(bridge, tokens, out, defaults("cache", batch_size=2), {"model": "tok"})
    assert 8 <= summary["resumed_from"] < 40
    assert not out.with_name(out.name + PARTIAL).exists() and not ckpt.exists()
    ref = tmp_path / "uninterrupted" / "acts.h5"
    assert cache_activations(bridge, tokens, ref, defaults("cache", batch_size=2), {"model": "tok"})["resumed_from"] == 0
    assert_same_file(out, ref)


class Interrupt(Exception):
    pass


def _interrupt_after(n: int):
    def progress(done: int, total: int) -> None:
        if done >= n:
            raise Interrupt

    return progress


def test_damaged_or_mismatched_partial_file_restarts_cleanly(token_model, tmp_path):
    _, model = token_model
    bridge = load_bridge({"hf_dir": str(model), "name": "tok"}, device="cpu")
    tokens = token_set(random_docs(12, seed=2))
    ref = tmp_path / "ref.h5"
    cache_activations(bridge, tokens, ref, defaults("cache", batch_size=3), {"model": "tok"})
    out = tmp_path / "acts.h5"
    partial = out.with_name(out.name + PARTIAL)

    def interrupted(batch_size: int) -> None:
        """A run stopped after 6 documents, leaving its partial file and checkpoint."""
        with pytest.raises(Interrupt):
            cache_activations(bridge, tokens, out, defaults("cache", batch_size=batch_size, checkpoint_seconds=0),
                              {"model": "tok"}, _interrupt_after(6))

    def rerun() -> int:
        return cache_activations(bridge, tokens, out, defaults("cache", batch_size=3), {"model": "tok"})["resumed_from"]

    # interrupted, then the partial file truncated: restart from scratch
    interrupted(3)
    with open(partial, "r+b") as fh:
        fh.truncate(partial.stat().st_size // 2)
    assert rerun() == 0
    assert_same_file(out, ref)
    # interrupted, then rerun with other settings: restart, never mix
    out.unlink()
    interrupted(2)
    assert rerun() == 0
    assert_same_file(out, ref)
    # interrupted, same settings: resumes
    out.unlink()
    interrupted(3)
    assert rerun() == 6
    assert_same_file(out, ref)


def test_truncated_or_incomplete_file_is_rejected_naming_file_and_rule(token_model, tmp_path):
    _, model = token_model
    bridge = load_bridge({"hf_dir": str(model), "name": "tok"}, device="cpu")
    out = tmp_path / "acts.h5"
    cache_activations(bridge, token_set(random_docs(5)), out, defaults("cache", batch_size=2), {"model": "tok"})
    with h5py.File(out, "r+") as f:  # an incomplete file, e.g. copied mid-write
        f.attrs["complete"] = False
    with pytest.raises(PosmechError, match=r"acts\.h5.*completion marker.*cache_activations"):
        read_position_means(out, "resid_pre")
    with h5py.File(out, "r+") as f:
        f.attrs["complete"] = True
    read_position_means(out, "resid_pre")
    with open(out, "r+b") as fh:
        fh.truncate(out.stat().st_size // 2)
    with pytest.raises(PosmechError, match=r"acts\.h5.*(corrupt|truncated)"):
        read_document(out, "resid_pre", 0, 0)


def test_unknown_hook_and_out_of_range_requests_fail_clearly(token_model, tmp_path):
    _, model = token_model
    bridge = load_bridge({"hf_dir": str(model), "name": "tok"}, device="cpu")
    out = tmp_path / "acts.h5"
    cache_activations(bridge, token_set(random_docs(3)), out, defaults("cache", hooks=["resid_pre"]), {"model": "tok"})
    with pytest.raises(PosmechError, match="ln1_out.*cache.hooks"):
        read_position_means(out, "ln1_out")
    with pytest.raises(PosmechError, match="out of range"):
        read_document(out, "resid_pre", 0, 3)
    with pytest.raises(PosmechError, match="cache.hooks"):
        cache_activations(bridge, token_set(random_docs(3)), tmp_path / "x.h5",
                          defaults("cache").replace(hooks=["resid_post"]), {"model": "tok"})


def test_compressed_cache_equals_uncompressed(token_model, tmp_path):
    _, model = token_model
    bridge = load_bridge({"hf_dir": str(model), "name": "tok"}, device="cpu")
    tokens = token_set(random_docs(6, seed=4))
    cache_activations(bridge, tokens, tmp_path / "a.h5", defaults("cache", batch_size=4), {"model": "tok"})
    cache_activations(bridge, tokens, tmp_path / "b.h5", defaults("cache", batch_size=4, compression="gzip"),
                      {"model": "tok"})
    (da, aa), (db, ab) = _datasets(tmp_path / "a.h5"), _datasets(tmp_path / "b.h5")
    for k in da:
        np.testing.assert_array_equal(da[k], db[k], err_msg=k)
    with h5py.File(tmp_path / "b.h5") as f:
        assert f["activations/resid_pre"].compression == "gzip"
        chunks = f["activations/resid_pre"].chunks
        assert chunks[0] == 1 and chunks[2] == f.attrs["d_model"]
        assert f.attrs["complete"] and f.attrs["compression"] == "gzip"


@pytest.mark.float32
@pytest.mark.parametrize("arch", ["gpt2", "gpt-neo"])
@pytest.mark.parametrize("processing", ["compatibility", "raw"])
def test_posmech_engine_equals_transformerlens_hooks(tmp_path, processing, arch):
    """The posmech engine (asked for by its former cache name, `hf`) reproduces the bridge's
    hook values in the processing mode, for GPT-2 (Conv1D) and GPT-Neo (as TinyStories: Linear)."""
    path = (_gpt2_dir if arch == "gpt2" else _gpt_neo_dir)(tmp_path / arch)
    ids = np.stack(random_docs(3, seed=9, n_ctx=N_CTX)[:1] * 2)
    man = {"hf_dir": str(path), "name": "g"}
    a = load_capture(man, "cpu", "float32", processing, "bridge")(ids, ("resid_pre", "ln1_out"))
    b = load_capture(man, "cpu", "float32", processing, "hf")(ids, ("resid_pre", "ln1_out"))
    for h in a:
        ta, tb = np.stack([t.numpy() for t in a[h]]), np.stack([t.numpy() for t in b[h]])
        assert ta.shape == tb.shape
        np.testing.assert_allclose(tb, ta, atol=2e-5, rtol=1e-5)


def test_wrapping_a_huggingface_model_leaves_it_alone(tmp_path):
    """Wrapping a Hugging Face model runs the posmech engine on a processed copy of its
    weights: the caller's weights and modules are unchanged."""
    from transformers import AutoModelForCausalLM
    from transformers.activations import NewGELUActivation

    from posmech.analyses.cache import as_capture
    from posmech.models.lens import Lens

    path = _gpt2_dir(tmp_path / "gpt2")
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cap = as_capture(model, "compatibility")
    assert isinstance(cap.model, Lens) and cap.engine == "posmech"
    cap(np.stack(random_docs(2, seed=1, n_ctx=N_CTX)[:1]), ("resid_pre",))
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert all(type(b.mlp.act) is NewGELUActivation for b in model.transformer.h)
    assert cap.model.W_pos.mean(-1).abs().max() < 1e-6  # the engine's copy is centred
    assert model.transformer.wpe.weight.mean(-1).abs().max() > 1e-4
    with pytest.raises(PosmechError, match="cache.engine"):
        load_capture({"hf_dir": str(path), "name": "g"}, "cpu", "float32", "compatibility", "fast")


def test_the_resume_fingerprint_reads_the_settings_that_shape_the_file():
    s = defaults("cache")
    assert s.fingerprint_fields() == {"hooks": ["resid_pre", "ln1_out"], "n_documents": None, "batch_size": 8,
                                      "storage_dtype": "float16", "chunk_tokens": 128}
    same = s.replace(compression="gzip", checkpoint_every=3, checkpoint_seconds=0, engine="bridge", models=["m"])
    assert same.fingerprint_fields() == s.fingerprint_fields()
    assert s.replace(batch_size=4).fingerprint_fields() != s.fingerprint_fields()
