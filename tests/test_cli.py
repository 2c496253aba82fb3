"""``python -m posmech inspect``: read-only, every dataset shown, and in agreement with
docs/artifacts.md (every dataset the file has is documented, every documented one is there)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from posmech.analyses.cache import PARTIAL, cache_activations
from posmech.cli import describe, main
from posmech.data.tokens import read_tokens, write_tokens
from posmech.models.loading import load_bridge
from posmech.settings import defaults

REPO = Path(__file__).resolve().parents[1]


def documented_datasets(section_title: str, hooks: list[str]) -> set[str]:
    """Dataset names in the table of the docs/artifacts.md section whose heading starts
    with ``section_title`` (``{hook}`` expanded)."""
    text = (REPO / "docs" / "artifacts.md").read_text()
    sections = re.split(r"^## ", text, flags=re.M)
    [sec] = [s for s in sections if s.startswith(section_title)]
    names: set[str] = set()
    for line in sec.splitlines():
        if line.startswith("| `"):
            first = line.split("|")[1]
            for n in re.findall(r"`([^`]+)`", first):
                names |= {n.replace("{hook}", h) for h in hooks} if "{hook}" in n else {n}
    return names


@pytest.fixture(scope="module")
def files(tmp_path_factory, prev_token_model_dir):
    d = tmp_path_factory.mktemp("inspect")
    docs = [{"doc_index": i, "text": "x" * (3 + i), "title": f"Genesis {i + 1}", "book": "GENESIS", "chapter": i + 1}
            for i in range(5)]
    ids = [np.concatenate([[0], np.arange(1, 3 + i)]).astype(np.int32) for i in range(5)]
    write_tokens(d / "tokens.h5", ids, docs, {"model": "prevtok", "corpus": "bible", "config_hash": "t"})
    bridge = load_bridge({"hf_dir": str(prev_token_model_dir), "name": "prevtok"}, device="cpu")
    cache_activations(bridge, read_tokens(d / "tokens.h5"), d / "acts.h5", defaults("cache", batch_size=2),
                      {"model": "prevtok", "processing": "compatibility", "corpus": "bible"})
    return d


def test_inspect_lists_exactly_the_documented_activation_datasets(files):
    info = describe(files / "acts.h5")
    assert info["status"] == "complete" and info["attrs"]["kind"] == "activations"
    documented = documented_datasets("Activations", info["attrs"]["hooks"])
    assert set(info["datasets"]) == documented
    acts = info["datasets"]["activations/resid_pre"]
    assert acts["shape"] == [3, int(info["attrs"]["n_tokens"]), 26] and acts["dtype"] == "float16"
    assert acts["chunks"][0] == 1 and acts["attrs"]["hook_points"][-1] == "ln_final.hook_in"
    # every root attribute the cache writes is documented too
    doc_text = (REPO / "docs" / "artifacts.md").read_text()
    for key in info["attrs"]:
        assert f"`{key}`" in doc_text, f"root attribute {key} undocumented"
    for name, ds in info["datasets"].items():
        for key in ds["attrs"]:
            assert f"`{key}`" in doc_text, f"attribute {key} of {name} undocumented"


def test_inspect_works_on_tokens_files_and_matches_their_docs(files):
    info = describe(files / "tokens.h5")
    assert info["attrs"]["kind"] == "tokens"
    assert set(info["datasets"]) == documented_datasets("Tokens", [])


def test_inspect_cli_text_and_json(files, capsys):
    assert main(["inspect", str(files / "acts.h5")]) == 0
    text = capsys.readouterr().out
    assert "kind activations" in text and "complete" in text
    assert re.search(r"resid_pre  \(3, \d+, 26\) float16, chunks \(1, \d+, 26\)", text)
    assert re.search(r"position_stats/ +\(1 datasets, 2 groups", text)
    assert "@hook_points" in text
    proc = subprocess.run([sys.executable, "-m", "posmech", "inspect", str(files / "tokens.h5"), "--json"],
                          capture_output=True, text=True, check=True)
    info = json.loads(proc.stdout)
    assert info["datasets"]["token_ids"]["dtype"] == "int32"
    assert info["attrs"]["corpus"] == "bible"


def test_inspect_is_read_only_and_flags_partial_and_corrupt_files(files, tmp_path, capsys):
    before = (files / "acts.h5").stat().st_mtime_ns
    describe(files / "acts.h5")
    assert (files / "acts.h5").stat().st_mtime_ns == before
    partial = tmp_path / ("acts.h5" + PARTIAL)
    partial.write_bytes((files / "acts.h5").read_bytes())
    with h5py.File(partial, "r+") as f:
        f.attrs["complete"] = False
    assert main(["inspect", str(partial)]) == 0
    assert "INCOMPLETE" in capsys.readouterr().out and "cache_activations" in describe(partial)["status"]
    bad = tmp_path / "bad.h5"
    bad.write_bytes((files / "acts.h5").read_bytes()[:3000])
    assert main(["inspect", str(bad)]) == 1
    assert "corrupt or truncated" in capsys.readouterr().err
    assert main(["inspect", str(tmp_path / "missing.h5")]) == 1


def _head_table(d):
    """A results/<model> folder with the head-roles table heads.csv as the rule head_table writes it."""
    import pandas as pd

    from posmech.verdicts.heads import head_table
    from posmech.store.tables import write_table

    d.mkdir(parents=True)
    etc = pd.DataFrame({"head_name": ["L0H0", "L0H0", "L0H1", "L0H1", "L1H0", "L1H0", "L1H1", "L1H1"],
                        "n": [5, 31] * 4, "kernel_type": ["local", "uniform", "local", "slow_decay"] * 2,
                        "zero_score_kernel_type": "uniform", "etc_mean": [1.0, 20.0, 1.5, 7.0, 1.0, 2.0, 3.0, 4.0]})
    etc["etc_fraction"] = etc["etc_mean"] / (etc["n"] - 1)
    write_table(head_table("m", etc=etc, n=31), d / "heads.csv")


def test_heads_prints_the_head_table(tmp_path, capsys):
    d = tmp_path / "results" / "m"
    _head_table(d)
    assert main(["heads", str(d)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("heads of m (4 heads; from")
    if not lines[0].endswith(".csv)"):  # a long path: on a line of its own
        lines.pop(1)
    # columns no analysis filled are left out
    assert lines[1].split() == ["head_name", "etc", "etc_fraction", "kernel_type", "kernel_role"]
    rows = {ln.split()[0]: ln.split() for ln in lines[2:]}
    assert list(rows) == ["L0H0", "L0H1", "L1H0", "L1H1"]  # layer, then head
    # at n = 31, 3 digits; a uniform kernel is no role
    assert rows["L0H1"][1:] == ["7", "0.233", "slow_decay", "slow_decay"] and rows["L0H0"][3:] == ["uniform", "none"]
    assert main(["heads", str(d), "--csv"]) == 0
    import io

    import pandas as pd

    from posmech.verdicts.heads import HEAD_COLUMNS

    table = pd.read_csv(io.StringIO(capsys.readouterr().out))
    assert list(table.columns) == HEAD_COLUMNS
    assert table.set_index("head_name").loc["L1H1", "layer"] == 1


def _ci_like_head_table(d):
    """A results/<model> folder with a heads.csv of every source, as a CI run's 2-layer model
    in every analysis gets it: the longest labels, ranks with gaps, layer-0-only K7 classes."""
    import pandas as pd

    from posmech.store.tables import write_table
    from posmech.verdicts.heads import head_table

    names = [f"L{layer}H{h}" for layer in range(2) for h in range(4)]
    prev = [True, True, True, True, False, False, False, False]
    taxonomy = pd.DataFrame({"head_name": names, "is_previous_token": prev,
                             "prev_token_mass": [0.891, 0.237, 0.3, 0.25, 0.01, 0.02, 0.03, 0.04],
                             "prev_token_excess": [0.792, 0.138, 0.2, 0.15, -0.09, -0.08, -0.07, -0.06],
                             "ratio": [0.0745, 0.921, 0.5, 0.6, 1.0, 0.9, 0.8, 0.7],
                             "rank": pd.array([1, 4, 2, 3, None, None, None, None], dtype="Int64")})
    chosen = pd.DataFrame({"head_name": ["L0H0", "L0H1"], "role": ["sharp", "early"]})
    taxa = pd.DataFrame({"head_name": names, "taxon": ["bright sub-diagonal", "dark diagonal", "neither"] * 2
                         + ["neither"] * 2, "dip": [0.4984] * 8, "bump": [0.6186] * 8})
    etc = pd.DataFrame({"head_name": names, "n": 31, "kernel_type": ["local", "slow_decay", "uniform", "local"] * 2,
                        "zero_score_kernel_type": "uniform", "etc_mean": [2.989, 9.317, 20.0, 3.0] * 2})
    etc["etc_fraction"] = etc["etc_mean"] / 30
    classes = pd.DataFrame({"head_name": names[:4], "head_class": ["duplicate_token", "detokenization",
                                                                   "contextual", "other"],
                            "duplicate_excess": [0.0012] * 4, "local_mass": [0.986] * 4, "etc_fraction": [0.0351] * 4})
    roles = pd.DataFrame({"role": ["previous", "look_back_two", "induction"], "head_name": ["L0H0", "L0H3", "L1H0"]})
    masses = pd.DataFrame([{"head_name": n, "mass": m, "value": v} for n in names
                           for m, v in (("previous", 0.982), ("offset_2", 0.000195), ("induction_score", 1.6e-06))])
    d.mkdir(parents=True)
    write_table(head_table("demo-attn", taxonomy=taxonomy, chosen=chosen, taxa=taxa, etc=etc, n=31,
                           classes=classes, roles=roles, masses=masses), d / "heads.csv")


def test_heads_fits_100_columns_by_default_and_prints_integers_as_integers(tmp_path, capsys):
    from posmech.cli import COMPACT, WIDTH

    d = tmp_path / "results" / "demo-attn"
    _ci_like_head_table(d)
    assert main(["heads", str(d)]) == 0
    lines = capsys.readouterr().out.splitlines()
    if not lines[0].endswith(".csv)"):  # tmp_path is long: the path on a line of its own
        assert lines.pop(1) == f"  {d / 'heads.csv'})"
    assert WIDTH == 100 and all(len(ln) <= 100 for ln in lines), max(lines, key=len)
    header = lines[1].split()
    # the roles come first: every role column is shown, the scores as far as they fit
    assert header[:2] == ["head_name", "p7_rank"] and set(header) <= set(COMPACT)
    assert {"p7_chosen", "score_taxon", "kernel_role", "k7_class", "l_role"} <= set(header)
    rows = {ln.split()[0]: ln.split() for ln in lines[2:10]}
    assert rows["L0H0"][header.index("p7_rank")] == "1" and rows["L1H0"][header.index("p7_rank")] == "—"
    assert header[-1] == "l_role" and rows["L1H0"][-1] == "induction"  # (score_taxon's values have spaces)
    left = " ".join(lines[10:])
    assert left.startswith("not shown: ") and "--wide" in left and "prev_token_mass" in left
    assert main(["heads", str(d), "--wide"]) == 0
    wide = capsys.readouterr().out.splitlines()
    assert len(wide[1].split()) == 22 and max(map(len, wide)) > 100  # every filled column: what wrapped before
    rank = wide[1].split().index("p7_rank")
    assert [ln.split()[rank] for ln in wide[2:]] == ["1", "4", "2", "3", "—", "—", "—", "—"]  # not 1.0, not <NA>
    with pytest.raises(SystemExit):
        main(["heads", str(d), "--wide", "--csv"])  # one or the other


def test_help_opens_with_a_sentence_and_lists_the_commands(capsys):
    from posmech.cli import COMMANDS

    with pytest.raises(SystemExit) as stop:
        main(["--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    usage, description, *rest = out.split("\n\n")
    assert usage.startswith("usage: python -m posmech")
    first = description.splitlines()[0]
    assert first[0].isupper() and first.endswith(".") and len(first) <= 79  # a full sentence on its own line
    assert description.rstrip().endswith(".") and "``" not in out and ":mod:" not in out  # plain text, not reST
    epilog = "\n".join(rest)
    for name, summary in COMMANDS.items():
        assert f"\n  {name} " in epilog and " ".join(summary.split()[:4]) in " ".join(epilog.split())


def test_heads_names_what_it_looked_for(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["heads", str(tmp_path / "empty")]) == 1
    err = capsys.readouterr().err
    assert "has no heads.csv" in err and "results/<model>" in err and "head_table" in err
    assert main(["heads", str(tmp_path / "missing")]) == 1
    assert "is not a directory" in capsys.readouterr().err


def _findings_csv(d):
    import pandas as pd

    from posmech.verdicts.findings import FINDINGS_COLUMNS
    from posmech.store.tables import write_table

    rows = [("P5", "a", "holds", 0.2, "0.2 <= 0.5"), ("P5", "b", "not measurable", None, "no earlier layer"),
            ("K1", "a", "fails", 0.31, "0.31 < 0.9"), ("K1", "b", "holds", 0.95, "0.95 >= 0.9")]
    df = pd.DataFrame([{"claim": c, "model": m, "verdict": v, "quantity": "q", "value": x, "threshold": 0.5,
                        "reason": why, "rule": "r", "finding": f"finding of {c}"} for c, m, v, x, why in rows],
                      columns=FINDINGS_COLUMNS)
    d.mkdir(parents=True)
    write_table(df, d / "findings.csv")


def test_findings_prints_the_grid_and_one_claims_reasons(tmp_path, capsys):
    d = tmp_path / "results" / "report"
    _findings_csv(d)
    assert main(["findings", str(d)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "a: holds 1, fails 1, not measurable 0 · b: holds 1, fails 0, not measurable 1" in lines[0]
    assert lines[1].split() == ["a", "b"]  # models in the run's order
    assert lines[2].split() == ["P5", "holds", "0.2", "n/m"] and lines[3].split() == ["K1", "FAILS", "0.31",
                                                                                     "holds", "0.95"]
    assert main(["findings", str(d / "findings.csv"), "--claim", "P5"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("P5: finding of P5\n") and "b: not measurable (r: q) - no earlier layer" in out
    assert "a: holds (r: q = 0.2) - 0.2 <= 0.5" in out


def test_findings_names_what_is_missing(tmp_path, capsys):
    assert main(["findings", str(tmp_path)]) == 1
    assert "findings.csv' does not exist" in capsys.readouterr().err
    _findings_csv(tmp_path / "r")
    assert main(["findings", str(tmp_path / "r"), "--claim", "Q9"]) == 1
    err = capsys.readouterr().err
    assert "no claim 'Q9'" in err and "it has P5, K1" in err
