"""A path is named once (issue 12): every output path of the workflow is written in its
rule's `output:` (an analysis rule's outputs: in its analyses' declaration,
workflow/analyses/<rule>.yaml, which the rule's `output:` unpacks) and nowhere else; `rule all`, the report and the scorecard collect from the
rules (`collect(rules.<rule>, ...)` in the rule's own stage file, workflow/rules/common.smk).

The static checks read the workflow files as text; the others run `snakemake -n` on small
workflows that include the real common.smk."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
WORKFLOW = REPO / "workflow"
FILES = [WORKFLOW / "Snakefile", *sorted((WORKFLOW / "rules").glob("*.smk"))]
#: the analyses' declarations: their `outputs` are the analysis rules' outputs
DECLARED = sorted((WORKFLOW / "analyses").glob("*.yaml"))
#: a path as a YAML value (a declared output): `key: results/...` or `path: results/...`
YAML_PATH = re.compile(r"^\s+\w+: ((?:results|resources)/\S+)\s*$")
SNAKEMAKE = Path(sys.executable).parent / "snakemake"

# a quoted path of the run's tree (f-strings included)
PATH_LITERAL = re.compile(r"""f?(["'])((?:results|resources)/[^"'\n]*)\1""")
DIRECTIVE = re.compile(r"^(\s*)(\w+):\s*(#.*)?$")
RULE = re.compile(r"^(?:rule|checkpoint) (\w+):", re.M)


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _output_paths(path: Path) -> list[tuple[int, str]]:
    """``(line, path)`` of every path literal inside an ``output:`` block of ``path``."""
    out, block, indent = [], None, -1
    for no, line in enumerate(_text(path).splitlines(), 1):
        if line.strip() and (len(line) - len(line.lstrip())) <= indent:
            block, indent = None, -1
        m = DIRECTIVE.match(line)
        if m and block is None:
            block, indent = m.group(2), len(m.group(1))
            continue
        if block == "output":
            out += [(no, p) for _, p in PATH_LITERAL.findall(line)]
    return out


def _declared_paths(path: Path) -> list[tuple[int, str]]:
    """``(line, path)`` of every output path an analysis declaration (YAML) writes."""
    return [(no, m.group(1)) for no, line in enumerate(_text(path).splitlines(), 1) if (m := YAML_PATH.match(line))]


def _all_outputs() -> dict[str, tuple[Path, int]]:
    found: dict[str, tuple[Path, int]] = {}
    for f in FILES + DECLARED:
        for no, p in (_declared_paths(f) if f.suffix == ".yaml" else _output_paths(f)):
            assert p not in found, f"{p} is an output of two rules ({found[p][0].name}:{found[p][1]}, {f.name}:{no})"
            found[p] = (f, no)
    return found


def test_the_parser_finds_the_outputs_of_every_stage():
    outputs = _all_outputs()
    # one known output per stage file: the parser reads what the rules declare
    for expected in ("resources/corpora/{corpus}.jsonl", "resources/models/{model}/manifest.json",
                     "results/{model}/tokens/{corpus}.h5", "results/{model}/activations/{corpus}.h5",
                     "results/{model}/geometry/extended.h5", "results/{model}/kernels/etc.csv",
                     "results/{model}/taxonomy/heads.csv", "results/{model}/interventions/prev_knockout.png",
                     "results/report/index.html"):
        assert expected in outputs
    assert len(outputs) >= 40


def _distinct_tail(path: str, outputs: dict[str, tuple[Path, int]]) -> str:
    """The shortest tail of ``path`` (file name, then with its folders) that no other output
    ends with: ``heads.csv`` is the name of two outputs (results/{model}/heads.csv and
    results/{model}/taxonomy/heads.csv), told apart by ``{model}/heads.csv`` and
    ``taxonomy/heads.csv``."""
    parts = path.split("/")
    for i in range(len(parts) - 1, -1, -1):
        tail = "/".join(parts[i:])
        if not any(o != path and (o == tail or o.endswith("/" + tail)) for o in outputs):
            return tail
    return path


def test_a_file_name_shared_by_two_outputs_is_told_apart_by_its_folders():
    outputs = {"results/{model}/heads.csv": (FILES[0], 1), "results/{model}/taxonomy/heads.csv": (FILES[0], 2),
               "results/{model}/kernels/etc.csv": (FILES[0], 3)}
    assert _distinct_tail("results/{model}/heads.csv", outputs) == "{model}/heads.csv"
    assert _distinct_tail("results/{model}/taxonomy/heads.csv", outputs) == "taxonomy/heads.csv"
    assert _distinct_tail("results/{model}/kernels/etc.csv", outputs) == "etc.csv"


def test_no_output_file_name_appears_in_two_workflow_files_or_twice():
    """Each output path is written once, in its rule's output (other rules read it as
    ``rules.<rule>.output.<key>``), and its file name in no other workflow file (unless
    the name is only a wildcard, ``{corpus}.h5``)."""
    texts = {f: _text(f) for f in FILES + DECLARED}
    outputs = _all_outputs()
    problems = []
    for path, (where, no) in outputs.items():
        written = sum(t.count(f'"{path}"') for t in texts.values()) + sum(
            len(re.findall(r":\s+" + re.escape(path) + r"\s*$", t, re.M)) for f, t in texts.items() if f.suffix == ".yaml")
        if written != 1:
            problems.append(f"{path} (output in {where.name}:{no}) written {written} times")
        name = _distinct_tail(path, outputs)
        if re.fullmatch(r"\{\w+\}(\.\w+)*", name):
            continue
        # (a subscript, config["twins"]["figures"], is a key, not a path)
        needle = re.compile(r"""(?<!\[)[/"']""" + re.escape(name) + r"""(["']|\s*$)""", re.M)
        elsewhere = sorted(f.name for f, t in texts.items() if f != where and needle.search(t))
        if elsewhere:
            problems.append(f"{name} (output in {where.name}:{no}) also written in {', '.join(elsewhere)}")
    assert not problems, "\n".join(problems)


def test_no_run_path_outside_an_output_block():
    """Inputs, params, targets and the report name other rules' outputs through the rules,
    never by a second copy of the path; repository files (resources/published.yaml) and the
    scorecard path contract in common.smk are the only other literals."""
    outputs = {(f, no) for f in FILES for no, _ in _output_paths(f)}
    strays = []
    for f in FILES:
        for no, line in enumerate(_text(f).splitlines(), 1):
            for _, p in PATH_LITERAL.findall(line):
                if (f, no) in outputs or (REPO / p).is_file():
                    continue
                if f.name == "common.smk" and p == "results/{{model}}/scorecard/{analysis}.csv":
                    continue
                strays.append(f"{f.name}:{no}: {p}")
    assert not strays, "\n".join(strays)


def test_no_name_is_assigned_twice_in_common_smk():
    tree = ast.parse(_text(WORKFLOW / "rules" / "common.smk"))
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names += [t.id for t in targets if isinstance(t, ast.Name)]
    twice = sorted(n for n, c in Counter(names).items() if c > 1)
    assert not twice, f"assigned more than once in common.smk: {twice}"


def test_every_rule_is_collected_in_its_own_stage_file():
    """A stage file is its rules plus their `collect` lines (the report is asked for by
    `rule all` itself)."""
    missing = []
    for f in sorted((WORKFLOW / "rules").glob("*.smk")):
        text = _text(f)
        for name in RULE.findall(text):
            if name != "report" and not re.search(rf"^collect\(\s*rules\.{name}\b", text, re.M):
                missing.append(f"{f.name}: rule {name}")
    assert not missing, "rules without a collect(...) line in their stage file: " + ", ".join(missing)


# --------------------------------------------------------------------------- collect() itself
def _dry_run(tmp_path: Path, rules: str) -> subprocess.CompletedProcess[str]:
    """``snakemake -n`` of a workflow made of the real common.smk (on the demo config) and
    ``rules``; prints the collected scorecards, figures and tables."""
    snakefile = tmp_path / "Snakefile"
    snakefile.write_text(
        f'configfile: "{REPO}/config/demo.yaml"\n\n\ninclude: "{WORKFLOW}/rules/common.smk"\n\n\n'
        + textwrap.dedent(rules)
        + '\nprint("SCORECARDS", collected("scorecard"))\nprint("FIGURES", collected("figure"))\n'
        'print("TABLES", collected("table"))\nprint("ALL", collected())\n\n\n'
        "rule all:\n    default_target: True\n    input:\n        collected(),\n",
        encoding="utf-8",
    )
    return subprocess.run([str(SNAKEMAKE), "-n", "-s", str(snakefile), "-d", str(tmp_path), "--cores", "1"],
                          capture_output=True, text=True, timeout=300)


def _printed(proc: subprocess.CompletedProcess[str], what: str) -> list[str]:
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith(what + " "))
    return ast.literal_eval(line[len(what) + 1:])


@pytest.mark.skipif(not SNAKEMAKE.exists(), reason="snakemake not installed next to this Python")
def test_collect_derives_targets_scorecards_figures_and_tables_from_the_rule(tmp_path):
    proc = _dry_run(tmp_path, """
        rule toy:
            output:
                table=report("results/{model}/toy/toy.csv", category="P"),
                figure=report("results/{model}/toy/toy_figure.png", category="P"),
                plain="results/{model}/toy/toy.h5",
                scorecard="results/{model}/scorecard/toy.csv",
            shell:
                "touch {output}"


        rule toy_across_models:
            output:
                figure=report("results/toy/all.png", category="P"),
            shell:
                "touch {output}"


        collect(rules.toy, model=["a", "b"])
        collect(rules.toy_across_models, when=False)
        """)
    assert proc.returncode == 0, proc.stderr
    assert _printed(proc, "SCORECARDS") == ["results/a/scorecard/toy.csv", "results/b/scorecard/toy.csv"]
    assert _printed(proc, "FIGURES") == ["results/a/toy/toy_figure.png", "results/b/toy/toy_figure.png"]
    assert _printed(proc, "TABLES") == ["results/a/toy/toy.csv", "results/b/toy/toy.csv"]
    # every output of every job, in the rule's order; nothing of the rule not wanted (when=False)
    assert _printed(proc, "ALL") == [
        p.format(m=m) for m in "ab" for p in ("results/{m}/toy/toy.csv", "results/{m}/toy/toy_figure.png",
                                              "results/{m}/toy/toy.h5", "results/{m}/scorecard/toy.csv")
    ]


@pytest.mark.skipif(not SNAKEMAKE.exists(), reason="snakemake not installed next to this Python")
def test_a_family_rule_is_collected_per_analysis_and_must_match_the_families_table(tmp_path):
    """A family rule (docs/workflow.md, "Families") named in posmech.core.families.FAMILIES: each
    analysis's scorecard is found under the analysis's name; a family rule whose outputs
    name other analyses than the table lists is refused before any job."""
    family = """
        rule kernels:
            output:
                positional_kernels__h5="results/{model}/k/kernels.h5",
                etc_table__table=report("results/{model}/k/etc.csv", category="K"),
                etc_table__scorecard="results/{model}/scorecard/etc_table.csv",
                kernel_heatmaps__figure=report("results/{model}/k/k.png", category="K"),
            shell:
                "touch {output}"


        collect(rules.kernels, model=["a"])
        """
    proc = _dry_run(tmp_path, family)
    assert proc.returncode == 0, proc.stderr
    assert _printed(proc, "SCORECARDS") == ["results/a/scorecard/etc_table.csv"]
    assert _printed(proc, "FIGURES") == ["results/a/k/k.png"] and _printed(proc, "TABLES") == ["results/a/k/etc.csv"]
    proc = _dry_run(tmp_path, family.replace("kernel_heatmaps__", "other__"))
    assert proc.returncode != 0
    assert ("the outputs of rule kernels name the analyses positional_kernels, etc_table, other; "
            "posmech.core.families.FAMILIES must list the same") in proc.stdout + proc.stderr


@pytest.mark.skipif(not SNAKEMAKE.exists(), reason="snakemake not installed next to this Python")
@pytest.mark.parametrize("output, call, message", [
    ('scorecard="results/{model}/scorecard/other.csv"', 'model=["a"]',
     "the scorecard output of analysis bad (rule bad) must be 'results/{model}/scorecard/bad.csv'"),
    ('"results/{model}/bad.csv"', 'model=["a"]', "name every output of rule bad"),
    ('table="results/{model}/{corpus}/bad.csv"', 'model=["a"]',
     "collect(rules.bad): give one list of values per wildcard of its outputs (corpus, model), got model"),
])
def test_collect_refuses_what_the_report_could_not_find(tmp_path, output, call, message):
    proc = _dry_run(tmp_path, f"""
        rule bad:
            output:
                {output},
            shell:
                "touch {{output}}"


        collect(rules.bad, {call})
        """)
    assert proc.returncode != 0
    assert message in proc.stdout + proc.stderr


def _rules_by_placement() -> dict[str, set[str]]:
    """Every rule of the stage files by where a cluster run puts it: ``heavy`` (requests
    ``gpu=heavy_resources``), ``local`` (in a ``localrules:`` list) or ``cpu`` (submitted, CPU only)."""
    local: set[str] = set()
    heavy: set[str] = set()
    every: set[str] = set()
    for f in FILES:
        text = _text(f)
        for m in re.finditer(r"^localrules:\n((?:    \w+,\n)+)", text, re.M):
            local |= set(re.findall(r"(\w+),", m.group(1)))
        for block in re.split(r"^rule ", text, flags=re.M)[1:]:
            name = block.split(":")[0]
            every.add(name)
            if "gpu=heavy_resources" in block:
                heavy.add(name)
    return {"heavy": heavy, "local": local | {"all"}, "cpu": every - heavy - local - {"all"}}


def test_the_cluster_docs_place_every_rule_where_the_workflow_does():
    """docs/cluster.md's "Which rules run where" table names every rule once, in the column
    its declaration puts it in (model-heavy, submitted CPU-only, local)."""
    table = next(line for line in _text(REPO / "docs/cluster.md").splitlines() if line.startswith("| `"))
    cells = [set(re.findall(r"`(\w+)`", c)) for c in table.strip("|").split(" | ")]
    want = _rules_by_placement()
    assert cells == [want["heavy"], want["cpu"], want["local"]]


def test_workflow_catalog_file_matches_the_workflow():
    """.snakemake-workflow-catalog.yml: the keys the catalog reads, a conda environment that
    every rule with a script names, and report: true backed by the native --report test."""
    import re
    from pathlib import Path

    import yaml

    repo = Path(__file__).resolve().parents[1]
    cat = yaml.safe_load((repo / ".snakemake-workflow-catalog.yml").read_text())
    usage = cat["usage"]
    assert set(usage) == {"mandatory-flags", "software-stack-deployment", "report"}
    assert "--configfile config/demo.yaml" in usage["mandatory-flags"]["desc"]
    stack = usage["software-stack-deployment"]
    assert stack == {"conda": True, "apptainer": False, "apptainer+conda": False}
    assert (repo / "workflow" / "Snakefile").is_file() and (repo / "config" / "README.md").is_file()
    for smk in (repo / "workflow" / "rules").glob("*.smk"):
        text = smk.read_text()  # every rule running a script names the environment
        assert len(re.findall(r"^    script:", text, flags=re.M)) <= text.count('"../envs/posmech.yaml"'), smk
    assert usage["report"] is True
    assert "def test_native_snakemake_report_of_the_same_run" in (repo / "tests/workflow/test_report.py").read_text()


def test_the_head_roles_table_and_the_taxonomy_heads_resolve_to_their_own_rules(tmp_path):
    """results/{model}/heads.csv (rule head_table) and results/{model}/taxonomy/heads.csv (rule
    taxonomy, analysis diagonal_taxonomy) share a file name; the head table's model wildcard is one of the run's
    model names (never with '/'), so neither path is ambiguous (a dry run of the demo config)."""
    proc = subprocess.run(
        [str(SNAKEMAKE), "results/demo/heads.csv", "results/demo/taxonomy/heads.csv", "-n", "-s",
         str(WORKFLOW / "Snakefile"), "-d", str(tmp_path), "--cores", "1", "--configfile",
         str(REPO / "config" / "demo.yaml")],
        capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = re.findall(r"^rule (\w+):\n(?:    .*\n)*?    output: (.*)$", proc.stdout, re.M)
    by_rule = {rule: out for rule, out in jobs}
    assert by_rule["head_table"] == "results/demo/heads.csv"
    assert "results/demo/taxonomy/heads.csv" in by_rule["taxonomy"]  # the taxonomy family
    assert "Ambiguous" not in proc.stdout + proc.stderr


def test_every_analysis_rule_runs_on_the_job_models():
    """An analysis rule (its outputs declared in workflow/analyses/) constrains its model
    wildcard to JOB_MODELS: a twin without figures and a checkpoint run as a sweep point of
    their own (dynamics.smk), and a rule open to them too would make the DAG ambiguous."""
    loose = []
    for f in sorted((REPO / "workflow" / "rules").glob("*.smk")):
        for rule in re.split(r"^(?=rule \w+:)", f.read_text(encoding="utf-8"), flags=re.M)[1:]:
            if "declared_outputs(" in rule and re.search(r"model=regex\((?!JOB_MODELS\))", rule):
                loose.append(f"{f.name}: {rule.split(':', 1)[0]}")
    assert not loose, f"analysis rules whose model wildcard is not JOB_MODELS: {loose}"
