"""Blocks of a hand-written document that a generator writes, and the generators' command line.

A block sits between the marker lines ``<!-- generated: NAME -->`` and ``<!-- end generated -->``
(:data:`BEGIN`, :data:`END`); the prose around it stays hand-written. Three generators use them:
:mod:`posmech.settings.reference` (config/README.md's key tables and the settings fields, from
the config schema: ``make config-doc``) and :mod:`posmech.pipeline.reference` (the docs' tables
of analyses, from the declarations: ``make docs``), :mod:`posmech.pipeline.demo_numbers`
(the demo run's numbers, blocks named ``numbers.…``, from ``docs/demo-numbers.json``:
``make demo-numbers``). Each leaves the others' blocks as they are.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

from posmech.core.errors import PosmechError
from posmech.core.io import REPO

BEGIN = re.compile(r"^<!-- generated: (\S+) -->$")
END = "<!-- end generated -->"


def block_names(text: str) -> list[str]:
    """The names of ``text``'s blocks, in order."""
    return [m.group(1) for line in text.split("\n") if (m := BEGIN.match(line))]


def fill_blocks(text: str, where: str, block: Callable[[str], list[str] | None]) -> str:
    """``text`` with each block's lines replaced by ``block(name)`` (a blank line either side);
    a block for which ``block`` returns ``None`` is another generator's and stays as it is.
    Raises :class:`PosmechError` naming ``where`` and the block when its end marker is missing."""
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    for start, line in enumerate(lines):
        m = BEGIN.match(line)
        if m is None or start < i:
            continue
        name = m.group(1)
        try:
            end = lines.index(END, start + 1)
        except ValueError:
            raise PosmechError(f"{where}: `<!-- generated: {name} -->` has no `{END}` after it") from None
        if any(BEGIN.match(x) for x in lines[start + 1:end]):
            raise PosmechError(f"{where}: the block `{name}` has no `{END}` before the next one")
        new = block(name)
        out += lines[i:end] if new is None else lines[i:start + 1] + [""] + new + [""]
        i = end
    out += lines[i:]
    return "\n".join(out)


def changed(texts: dict[Path, str]) -> list[Path]:
    """The files of ``texts`` whose text on disk differs (or that do not exist)."""
    return [p for p, text in texts.items() if not p.exists() or p.read_text(encoding="utf-8") != text]


def main(argv: list[str] | None, prog: str, doc: str | None, written: Callable[[], dict[Path, str]],
         what: str, source: str, command: str) -> int:
    """A generator's command line: ``--write`` rewrites the files ``written()`` gives whose text
    differs, ``--check`` exits 1 naming them and ``command``; 2 on a :class:`PosmechError`.
    ``what``: the files in words (the help); ``source``: what they are written from."""
    parser = argparse.ArgumentParser(prog=prog, description=(doc or "").split("\n")[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--write", action="store_true", help=f"rewrite {what}")
    group.add_argument("--check", action="store_true", help="exit 1 when a generated file is stale")
    args = parser.parse_args(argv)
    try:
        texts = written()
    except PosmechError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    stale = changed(texts)
    if args.write:
        for p in stale:
            p.write_text(texts[p], encoding="utf-8")
        print("\n".join(f"wrote {p.relative_to(REPO)}" for p in stale) or "up to date")
        return 0
    if stale:
        print(f"stale (written from {source}): " + ", ".join(str(p.relative_to(REPO)) for p in stale)
              + f"; run {command}", file=sys.stderr)
        return 1
    return 0
