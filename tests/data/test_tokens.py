import h5py
import numpy as np
import pytest

from posmech.data.tokens import documents_fraction, kept_documents, read_tokens, tokenize_documents, write_tokens
from posmech.core.errors import PosmechError
from posmech.models.handbuilt import char_tokenizer


def _docs():
    return [
        {"doc_index": 4, "text": "abcdefghij", "title": "first"},
        {"doc_index": 9, "text": "xy", "title": "short"},
        {"doc_index": 11, "text": "hello world", "title": "third"},
    ]


def test_tokenize_cuts_to_context_with_bos_and_drops_short_documents():
    tok = char_tokenizer(100)
    ids, kept = tokenize_documents(_docs(), tok, n_ctx=6, prepend_bos=True, min_tokens=4)
    assert kept == [0, 2]
    assert [len(t) for t in ids] == [6, 6]
    assert ids[0][0] == tok.bos_token_id == 0
    assert tok.decode(ids[0][1:].tolist()) == "abcde"


def test_tokenize_without_bos():
    ids, _ = tokenize_documents(_docs(), char_tokenizer(100), n_ctx=100, prepend_bos=False)
    assert [len(t) for t in ids] == [10, 2, 11]


def test_write_read_roundtrip_and_layout(tmp_path):
    tok = char_tokenizer(100)
    docs = _docs()
    ids, kept = tokenize_documents(docs, tok, n_ctx=8, prepend_bos=True)
    path = tmp_path / "t.h5"
    write_tokens(path, ids, [docs[j] for j in kept], {"model": "m", "corpus": "c"})
    ts = read_tokens(path)
    assert ts.n_documents == 3 and list(ts.lengths()) == [8, 3, 8]
    for j, t in enumerate(ids):
        np.testing.assert_array_equal(ts.doc(j), t)
    with h5py.File(path) as f:
        np.testing.assert_array_equal(f["doc_ids"][()], np.repeat([0, 1, 2], [8, 3, 8]))
        np.testing.assert_array_equal(f["positions"][:11], [0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2])
        assert list(f["documents/doc_index"][()]) == [4, 9, 11]
        assert f.attrs["complete"] and f.attrs["kind"] == "tokens"
    assert ts.titles == ["first", "short", "third"]


def test_failed_write_leaves_previous_file_untouched(tmp_path):
    tok = char_tokenizer(100)
    docs = _docs()
    ids, _ = tokenize_documents(docs, tok, n_ctx=8, prepend_bos=True)
    path = tmp_path / "t.h5"
    write_tokens(path, ids, docs, {"model": "m"})
    before = path.read_bytes()
    with pytest.raises(PosmechError):
        write_tokens(path, ids, docs[:1], {"model": "m"})
    broken = [{"text": d["text"]} for d in docs]  # no doc_index: fails while writing
    with pytest.raises(KeyError):
        write_tokens(path, ids, broken, {"model": "m"})
    assert path.read_bytes() == before
    assert not list(tmp_path.glob("*.partial"))


def _five_documents(tmp_path):
    tok = char_tokenizer(100)
    docs = [{"doc_index": i, "text": "ab" * (i + 1), "title": f"d{i}"} for i in range(5)]
    ids, _ = tokenize_documents(docs, tok, n_ctx=100, prepend_bos=True)
    path = tmp_path / "t.h5"
    write_tokens(path, ids, docs, {"model": "m"})
    return path, ids


def test_a_documents_fraction_reads_the_first_documents_and_says_so(tmp_path):
    """A random-init twin's reads (config `twins.documents_fraction`): ceil(fraction × n)
    documents, the first ones, at least two, at most n; outside the context every document."""
    path, ids = _five_documents(tmp_path)
    with documents_fraction(0.5):
        ts = read_tokens(path)
    assert ts.n_documents == 3 and ts.titles == ["d0", "d1", "d2"]
    assert (ts.attrs["n_documents"], ts.attrs["n_documents_in_file"], ts.attrs["documents_fraction"]) == (3, 5, 0.5)
    assert len(ts.flat) == ts.attrs["n_tokens"] == sum(len(t) for t in ids[:3])
    for j in range(3):
        np.testing.assert_array_equal(ts.doc(j), ids[j])
    with documents_fraction(0.1):  # 1 of 5 by the fraction: the minimum of two
        assert read_tokens(path).n_documents == 2
    with documents_fraction(1.0):
        assert read_tokens(path).n_documents == 5
    assert read_tokens(path).n_documents == 5 and "documents_fraction" not in read_tokens(path).attrs
    assert [kept_documents(n, 0.5) for n in (1, 2, 3, 8, 100)] == [1, 2, 2, 4, 50]
    with pytest.raises(PosmechError, match="twins.documents_fraction"):
        kept_documents(10, 0.0)
