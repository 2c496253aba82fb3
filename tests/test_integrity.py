"""Damaged inputs are named, identical runs are identical (issue 13, cases 6, 7, 14, 15)."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest

from posmech.analyses.cache import cache_activations, read_position_means, tokens_digest
from posmech.core.errors import PosmechError
from posmech.settings import defaults
from posmech.models.loading import check_hf_dir, load_bridge, prepare_local_model
from posmech.data.tokens import TokenSet
from tests.conftest import flip_bytes


def token_set(seed: int = 0, n: int = 6, n_ctx: int = 12, created: str = "t0") -> TokenSet:
    rng = np.random.default_rng(seed)
    docs = [np.concatenate([[0], rng.integers(1, 20, size=n_ctx - 1)]) for _ in range(n)]
    off = np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype(np.int64)
    return TokenSet(np.concatenate(docs).astype(np.int32), off, {"config_hash": "x", "created": created},
                    [f"doc {j}" for j in range(n)])


@pytest.fixture(scope="module")
def cached(prev_token_model_dir, tmp_path_factory):
    """A small activation cache of the hand-built previous-token model."""
    bridge = load_bridge({"hf_dir": str(prev_token_model_dir), "name": "pt"}, device="cpu")
    out = tmp_path_factory.mktemp("cache") / "acts.h5"
    cache_activations(bridge, token_set(), out, defaults("cache", batch_size=3, storage_dtype="float32"), {"model": "pt"})
    return out


# ---------------------------------------------------------------- case 14: safetensors checked
@pytest.mark.parametrize("damage", ["truncate", "header"])
def test_damaged_safetensors_refused_when_the_model_is_prepared(prev_token_model_dir, tmp_path, damage):
    d = tmp_path / "model"
    shutil.copytree(prev_token_model_dir, d)
    w = next(d.glob("*.safetensors"))
    data = w.read_bytes()
    w.write_bytes(data[: len(data) - 100] if damage == "truncate" else b"\xff" * 8 + data[8:])
    with pytest.raises(PosmechError) as info:
        prepare_local_model("m", {"source": str(d)}, tmp_path / "out")
    msg = str(info.value)
    assert "models.m.source" in msg and w.name in msg and ("truncated or corrupt" in msg)
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_whole_safetensors_pass(prev_token_model_dir):
    check_hf_dir(prev_token_model_dir, "k")


# ---------------------------------------------------------------- case 15: reader's dataset check
def test_deleted_position_mean_is_named(cached, tmp_path):
    p = tmp_path / "acts.h5"
    shutil.copy(cached, p)
    with h5py.File(p, "r+") as f:
        del f["position_stats/ln1_out/mean"]
    with pytest.raises(PosmechError) as info:
        read_position_means(p, "ln1_out")
    msg = str(info.value)
    assert str(p) in msg and "position_stats/ln1_out/mean" in msg and "cache_activations" in msg
    read_position_means(p, "resid_pre")  # the other hook is whole


# ---------------------------------------------------------------- case 7: determinism
def test_cache_fingerprint_hashes_content_not_creation_time(prev_token_model_dir, tmp_path):
    a, b = token_set(created="2026-01-01"), token_set(created="2026-06-01")
    assert tokens_digest(a) == tokens_digest(b) != tokens_digest(token_set(seed=1))
    bridge = load_bridge({"hf_dir": str(prev_token_model_dir), "name": "pt"}, device="cpu")
    fps = []
    for name, ts in (("a.h5", a), ("b.h5", b)):
        cache_activations(bridge, ts, tmp_path / name, defaults("cache", batch_size=3), {"model": "pt"})
        with h5py.File(tmp_path / name) as f:
            fps.append(f.attrs["fingerprint"])
    assert fps[0] == fps[1]


def test_strip_plot_is_identical_between_runs(tmp_path):
    from posmech.plots.interventions import repeated_tokens

    rng = np.random.default_rng(0)
    df = pd.DataFrame({"query_set": ["other"] * 30 + ["repeat"] * 30, "prev_mass": rng.uniform(size=60)})
    digests = []
    for i in range(2):
        np.random.seed(i)  # whatever the global state before, the figure is the same
        repeated_tokens(df, None, "m", tmp_path / f"{i}.png")
        digests.append(hashlib.sha256((tmp_path / f"{i}.png").read_bytes()).hexdigest())
    assert digests[0] == digests[1]


# ---------------------------------------------------------------- case 17: inspect on other paths
@pytest.mark.parametrize("kind", ["directory", "text", "jsonl", "csv", "empty"])
def test_inspect_says_what_a_non_hdf5_path_is(tmp_path, kind, capsys):
    from posmech.cli import main

    p = {"directory": tmp_path, "text": tmp_path / "notes.txt", "jsonl": tmp_path / "c.jsonl",
         "csv": tmp_path / "t.csv", "empty": tmp_path / "e.dat"}[kind]
    content = {"text": "hello\n", "jsonl": '{"text": "a"}\n', "csv": "a,b\n1,2\n", "empty": ""}
    if kind != "directory":
        p.write_text(content[kind])
    assert main(["inspect", str(p)]) == 1
    err = capsys.readouterr().err
    assert "not a pipeline HDF5 file" in err and "delete" not in err
    word = {"directory": "a directory", "text": "a text file", "jsonl": "JSON-lines", "csv": "a CSV",
            "empty": "an empty file"}[kind]
    assert word in err


def test_inspect_truncated_h5_still_says_corrupt(cached, tmp_path, capsys):
    from posmech.cli import main

    p = tmp_path / "t.h5"
    p.write_bytes(cached.read_bytes()[:2000])
    assert main(["inspect", str(p)]) == 1
    assert "corrupt or truncated" in capsys.readouterr().err


def test_inspect_json_into_a_closed_pipe(tmp_path):
    import subprocess
    import sys

    from posmech.store.hdf5 import artifact_writer

    big = tmp_path / "many.h5"  # output far beyond a pipe's buffer
    with artifact_writer(big, "test", "test") as f:
        for i in range(1500):
            f.create_dataset(f"group{i % 10}/d{i}", data=np.arange(3))
    proc = subprocess.run(f"{sys.executable} -m posmech inspect --json {big} | head -n 2",
                          shell=True, capture_output=True, text=True, timeout=120)
    assert proc.stdout.count("\n") == 2
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr


def test_schema_version_message_is_plain(cached, tmp_path):
    from posmech.store.hdf5 import open_artifact

    p = tmp_path / "v.h5"
    shutil.copy(cached, p)
    with h5py.File(p, "r+") as f:
        f.attrs["schema_version"] = np.int64(99)
    with pytest.raises(PosmechError, match=r"schema_version 99, expected"):
        open_artifact(p)


def test_defined_corpora_spelt_right():
    from posmech.core.config import _names_problems

    [msg] = _names_problems({"cache": {"corpora": ["x"]}}, "cache", "corpora", {"bible"}, "corpus")
    assert "defined corpora are bible" in msg


# ---------------------------------------------------------------- case 2: an average over nothing
def test_loss_over_empty_documents_is_an_error(prev_token_model_dir):
    from posmech.analyses.posembed import posembed_averaging

    bridge = load_bridge({"hf_dir": str(prev_token_model_dir), "name": "pt"}, device="cpu")
    empty = [np.array([0], dtype=np.int32)] * 3  # BOS only: nothing to predict
    with pytest.raises(PosmechError, match="nothing to average.*posembed_averaging.corpus"):
        posembed_averaging(bridge, [1, 2], empty, [], True)
    df = posembed_averaging(bridge, [1], [np.arange(5, dtype=np.int32)], [], True)
    assert df["n_predictions"].tolist() == [4] and df["value"].iloc[0] > 0


def test_mean_over_nothing():
    from posmech.core.errors import mean_over

    assert mean_over(6.0, 3, "x") == 2.0
    with pytest.raises(PosmechError, match="nothing to average for the thing"):
        mean_over(0.0, 0, "the thing")


# ---------------------------------------------------------------- case 3: unknown characters
def test_char_tokenizer_maps_unknown_characters_and_counts_them(tmp_path):
    from transformers import AutoTokenizer

    from posmech.models.training import UNK_TOKEN, build_char_tokenizer
    from posmech.data.tokens import tokenize_documents, unknown_tokens

    build_char_tokenizer(["abc "]).save_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)  # as the tokenize rule loads it
    docs = [{"text": "a Ωb 😀中"}, {"text": "abc"}]
    ids, kept = tokenize_documents(docs, tok, 64, True, 1)
    assert [len(t) for t in ids] == [1 + 7, 1 + 3]  # nothing dropped: one token per character
    assert tok.convert_ids_to_tokens(ids[0].tolist()).count(UNK_TOKEN) == 3
    assert unknown_tokens(ids, tok) == (3, 1)
    assert tok.decode(ids[1][1:]) == "abc"


def test_gpt2_style_tokenizer_reports_no_unknowns(prev_token_model_dir):
    from transformers import AutoTokenizer

    from posmech.data.tokens import unknown_tokens

    tok = AutoTokenizer.from_pretrained(prev_token_model_dir)
    assert unknown_tokens([np.array([tok.bos_token_id, 1, 2])], tok) == (0, 0)


# ---------------------------------------------------------------- case 6: checksums
def _flip_bytes_in(path: Path, dataset: str, n: int = 64) -> None:
    with h5py.File(path, "r") as f:
        ds = f[dataset]
        assert ds.fletcher32, f"{dataset} must carry a checksum"
        info = ds.id.get_chunk_info(0)
    data = bytearray(path.read_bytes())
    for i in range(info.byte_offset + 16, info.byte_offset + 16 + n):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))


def test_flipped_bytes_in_position_means_are_detected(cached, tmp_path, capsys):
    from posmech.cli import main

    p = tmp_path / "acts.h5"
    shutil.copy(cached, p)
    assert main(["inspect", "--verify", str(p)]) == 0
    _flip_bytes_in(p, "position_stats/ln1_out/mean")
    with pytest.raises(OSError, match="checksum|filter returned failure"):
        read_position_means(p, "ln1_out")
    capsys.readouterr()
    assert main(["inspect", "--verify", str(p)]) == 2
    assert "CORRUPT: position_stats/ln1_out/mean" in capsys.readouterr().out


def test_every_written_dataset_is_checksummed(cached, tmp_path):
    from posmech.data.tokens import write_tokens

    toks = tmp_path / "t.h5"
    write_tokens(toks, [np.arange(5, dtype=np.int32)], [{"doc_index": 0, "title": "x"}], {})
    for path in (cached, toks):
        with h5py.File(path) as f:
            unprotected = []
            f.visititems(lambda n, o: unprotected.append(n) if isinstance(o, h5py.Dataset) and not o.fletcher32
                         and o.dtype.kind != "O" else None)
            assert unprotected == [], f"{path.name}: {unprotected}"


def test_checksum_failure_is_named_by_the_runner(cached, tmp_path):
    from types import SimpleNamespace

    from posmech.pipeline.runner import run

    p = tmp_path / "acts.h5"
    shutil.copy(cached, p)
    _flip_bytes_in(p, "position_stats/resid_pre/mean")
    # an analysis's job (etc_table): a damaged input ends it, it is not recorded as the model's failure
    smk = SimpleNamespace(input=[str(p)], output=[str(tmp_path / "etc.csv")], log=[str(tmp_path / "r.log")],
                          rule="etc_table", threads=1)
    with pytest.raises(SystemExit):
        run(smk, lambda smk, log: read_position_means(smk.input[0], "resid_pre"))
    text = (tmp_path / "r.log").read_text()
    assert f"file involved: {p}" in text and "fails its checksum" in text
    assert not (tmp_path / "etc.csv").exists()  # no failure record in place of the output


# ---------------------------------------------------------------- case 12: a failed write cleans up
@pytest.mark.parametrize("error", [OSError(28, "No space left on device"), RuntimeError("something else")])
def test_failed_cache_write_removes_partial_only_for_write_errors(prev_token_model_dir, tmp_path, monkeypatch, error):
    import posmech.analyses.cache as cache
    from posmech.analyses.cache import CHECKPOINT, PARTIAL

    bridge = load_bridge({"hf_dir": str(prev_token_model_dir), "name": "pt"}, device="cpu")
    real, calls = cache.write_tokens, []

    def failing_write(ds, start, block):
        calls.append(start)
        if len(calls) > 4:  # after the first checkpoint
            raise error
        real(ds, start, block)

    monkeypatch.setattr(cache, "write_tokens", failing_write)
    out = tmp_path / "acts.h5"
    with pytest.raises(type(error)):
        cache_activations(bridge, token_set(n=9), out,
                          defaults("cache", batch_size=3, checkpoint_seconds=0), {"model": "pt"})
    partial, ckpt = out.with_name(out.name + PARTIAL), out.with_name(out.name + CHECKPOINT)
    left = partial.exists(), ckpt.exists()
    assert left == ((False, False) if isinstance(error, OSError) else (True, True))
    assert not out.exists()


# ---------------------------------------------------------------- case 8: the cache survives a failed re-run
def test_kept_cache_survives_output_deletion_and_is_relinked(prev_token_model_dir, tmp_path):
    import os
    import time

    from posmech.analyses.cache import kept_path

    bridge = load_bridge({"hf_dir": str(prev_token_model_dir), "name": "pt"}, device="cpu")
    out = tmp_path / "acts.h5"
    s = cache_activations(bridge, token_set(), out, defaults("cache", batch_size=3), {"model": "pt"}, keep=True)
    assert not s.get("reused")
    with h5py.File(out) as f:
        fp = f.attrs["fingerprint"]
    kept = kept_path(out, fp)
    assert kept.is_file() and os.path.samefile(kept, out)  # a hard link: no second copy
    digest = hashlib.sha256(out.read_bytes()).hexdigest()
    out.unlink()  # what Snakemake does to a job's outputs before running it again
    time.sleep(0.01)
    s = cache_activations(bridge, token_set(), out, defaults("cache", batch_size=3), {"model": "pt"}, keep=True)
    assert s["reused"] and hashlib.sha256(out.read_bytes()).hexdigest() == digest
    assert out.stat().st_mtime >= time.time() - 60
    # other content: computed afresh, and the kept copy of the old content is replaced
    s = cache_activations(bridge, token_set(seed=5), out, defaults("cache", batch_size=3), {"model": "pt"}, keep=True)
    assert not s.get("reused") and not kept.exists()
    with h5py.File(out) as f:
        kept2 = kept_path(out, f.attrs["fingerprint"])
    assert sorted(p.name for p in kept.parent.iterdir()) == [kept2.name, kept2.name + ".sha256"]


def test_kept_cache_damaged_in_place_is_not_reused(prev_token_model_dir, tmp_path, caplog):
    """The kept copy is a hard link: bytes flipped in the output damage it too. Its sha256,
    recorded when it was kept, is checked before reuse: the damaged copy is deleted and the
    cache recomputed, its data equal to the undamaged one's."""
    from posmech.analyses.cache import kept_path

    bridge = load_bridge({"hf_dir": str(prev_token_model_dir), "name": "pt"}, device="cpu")
    out = tmp_path / "acts.h5"
    cache_activations(bridge, token_set(), out, defaults("cache", batch_size=3), {"model": "pt"}, keep=True)
    digest = hashlib.sha256(out.read_bytes()).hexdigest()
    with h5py.File(out) as f:
        kept = kept_path(out, f.attrs["fingerprint"])
        ref = {k: f[k][()] for k in ("activations/ln1_out", "activations/resid_pre", "position_stats/count")}
    flip_bytes(out)  # in place: the kept link shares these bytes
    assert hashlib.sha256(kept.read_bytes()).hexdigest() != digest
    out.unlink()
    with caplog.at_level("WARNING"):
        s = cache_activations(bridge, token_set(), out, defaults("cache", batch_size=3), {"model": "pt"}, keep=True)
    assert not s.get("reused")
    assert "its bytes changed" in caplog.text and str(kept) in caplog.text
    with h5py.File(out) as f:
        assert f.attrs["complete"]
        for k, v in ref.items():
            np.testing.assert_array_equal(f[k][()], v, err_msg=k)


