"""Command line: ``python -m posmech inspect PATH [--json]``, ``… heads RESULTS/MODEL [--wide | --csv]``,
``… findings [RESULTS/REPORT] [--claim ID]``, ``… check-config [CONFIG ...] [--directory DIR]``,
``… selfcheck [RESULTS/REPORT]`` (also the ``posmech`` script). ``--help`` gives
:data:`DESCRIPTION` and every command's one-line summary (:data:`COMMANDS`).

``selfcheck`` compares ``results/report/findings.csv`` with the expected verdicts of the
hand-built cases (:data:`posmech.verdicts.selfcheck.CASES`, the one place they are stated, each
with its reason; the run: ``make selfcheck``, config/selfcheck.yaml): it prints expected
vs obtained per (claim, model) and exits 1 when a verdict disagrees or an expected (claim, model)
is missing from the table.

``findings`` prints ``results/report/findings.csv`` as a grid of claims × models (verdict and
value per cell); ``--claim P5`` gives one claim's verdicts with the finding and the reasons.

``heads`` prints the head-roles table of one model (``results/MODEL/heads.csv``, rule
``head_table``, :mod:`posmech.verdicts.heads`): every head with the roles the analyses assign it
(P6/P7 previous-token, P13 taxon, K3/K4 kernel type and ETC, K7 class, the L roles). By default
a compact table that fits :data:`WIDTH` columns: the columns some analysis filled, most useful
first (:data:`COMPACT`: the roles, then their scores) while the lines fit, the rest named
below it; ``--wide`` prints every filled column, ``--csv`` the whole table as CSV. Numbers
print with 3 significant digits, integers (``p7_rank``) as integers.

``inspect`` opens any HDF5 file the pipeline writes read-only (even a partial one, which
it flags; ``--verify`` also reads every dataset so that damaged bytes are found by their
checksums, exit status 2) and prints the tree: every group with a one-line summary, every dataset with
shape, dtype, chunking, compression and attributes, and the root attributes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from posmech.core.io import REPO
from posmech.core.errors import PosmechError


def _attr(v: Any) -> Any:
    """An attribute value as plain JSON (JSON strings written by ``set_attrs`` decoded)."""
    if isinstance(v, bytes):
        v = v.decode("utf-8", "replace")
    if isinstance(v, str):
        if v[:1] in "[{":
            try:
                return json.loads(v)
            except ValueError:
                return v
        return v
    if isinstance(v, np.ndarray):
        return [_attr(x) for x in v.tolist()]
    if isinstance(v, np.generic):
        return v.item()
    return v


def verify(f: Any, block_bytes: int = 64 << 20) -> list[str]:
    """Read every dataset of open file ``f`` (in blocks along the first axes), so that
    HDF5 checks every chunk's fletcher32 checksum; the names of datasets that fail."""
    import h5py

    bad: list[str] = []

    def visit(name: str, obj: Any) -> None:
        if not isinstance(obj, h5py.Dataset) or obj.size == 0:
            return
        try:
            if obj.ndim == 0:
                obj[()]
                return
            row = max(1, obj.dtype.itemsize * int(np.prod(obj.shape[1:])))
            step = max(1, block_bytes // row)
            for i in range(0, obj.shape[0], step):
                obj[i : i + step]
        except OSError:
            bad.append(name)

    f.visititems(visit)
    return bad


def describe(path: str | Path, check: bool = False) -> dict[str, Any]:
    """The tree of an HDF5 file as plain data.

    ``{"path", "attrs", "status", "groups": {name: {"attrs", "summary"}},
    "datasets": {name: {"shape", "dtype", "chunks", "compression", "storage_bytes",
    "attrs"}}}``; names are full paths inside the file (no leading ``/``)."""
    import h5py

    from posmech.store.hdf5 import open_hdf5

    p = Path(path)
    what = not_pipeline_hdf5(p)
    if what:
        raise PosmechError(what)
    f = open_hdf5(p)
    groups: dict[str, Any] = {}
    datasets: dict[str, Any] = {}
    with f:
        def visit(name: str, obj: Any) -> None:
            attrs = {k: _attr(v) for k, v in obj.attrs.items()}
            if isinstance(obj, h5py.Group):
                groups[name] = {"attrs": attrs}
            else:
                datasets[name] = {
                    "shape": list(obj.shape), "dtype": str(obj.dtype if obj.dtype.kind != "O" else "str"),
                    "chunks": list(obj.chunks) if obj.chunks else None,
                    "compression": obj.compression, "storage_bytes": int(obj.id.get_storage_size()),
                    "attrs": attrs,
                }

        f.visititems(visit)
        root = {k: _attr(v) for k, v in f.attrs.items()}
        corrupt = verify(f) if check else []
    for g, info in groups.items():
        kids = [d for d in datasets if d.rsplit("/", 1)[0] == g]
        subgroups = [s for s in groups if s.rsplit("/", 1)[0] == g and "/" in s]
        below = [d for d in datasets if d.startswith(g + "/")]
        info["summary"] = (f"{len(kids)} datasets, {len(subgroups)} groups, {len(below)} datasets in all, "
                           f"{_size(sum(datasets[d]['storage_bytes'] for d in below))} stored")
    status = "complete" if root.get("complete") is True else (
        f"INCOMPLETE (no completion marker): rerun rule `{root.get('rule', '?')}`")
    if corrupt:
        status = (f"CORRUPT: {', '.join(corrupt)} fail(s) the checksum (bytes changed after writing): "
                  f"delete the file and rerun rule `{root.get('rule', '?')}`")
    elif check:
        status += ", every dataset read back (checksums verified where present)"
    return {"path": str(p), "attrs": root, "status": status, "groups": groups, "datasets": datasets}


HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def not_pipeline_hdf5(p: Path) -> str | None:
    """Why ``p`` is not a pipeline HDF5 file, for what is clearly something else (a
    directory, a text file, JSON lines, CSV, …); ``None`` when it may be one (an HDF5
    signature at offset 0, or a ``.h5``/``.hdf5`` name: then the HDF5 library decides,
    and a damaged file is reported as such)."""
    if not p.exists():
        return None
    if p.is_dir():
        n = sum(1 for _ in p.iterdir())
        return (f"{str(p)!r} is a directory ({n} entries), not a pipeline HDF5 file; "
                f"give one of its .h5 files (e.g. `python -m posmech inspect {p}/<name>.h5`)")
    if not p.is_file():
        return f"{str(p)!r} is not a regular file, not a pipeline HDF5 file"
    try:
        with open(p, "rb") as fh:
            head = fh.read(512)
    except OSError as err:
        return f"{str(p)!r} cannot be read ({err.strerror})"
    if head.startswith(HDF5_SIGNATURE) or p.suffix in (".h5", ".hdf5"):
        return None
    if not head:
        kind = "an empty file"
    elif b"\0" not in head:
        first = head.lstrip()[:1]
        kind = {b"{": "a JSON / JSON-lines text file", b"[": "a JSON text file"}.get(
            first, "a CSV text file" if p.suffix == ".csv" else "a text file")
    else:
        kind = f"a binary file of another format ({p.suffix or 'no extension'})"
    return f"{str(p)!r} is {kind}, not a pipeline HDF5 file (those are the results/**/*.h5 files)"


def _size(n: int) -> str:
    x = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if x < 1024 or unit == "GB":
            return f"{x:.0f} {unit}" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1024
    return f"{n} B"


def _short(v: Any, width: int = 100) -> str:
    s = json.dumps(v, default=str) if not isinstance(v, str) else v
    return s if len(s) <= width else s[: width - 3] + "..."


def format_tree(info: dict[str, Any]) -> str:
    """Human-readable tree of :func:`describe`'s output."""
    a = info["attrs"]
    total = sum(d["storage_bytes"] for d in info["datasets"].values())
    lines = [f"{info['path']}: kind {a.get('kind', '?')}, rule {a.get('rule', '?')}, "
             f"schema_version {a.get('schema_version', '?')}, {info['status']}, "
             f"{len(info['datasets'])} datasets, {_size(total)} stored"]
    for k in sorted(a):
        lines.append(f"  @{k} = {_short(a[k])}")
    names = sorted(list(info["groups"]) + list(info["datasets"]))
    for n in names:
        depth = n.count("/")
        pad = "  " * (depth + 1)
        leaf = n.rsplit("/", 1)[-1]
        if n in info["groups"]:
            g = info["groups"][n]
            lines.append(f"{pad}{leaf}/  ({g['summary']})")
            attrs = g["attrs"]
        else:
            d = info["datasets"][n]
            comp = f", {d['compression']}" if d["compression"] else ""
            chunks = f"chunks {tuple(d['chunks'])}" if d["chunks"] else "contiguous"
            lines.append(f"{pad}{leaf}  {tuple(d['shape'])} {d['dtype']}, {chunks}{comp}, {_size(d['storage_bytes'])}")
            attrs = d["attrs"]
        for k in sorted(attrs):
            lines.append(f"{pad}  @{k} = {_short(attrs[k])}")
    return "\n".join(lines)


#: the width the compact ``heads`` table fits (``--wide``: no limit)
WIDTH = 100
#: the columns of the compact ``heads`` table in the order they are taken while the lines fit
#: :data:`WIDTH`: the head, the roles (P7 rank and chosen heads, P13 taxon, K3/K4 kernel role and type, K7
#: class, L role), then the scores they are decided on; shown in ``heads.csv``'s order
COMPACT = ["head_name", "p7_rank", "p7_chosen", "l_role", "kernel_role", "score_taxon", "k7_class", "kernel_type",
           "prev_token_mass", "prev_token_excess", "previous_token", "diagonal_ratio", "etc_fraction", "etc",
           "l_previous_mass",
           "l_induction_score", "l_offset2_mass", "taxon_dip", "taxon_bump", "k7_duplicate_excess",
           "k7_local_mass", "k7_etc_fraction"]


#: the columns of ``heads.csv`` that hold integers (a gap: empty)
INTEGERS = ("p7_rank",)


def _number(x: float) -> str:
    """A score as the ``heads`` table prints it: 3 significant digits, a whole number without
    ``.0``."""
    return f"{x:.3g}"


def _render(df: Any) -> str:
    import pandas as pd

    df = df.copy()
    for c in df:
        if pd.api.types.is_integer_dtype(df[c]) and df[c].isna().any():  # Int64: to_string ignores na_rep
            df[c] = ["—" if pd.isna(v) else str(int(v)) for v in df[c]]
    return df.to_string(index=False, na_rep="—", float_format=_number)


def head_lines(table: Any, wide: bool = False, width: int = WIDTH) -> list[str]:
    """The ``heads`` table of a read ``heads.csv`` as lines: the columns some analysis filled
    (``model``, ``layer`` and ``head`` are in ``head_name``); without ``wide``, those of
    :data:`COMPACT` that fit ``width`` columns (in its order of preference), then a line
    naming the columns left out. The integer columns (:data:`INTEGERS`) print as integers
    even from a ``heads.csv`` written before they were typed."""
    import textwrap

    import pandas as pd

    shown = table.drop(columns=["model", "layer", "head"], errors="ignore").dropna(axis=1, how="all")
    shown = shown.loc[:, [c for c in shown if not (shown[c].astype(str) == "").all()]]
    for c in INTEGERS:
        col = shown.get(c)
        if col is not None and pd.api.types.is_float_dtype(col) and (col.dropna() % 1 == 0).all():
            shown[c] = col.astype("Int64")
    if wide:
        return _render(shown).splitlines()
    order = [c for c in COMPACT if c in shown] + [c for c in shown if c not in COMPACT]
    kept: list[str] = []
    for c in order:
        trial = [k for k in shown if k in (*kept, c)]
        if max(map(len, _render(shown[trial]).splitlines())) <= width:
            kept.append(c)
    cols = [c for c in shown if c in kept]
    lines = _render(shown[cols]).splitlines()
    left = [c for c in shown if c not in kept]
    if left:
        lines += textwrap.wrap(f"not shown: {', '.join(left)} (--wide: every column; --csv: the table as CSV)",
                               width)
    return lines


def _write(text: str) -> None:
    """Print ``text``; a reader that stops early (``… | head``) is fine, not an error."""
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # no second error when Python flushes at exit


def heads(model_dir: str, as_csv: bool = False, wide: bool = False) -> int:
    """``python -m posmech heads``: the head-roles table the rule ``head_table`` wrote
    (``results/MODEL/heads.csv``, :mod:`posmech.verdicts.heads`): compact by default
    (:func:`head_lines`), every filled column with ``wide``, CSV with ``as_csv``."""
    from posmech.store.tables import read_table

    d = Path(model_dir)
    path = d / "heads.csv"
    if not path.is_file():
        what = "is not a directory" if not d.is_dir() else "has no heads.csv"
        print(f"error: {str(d)!r} {what}: give a model's results folder (results/<model>) after a run "
              "that built it (rule head_table)", file=sys.stderr)
        return 1
    table = read_table(path)
    if as_csv:
        sys.stdout.write(table.to_csv(index=False))
        return 0
    title = f"heads of {d.name} ({len(table)} heads; from {path})"
    if len(title) > WIDTH and not wide:  # a long path on a line of its own
        title = f"heads of {d.name} ({len(table)} heads; from\n  {path})"
    _write("\n".join([title, *head_lines(table, wide)]))
    return 0


def _findings_file(path: str, fix: str) -> Path | None:
    """``path`` (a findings.csv or the folder holding one) as the file, or ``None`` after an
    error naming it and ``fix``."""
    p = Path(path)
    if p.is_dir():
        p = p / "findings.csv"
    if not p.is_file():
        print(f"error: {str(p)!r} does not exist: {fix}", file=sys.stderr)
        return None
    return p


def findings(path: str, claim: str | None = None) -> int:
    """``python -m posmech findings``: ``findings.csv`` (rule ``findings``) as a text grid, one
    row per claim and one column per model, each cell the verdict (``holds``, ``FAILS``, ``n/m``
    for not measurable) and the value; with ``--claim``, that claim's rows in full (the finding,
    the quantity, value, threshold and the reason in words)."""
    import pandas as pd

    from posmech.verdicts.findings import FINDINGS_COLUMNS, VERDICTS
    from posmech.store.tables import read_table

    p = _findings_file(path, "give results/report (or its findings.csv) after a run that built it (rule findings)")
    if p is None:
        return 1
    table = read_table(p)
    missing = [c for c in FINDINGS_COLUMNS if c not in table]
    if missing:
        print(f"error: {str(p)!r} lacks the columns {missing}: not a findings table (rule findings)", file=sys.stderr)
        return 1
    if claim is not None:
        rows = table[table["claim"] == claim]
        if rows.empty:
            print(f"error: no claim {claim!r} in {str(p)!r}; it has {', '.join(dict.fromkeys(table['claim']))}",
                  file=sys.stderr)
            return 1
        print(f"{claim}: {rows['finding'].iloc[0]}")
        for r in rows.to_dict("records"):
            value = "" if pd.isna(r["value"]) else f" = {r['value']:.4g}"
            print(f"  {r['model']}: {r['verdict']} ({r['rule']}: {r['quantity']}{value}) - {r['reason']}")
        return 0
    short = {"holds": "holds", "fails": "FAILS", "not measurable": "n/m"}
    cells = [short[v] if pd.isna(x) else f"{short[v]} {x:.3g}" for v, x in zip(table["verdict"], table["value"])]
    if "origin" in table:  # ◆: holds on the model's random-init twin too (structural)
        cells = [c + (" ◆" if o == "structural" else "") for c, o in zip(cells, table["origin"])]
    grid = table.assign(cell=cells).pivot(index="claim", columns="model", values="cell")
    grid = grid.loc[list(dict.fromkeys(table["claim"])), list(dict.fromkeys(table["model"]))]
    tally = " · ".join(f"{m}: " + ", ".join(f"{v} {int((g['verdict'] == v).sum())}" for v in VERDICTS)
                       for m, g in table.groupby("model", sort=False))
    print(f"findings of {p} ({tally}; n/m = not measurable; --claim ID for the reasons"
          + ("; ◆ = structural: holds on the model's random-init twin too" if "origin" in table
             and (table["origin"] == "structural").any() else "") + ")")
    print(grid.rename_axis(None).rename_axis(None, axis=1).to_string())
    return 0


def selfcheck(path: str) -> int:
    """``python -m posmech selfcheck``: expected vs obtained verdicts (see the module doc)."""
    from posmech.store.tables import read_table
    from posmech.verdicts import selfcheck as sc

    p = _findings_file(path, "run the self-check's DAG first (make selfcheck, config/selfcheck.yaml), then give "
                       "its results/report")
    if p is None:
        return 1
    expected = sc.expected_verdicts()
    try:
        checks = sc.compare(read_table(p), expected)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"self-check of {p} against the hand-built cases' expected verdicts (posmech.verdicts.selfcheck.CASES):")
    print(sc.format_checks(checks))
    return 0 if all(c.agrees for c in checks) else 1


