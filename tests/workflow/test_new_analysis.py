"""A new analysis touches six files (issue 48): add a stand-in analysis with a config key of
its own and a claim to a copy of the repository, as a developer would, and check that the
workflow, the registries, the config and the findings pick it up from its declaration alone.

The stand-in joins the geometry family: per layer, the RMS of the centred extended
positional embeddings over W_pos's (claim P19, a made-up one). The files a developer writes:

1. its declaration: an entry in ``workflow/analyses/geometry.yaml`` (reads, outputs, the
   config key ``geometry.stand_in_width``, the threshold ``p19_min_spread``, claim P19);
2. its script ``scripts/stand_in_spread.py``;
3. its library function, in ``src/posmech/analyses/geometry.py``;
4. its plot, in ``src/posmech/plots/geometry.py``;
5. its unit test, in ``tests/analyses/test_geometry.py``;
6. its caption ``workflow/report/stand_in_spread.rst``;

plus the claim's published value (``resources/published.yaml``) and prose
(``resources/findings.yaml``'s sentence, ``docs/claims.md``). The generated files are
rewritten by the Makefile's ``docs`` target. Nothing else changes: not the rule file,
the Snakefile, common.smk, a registry of families, links or applicability.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.workflow

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
SNAKEMAKE = str(Path(PY).parent / "snakemake")

DECLARATION = """
stand_in_spread:
  does: The RMS of the centred extended positional embeddings of each layer over W_pos's (P19, a stand-in).
  reads: {h5: extended_positional_embeddings.h5}
  category: P
  config:
    stand_in_width:
      type: integer
      default: 8
      minimum: 2
      description: How many positions from the first analysed one the stand-in reads (8, a short window).
  thresholds:
    p19_min_spread:
      type: number
      default: 0.0
      minimum: 0
      description: "P19 (a stand-in): any spread at all, the least a claim can ask."
  outputs:
    table:
      path: results/{model}/geometry/stand_in.csv
      caption: stand_in_spread
      section: Positional geometry (P1, P9-P11)
    figure:
      path: results/{model}/geometry/stand_in.png
      caption: stand_in_spread
      section: Positional geometry (P1, P9-P11)
    scorecard: results/{model}/scorecard/stand_in_spread.csv
  claims:
    P19: {quantity: spread_ratio, predicate: '>=', threshold: p19_min_spread}
"""

SCRIPT = '''"""Rule geometry, analysis stand_in_spread (P19): the RMS of the extended embeddings over W_pos's."""

from posmech.analyses import geometry as geo
from posmech.pipeline.runner import run
from posmech.plots import geometry as plots
from posmech.store.tables import scorecard_rows, write_table


def main(smk, log):
    model, s, out = smk.wildcards.model, smk.params.settings, smk.output
    ext = geo.read_extended_artifact(smk.input.h5)
    table = geo.spread_table(ext, model, geo.analysis_first(ext, s.first_position), s.stand_in_width)
    write_table(table, out.table, {"width": s.stand_in_width})
    plots.spread(table, f"P19 {model}: RMS of the extended embeddings over W_pos's", out.figure)
    write_table(scorecard_rows(geo.spread_scorecard(table, model, out.table)), out.scorecard)


if __name__ == "__main__":
    run(snakemake, main)  # noqa: F821
'''

LIBRARY = '''

def spread_table(ext: Extended, model: str, first: int, width: int) -> pd.DataFrame:
    """Per layer: the RMS entry of the centred extended embeddings over W_pos's, on ``width``
    positions from ``first`` (a stand-in analysis)."""
    w = rms(centre(ext.W_pos, first)[:width])
    return pd.DataFrame([{"claim": "P19", "model": model, "layer": i,
                          "ratio": rms(centre(ext.extended[i], first)[:width]) / w}
                         for i in range(ext.n_layers + 1)])


def spread_scorecard(table: pd.DataFrame, model: str, artifact: str) -> list[dict[str, Any]]:
    """P19 row: the largest ratio over the layers."""
    return [{"claim": "P19", "model": model, "quantity": "spread_ratio", "value": float(table["ratio"].max()),
             "detail": f"largest over {len(table)} layers", "artifact": artifact}]
'''

PLOT = '''

def spread(table: pd.DataFrame, title: str, path: str | None) -> None:
    """P19: the ratio per layer."""
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot(table["layer"], table["ratio"], marker="o")
    ax.set(title=title, xlabel="layer", ylabel="RMS ratio to W_pos")
    save(fig, path)