# ---------------------------------------------------------------- issue 32: a file-size limit (full disk)
_LIMITED_JOB = """
import resource, sys
from pathlib import Path
from types import SimpleNamespace
import numpy as np
from posmech.analyses.cache import cache_activations
from posmech.settings import defaults
from posmech.data.tokens import TokenSet
from posmech.models.loading import load_bridge
from posmech.pipeline.runner import run

model, out, limit = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(0)
docs = [np.concatenate([[0], rng.integers(1, 20, size=11)]) for _ in range(300)]
off = np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype(np.int64)
tokens = TokenSet(np.concatenate(docs).astype(np.int32), off, {"config_hash": "x"}, [f"d{j}" for j in range(300)])

def main(smk, log):
    bridge = load_bridge({"hf_dir": model, "name": "pt"}, device="cpu")
    if limit:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    cache_activations(bridge, tokens, out, defaults("cache", batch_size=16, storage_dtype="float32"), {"model": "pt"},
                      keep=True)

smk = SimpleNamespace(input=[], output=[str(out)], log=[str(out.parent / "job.log")], rule="cache_activations",
                      threads=1)
run(smk, main)
"""


@pytest.mark.parametrize("limit", [100_000, 600 * 1024])
def test_file_size_limit_fails_cleanly_then_a_rerun_equals_an_uninterrupted_one(prev_token_model_dir, tmp_path,
                                                                                  limit):
    """A file-size limit (RLIMIT_FSIZE, as `ulimit -f`) hit while the cache is created (100 kB)
    or while activations are written (600 KiB): the job ends with exit status 1 (no SIGSEGV:
    HDF5 crashed when the failure's report asked a closed dataset for its file), its log says
    `failed:`, names the file and the fix, and no partial file is left; the rerun without the
    limit writes a cache equal to an uninterrupted run's."""
    import subprocess
    import sys

    script = tmp_path / "job.py"
    script.write_text(_LIMITED_JOB)
    ref, out = tmp_path / "ref" / "acts.h5", tmp_path / "run" / "acts.h5"
    for p in (ref, out):
        p.parent.mkdir()

    def job(path, lim):
        return subprocess.run([sys.executable, str(script), str(prev_token_model_dir), str(path), str(lim)],
                              capture_output=True, text=True, timeout=600)

    assert job(ref, 0).returncode == 0
    proc = job(out, limit)
    log = (out.parent / "job.log").read_text()
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    assert "Segmentation fault" not in proc.stderr
    assert "rule cache_activations failed:" in log and "file-size limit was reached" in log, log[-3000:]
    assert "raise the limit (`ulimit -f unlimited`)" in log and "acts.h5.partial" in log
    assert sorted(p.name for p in out.parent.iterdir() if p.name != "job.log" and not p.name.startswith("job.log")) \
        == [], list(out.parent.iterdir())
    assert job(out, 0).returncode == 0
    with h5py.File(ref) as a, h5py.File(out) as b:
        names = []
        a.visit(lambda n: names.append(n) if isinstance(a[n], h5py.Dataset) else None)
        assert names
        for n in names:
            np.testing.assert_array_equal(a[n][()], b[n][()], err_msg=n)
        assert a.attrs["fingerprint"] == b.attrs["fingerprint"]
