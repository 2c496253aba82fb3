import json

import pandas as pd
import pytest

from posmech.data.corpora import bible_chapters, clean_kjv, load_corpus, select_indices
from posmech.core.errors import PosmechError


def test_clean_kjv_removes_verse_numbers_and_italics_markers():
    raw = "1. In the beginning [was] the word. 2. And [it was] good.\n3. Amen."
    assert clean_kjv(raw) == "In the beginning was the word. And it was good.\nAmen."


def test_bible_has_every_chapter_with_book_and_chapter():
    chapters = list(bible_chapters())
    assert len(chapters) == 1189
    first, last = chapters[0], chapters[-1]
    assert (first["book"], first["chapter"]) == ("GENESIS", 1)
    assert first["text"].startswith("In the beginning God created the heaven and the earth.")
    assert (last["book"], last["chapter"]) == ("REVELATION", 22)
    assert not any("[" in c["text"] or "]" in c["text"] for c in chapters)
    assert [c["doc_index"] for c in chapters] == list(range(1189))


def test_select_indices_is_seeded_sorted_and_complete_when_none():
    a = select_indices(100, 10, seed=3)
    assert list(a) == sorted(a) and len(set(a)) == 10
    assert list(select_indices(100, 10, seed=3)) == list(a)
    assert list(select_indices(100, 10, seed=4)) != list(a)
    assert list(select_indices(5, None, seed=0)) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "save_to_disk"])
def test_local_corpus_formats(tmp_path, fmt):
    texts = [f"document number {i}" for i in range(7)]
    if fmt == "jsonl":
        path = tmp_path / "c.jsonl"
        path.write_text("".join(json.dumps({"body": t}) + "\n" for t in texts))
    elif fmt == "parquet":
        path = tmp_path / "c.parquet"
        pd.DataFrame({"body": texts}).to_parquet(path)
    else:
        import datasets

        path = tmp_path / "ds"
        datasets.Dataset.from_dict({"body": texts}).save_to_disk(str(path))
    entry = {"source": str(path), "split": "train", "text_field": "body", "n_documents": 3, "seed": 1}
    docs = load_corpus(entry, "mine")
    assert len(docs) == 3
    assert all(d["text"] == texts[d["doc_index"]] for d in docs)


def test_wrong_text_field_names_the_key(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"body": "x"}) + "\n")
    with pytest.raises(PosmechError, match="corpora.mine.text_field"):
        load_corpus({"source": str(path), "split": "train", "text_field": "text"}, "mine")


def test_hub_corpus_offline_names_the_ways_on(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PosmechError, match="config/demo.yaml"):
        load_corpus({"source": "stas/openwebtext-10k", "split": "train", "text_field": "text"}, "webtext")


def test_null_text_names_the_document_the_line_and_the_file(tmp_path):
    p = tmp_path / "web.jsonl"
    p.write_text('{"text": "one"}\n\n{"text": "two"}\n{"text": null}\n')
    with pytest.raises(PosmechError) as info:
        load_corpus({"source": str(p), "split": "train", "text_field": "text"}, "web")
    msg = str(info.value)
    assert "corpus 'web'" in msg and "document 2" in msg and f"line 4 of '{p}'" in msg and "None" in msg


def test_non_utf8_byte_names_the_file_line_and_column(tmp_path):
    p = tmp_path / "web.jsonl"
    p.write_bytes(b'{"text": "one"}\n{"text": "t\xe9l\xe9"}\n')
    with pytest.raises(PosmechError) as info:
        load_corpus({"source": str(p), "split": "train", "text_field": "text"}, "web")
    msg = str(info.value)
    assert f"'{p}', line 2, column 12: byte 0xe9 is not UTF-8" in msg and "iconv" in msg