'''

UNIT_TEST = '''

def test_the_stand_in_spread_of_a_copy_of_w_pos_is_one():
    W = np.random.default_rng(0).normal(size=(12, 4))
    ext = geo.Extended(extended=np.stack([W, 2 * W]), W_pos=W, tokens=np.zeros(1), sites=["a", "b"],
                       first_token_position=0, agreement={}, attrs={})
    table = geo.spread_table(ext, "m", 0, 8)
    assert table["ratio"].tolist() == pytest.approx([1.0, 2.0])
    assert geo.spread_scorecard(table, "m", "t.csv")[0]["value"] == pytest.approx(2.0)
'''

CAPTION = """**P19 (a stand-in)**: per layer, the RMS entry of the centred extended positional embeddings of
``{{ snakemake.wildcards.model }}`` over ``W_pos``'s, on ``geometry.stand_in_width`` positions.
"""

FINDING = """  - claim: P19
    finding: a stand-in - the extended positional embeddings spread at least as much as W_pos in some layer
    not_measurable: no learned W_pos
"""

PUBLISHED = """  - claim: P19
    quantity: spread_ratio
    model: gpt2
    source: "000"
    what: a stand-in for a new claim
    published: a stand-in (no value)
    tolerance: null
"""

CLAIM_ROW = "| P19 | a stand-in | — | `geometry/stand_in.png` |\n"

HAND = {"workflow/analyses/geometry.yaml", "scripts/stand_in_spread.py", "src/posmech/analyses/geometry.py",
        "src/posmech/plots/geometry.py", "tests/analyses/test_geometry.py", "workflow/report/stand_in_spread.rst"}
CLAIM = {"resources/published.yaml", "resources/findings.yaml", "docs/claims.md"}


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


def _copy(dst: Path) -> Path:
    """The working tree's files (tracked and new, not ignored) under ``dst``, committed to a
    fresh git repository there."""
    files = _git(REPO, "ls-files", "-co", "--exclude-standard").split("\n")
    for f in filter(None, files):
        src = REPO / f
        if src.is_file():
            (dst / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / f)
    for args in (("init", "-q"), ("add", "-A"), ("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")):
        _git(dst, *args)
    return dst


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text(encoding="utf-8") + text, encoding="utf-8")


def _add_the_stand_in(repo: Path) -> None:
    _append(repo / "workflow/analyses/geometry.yaml", DECLARATION)
    (repo / "scripts/stand_in_spread.py").write_text(SCRIPT)
    _append(repo / "src/posmech/analyses/geometry.py", LIBRARY)
    _append(repo / "src/posmech/plots/geometry.py", PLOT)
    _append(repo / "tests/analyses/test_geometry.py", UNIT_TEST)
    (repo / "workflow/report/stand_in_spread.rst").write_text(CAPTION)
    findings = repo / "resources/findings.yaml"
    text = findings.read_text()
    anchor = "  # ---------------------------------------------------------------- L"
    findings.write_text(text.replace(anchor, FINDING + anchor, 1) if anchor in text else text + FINDING)
    _append(repo / "resources/published.yaml", PUBLISHED)
    claims = repo / "docs/claims.md"
    lines = claims.read_text().splitlines(keepends=True)
    at = max(i for i, line in enumerate(lines) if line.startswith("| P18 |"))
    claims.write_text("".join(lines[: at + 1] + [CLAIM_ROW] + lines[at + 1:]))


def _regenerate(repo: Path, env: dict[str, str]) -> None:
    """Run what ``make docs`` runs (the Makefile's recipes of ``config-doc`` and ``docs``, with
    this interpreter): every generated file rewritten from the schema and the declarations."""
    makefile = (repo / "Makefile").read_text()
    for target in ("config-doc", "docs"):
        recipe = re.search(rf"^{target}:.*\n((?:\t.*\n)+)", makefile, re.M)
        assert recipe, f"the Makefile has no {target} target"
        for line in recipe.group(1).splitlines():
            cmd = line.strip().replace("$(BIN)/python", PY)
            subprocess.run(cmd, shell=True, cwd=repo, env=env, check=True)


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory):
    repo = _copy(tmp_path_factory.mktemp("repo"))
    env = {**os.environ, "PYTHONPATH": str(repo / "src")}
    _add_the_stand_in(repo)
    _regenerate(repo, env)
    return repo, env


def test_the_stand_in_touches_six_files_plus_its_claim(stand_in):
    repo, _ = stand_in
    changed = {line[3:] for line in _git(repo, "status", "--porcelain", "-uall").splitlines()}
    generated = changed - HAND - CLAIM
    assert HAND <= changed and CLAIM <= changed
    # what `make docs` rewrites; nothing else a developer must edit
    assert generated <= {"config/README.md", "src/posmech/settings/schema_fields.py"} | {
        p for p in generated if p.startswith("docs/")}, sorted(generated)
    assert "stand_in_width" in (repo / "config/README.md").read_text()


def test_the_registries_the_config_and_the_findings_pick_it_up(stand_in):
    repo, env = stand_in
    probe = textwrap.dedent("""
        from posmech.core.families import FAMILIES, LINKS, rule_outputs
        from posmech.pipeline.applicability import RULES, why_not
        from posmech.models.architecture import Architecture
        from posmech.verdicts.findings import load_findings
        from posmech.core.io import REPO
        from posmech.settings import defaults
        print(FAMILIES["geometry"][-1], LINKS["stand_in_spread"]["h5"])
        print(RULES["stand_in_spread"].after)
        print(sorted(k for k in rule_outputs("geometry") if k.startswith("stand_in_spread")))
        f = {f.claim: f for f in load_findings(REPO / "resources/findings.yaml")}["P19"]
        print(f.rule, f.quantity, f.predicate, f.threshold)
        print(defaults("geometry").stand_in_width, defaults("geometry", stand_in_width=3).stand_in_width)
    """)
    out = subprocess.run([PY, "-c", probe], cwd=repo, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "stand_in_spread extended_positional_embeddings__h5"
    assert lines[1] == "('extended_positional_embeddings',)"
    assert lines[2] == "['stand_in_spread__figure', 'stand_in_spread__scorecard', 'stand_in_spread__table']"
    assert lines[3] == "stand_in_spread spread_ratio >= p19_min_spread"
    assert lines[4] == "8 3"


def test_the_repositorys_own_checks_accept_it(stand_in):
    """The consistency tests of the copy (declarations, paths named once, rooms, thin scripts,
    layering, generated files current, settings fields) and the stand-in's unit test pass."""
    repo, env = stand_in
    tests = ["tests/test_declarations.py", "tests/test_workflow_declarations.py", "tests/test_family_rooms.py",
             "tests/test_scripts_are_thin.py", "tests/test_layering.py", "tests/test_config_reference.py",
             "tests/test_settings.py", "tests/test_docs_generated.py", "tests/analyses/test_geometry.py::test_the_stand_in_spread_of_a_copy_of_w_pos_is_one"]
    out = subprocess.run([PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", *tests], cwd=repo, env=env,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def test_the_family_job_runs_it_and_the_finding_is_judged(stand_in, tmp_path):
    """The CI-sized model's geometry job writes the stand-in's outputs (rule file unchanged),
    the config key reaches it, and rule findings judges P19."""
    repo, env = stand_in
    cfg = yaml.safe_load((repo / "config/ci.yaml").read_text())
    cfg["geometry"]["stand_in_width"] = 5
    (tmp_path / "ci.yaml").write_text(yaml.safe_dump(cfg))
    run = subprocess.run([SNAKEMAKE, "--cores", "2", "--configfile", str(tmp_path / "ci.yaml"), "-d", str(tmp_path),
                          "--snakefile", str(repo / "workflow/Snakefile"),
                          "results/demo/scorecard/stand_in_spread.csv", "results/demo/geometry/stand_in.png"],
                         cwd=repo, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    probe = textwrap.dedent(f"""
        from posmech.store.tables import read_meta, read_table
        from posmech.verdicts import findings as fd
        from posmech.core.io import REPO
        t = read_table("{tmp_path}/results/demo/geometry/stand_in.csv")
        print(len(t), read_meta("{tmp_path}/results/demo/geometry/stand_in.csv")["width"])
        f = {{f.claim: f for f in fd.load_findings(REPO / "resources/findings.yaml")}}["P19"]
        row = read_table("{tmp_path}/results/demo/scorecard/stand_in_spread.csv").iloc[0].to_dict()
        v = fd.judge(f, "demo", {{"p19_min_spread": 0.0}}, row, True)
        print(v.verdict, v.value > 0)
    """)
    out = subprocess.run([PY, "-c", probe], cwd=repo, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    n_layers, width = out.stdout.splitlines()[0].split()
    assert int(n_layers) >= 2 and width == "5"
    assert out.stdout.splitlines()[1] == "holds True"