#: what ``python -m posmech --help`` says first, plain text in one paragraph: a sentence that
#: fits its first line, then what the commands print
DESCRIPTION = ("Read what a posmech run wrote, or check a configuration before running it.",
               "The commands print a pipeline HDF5 file's tree, one model's heads by role, the findings "
               "grid or the self-check's verdicts, or every problem that would stop Snakemake before any job.")
#: each command's one-line summary (its ``--help`` and the epilog of ``python -m posmech --help``)
COMMANDS = {
    "inspect": "print the tree of a pipeline HDF5 file (read-only)",
    "heads": "the heads a run found for one model, by role (results/MODEL/heads.csv)",
    "findings": "the findings grid as text: claims x models, verdict and value",
    "check-config": "every check made before any job, without Snakemake (names a YAML syntax error's file and line)",
    "selfcheck": "expected vs obtained verdicts of the self-check (make selfcheck); exit 1 on any disagreement",
}


def _epilog(width: int = 79) -> str:
    import textwrap

    pad = max(map(len, COMMANDS)) + 4
    lines = ["commands (python -m posmech COMMAND --help for its options):"]
    for name, summary in COMMANDS.items():
        lines += textwrap.wrap(summary, width, initial_indent=f"  {name}".ljust(pad), subsequent_indent=" " * pad)
    lines += ["", "examples:", "  python -m posmech findings results/report --claim P5",
              "  python -m posmech heads results/demo-attn",
              "  python -m posmech check-config config/own-model.yaml"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import textwrap

    # the description wrapped here, the epilog's table as written (RawDescriptionHelpFormatter);
    # the commands are listed once, in the epilog (a subparser without help= is not listed above it)
    parser = argparse.ArgumentParser(prog="python -m posmech", description="\n".join(textwrap.fill(t, 79) for t in DESCRIPTION),
                                     epilog=_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                help="one of the commands below")
    ins = sub.add_parser("inspect", description=COMMANDS["inspect"])
    ins.add_argument("path")
    ins.add_argument("--json", action="store_true", help="machine-readable output")
    ins.add_argument("--verify", action="store_true",
                     help="read every dataset so that its checksums are checked (reads the whole file)")
    chk = sub.add_parser("check-config", description=COMMANDS["check-config"])
    chk.add_argument("configfiles", nargs="*", help="config files, in --configfile order (default: config/config.yaml)")
    chk.add_argument("--directory", "-d", default=".", help="the working directory of the run (models on disk)")
    hp = sub.add_parser("heads", description=COMMANDS["heads"])
    hp.add_argument("model_dir", metavar="RESULTS/MODEL")
    how = hp.add_mutually_exclusive_group()
    how.add_argument("--wide", action="store_true",
                     help=f"every column some analysis filled (default: the most useful that fit {WIDTH} columns)")
    how.add_argument("--csv", action="store_true", help="write the whole table as CSV")
    fp = sub.add_parser("findings", description=COMMANDS["findings"])
    fp.add_argument("path", nargs="?", default="results/report", metavar="RESULTS/REPORT",
                    help="results/report or its findings.csv (default: results/report)")
    fp.add_argument("--claim", help="one claim's verdicts with their reasons, e.g. P5")
    sp = sub.add_parser("selfcheck", description=COMMANDS["selfcheck"])
    sp.add_argument("path", nargs="?", default="results/report", metavar="RESULTS/REPORT",
                    help="results/report or its findings.csv (default: results/report)")
    args = parser.parse_args(argv)
    if args.command == "selfcheck":
        return selfcheck(args.path)
    if args.command == "findings":
        return findings(args.path, args.claim)
    if args.command == "heads":
        return heads(args.model_dir, args.csv, args.wide)
    if args.command == "check-config":
        from posmech.pipeline.preflight import check_config

        try:
            check_config(args.configfiles, REPO, args.directory)
        except PosmechError as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
        print("configuration OK: every check made before any job passed")
        return 0
    try:
        info = describe(args.path, check=args.verify)
    except PosmechError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    status = 2 if info["status"].startswith("CORRUPT") else 0
    text = json.dumps(info, indent=2, default=str) if args.json else format_tree(info)
    _write(text)
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
