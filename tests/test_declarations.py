"""Each analysis declared once (issue 48): ``workflow/analyses/<rule>.yaml`` and what is derived
from it (posmech.core.families): the families and links, the rules' outputs and inputs, the
applicability table, the findings' quantities and thresholds, the config keys an analysis
declares of its own. Each check also runs on hand-built declarations where it must fail."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from posmech.core import families as fam
from posmech.core.config import apply_defaults, load_schema, validate_config
from posmech.core.errors import PosmechError
from posmech.pipeline import applicability as ap
from posmech.verdicts import findings as fd

REPO = Path(__file__).resolve().parents[1]


def write(folder: Path, files: dict[str, dict]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, doc in files.items():
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return folder


def analysis(**extra) -> dict:
    return {"does": "a stand-in analysis (P99)", "outputs": {"scorecard": "results/{model}/scorecard/x.csv"}, **extra}


# ---------------------------------------------------------------- the shipped declarations
def test_every_analysis_rule_has_a_declaration_and_a_rule_file_that_unpacks_it():
    """A rule file's `output:` is its declaration's (no path restated) and its script exists."""
    for rule, names in fam.rule_analyses().items():
        smk = [p for p in (REPO / "workflow/rules").glob("*.smk") if re.search(rf"^rule {rule}:", p.read_text(), re.M)]
        assert len(smk) == 1, rule
        text = smk[0].read_text()
        block = text[text.index(f"rule {rule}:"):]
        block = block[: block.index("\n    log:")]
        assert f'**declared_outputs("{rule}")' in block and "results/" not in block, rule
        if fam.rule_inputs(rule):
            assert f'**declared_inputs("{rule}")' in block, rule
        for name in names:
            assert (REPO / "scripts" / f"{name}.py").is_file(), name


def test_the_registries_are_derived_from_the_declarations():
    assert fam.FAMILIES == {r: n for r, n in fam.rule_analyses().items() if len(n) > 1}
    assert fam.FAMILIES["geometry"][:4] == ("extended_positional_embeddings", "positional_pca", "canonical_angles",
                                            "positional_sparsity")
    assert fam.LINKS["kernel_heatmaps"] == {"h5": "positional_kernels__h5", "table": "etc_table__table"}
    assert "posembed_attention" not in fam.LINKS  # it reads another rule's output: a rule input
    assert fam.rule_inputs("posembed_attention") == {"heads": ("taxonomy", "diagonal_taxonomy__heads")}
    assert set(ap.RULES) == set(fam.ANALYSES)
    assert ap.RULES["score_taxa"] == ap.Needs((), ("attention_statistics", "diagonal_taxonomy"))
    assert ap.RULES["layer0_decomposition"].requires == ("layer0_weights", "pre_ln")
    assert ap.RULES["random_token_patterns"].requires == ("position_variants",)
    assert ap.check_table() == []
    assert fam.rule_of("positional_sparsity") == "geometry" and fam.rule_of("bos_induction") == "bos_induction"
    assert fam.rule_of("fetch_model") == "fetch_model"


def test_every_claim_is_scored_by_one_analysis_whose_scorecard_is_an_output():
    found = fd.load_findings(REPO / "resources/findings.yaml")
    scored = fam.claims()
    assert len(found) >= 34 and {f.claim for f in found} == set(scored)
    for f in found:
        a, c = scored[f.claim]
        assert (f.rule, f.quantity, f.predicate, f.threshold, f.aggregate) == (
            a.name, c.quantity, c.predicate, c.threshold, c.aggregate)
        assert "scorecard" in a.outputs, a.name
    assert scored["P9"][0].name == "positional_sparsity" and scored["P9"][1].threshold == "p9_min_sparsity_ratio"


def test_every_caption_of_a_declared_output_exists():
    for rule in fam.rule_analyses():
        for key, o in fam.rule_outputs(rule).items():
            if o.caption:
                assert (REPO / "workflow/report" / f"{o.caption}.rst").is_file(), (rule, key)


# ---------------------------------------------------------------- what a declaration may not say
@pytest.mark.parametrize("files, message", [
    ({"fam": {"a": analysis(reads={"h5": "b.h5"}), "b": analysis(outputs={"h5": "results/{model}/b.h5"})}},
     "which its job runs after it"),
    ({"fam": {"a": analysis(reads={"h5": "nowhere.h5"}), "b": analysis()}}, "which no analysis declares"),
    ({"one": {"two": analysis()}}, "named as the rule"),
    ({"fam": {"fam": analysis(), "b": analysis()}}, "named apart from the rule"),
    ({"x": {"x": analysis(claims={"P1": {"quantity": "q", "predicate": ">=", "threshold": "t"}})},
      "y": {"y": analysis(claims={"P1": {"quantity": "q", "predicate": ">=", "threshold": "t"}})}},
     "claim P1 is scored by x and y"),
    ({"x": {"x": analysis(claims={"P1": {"quantity": "q", "predicate": "~", "threshold": "t"}})}}, "predicate"),
    ({"x": {"x": analysis(outputs={"fig": {"path": "results/{model}/x.png", "caption": "x", "section": "X"}})}},
     "has no `category`"),
    ({"src": {"src": analysis(outputs={"h5": "results/{model}/s.h5", "t": "results/{model}/t.csv"})},
      "fam": {"a": analysis(reads={"in": "src.h5"}), "b": analysis(reads={"in": "src.t"})}}, "name them apart"),
])
def test_a_declaration_that_contradicts_itself_is_refused_naming_the_file(tmp_path, files, message):
    with pytest.raises(PosmechError, match=re.escape(message)):
        fam.read_declarations(write(tmp_path / "analyses", files))


def test_a_finding_without_its_analysis_or_a_claim_without_its_finding_is_refused(tmp_path):
    analyses = fam.read_declarations(write(tmp_path / "analyses", {
        "x": {"x": analysis(claims={"P99": {"quantity": "q", "predicate": ">=", "threshold": "t"}})}}))
    entry = {"claim": "P99", "finding": "the stand-in holds", "not_measurable": "never, really"}
    ok = tmp_path / "ok.yaml"
    ok.write_text(yaml.safe_dump({"findings": [entry]}))
    (f,) = fd.load_findings(ok, analyses=analyses)
    assert (f.rule, f.quantity, f.threshold) == ("x", "q", "t")
    orphan = tmp_path / "orphan.yaml"
    orphan.write_text(yaml.safe_dump({"findings": [entry, {**entry, "claim": "P98"}]}))
    with pytest.raises(PosmechError, match="no analysis scores claim P98"):
        fd.load_findings(orphan, analyses=analyses)
    silent = tmp_path / "silent.yaml"
    silent.write_text(yaml.safe_dump({"findings": [{**entry, "claim": "P97"}]}))
    with pytest.raises(PosmechError, match="no analysis scores claim P97"):
        fd.load_findings(silent, analyses=analyses)
    missing = tmp_path / "missing.yaml"
    missing.write_text(yaml.safe_dump({"findings": []}))
    with pytest.raises(PosmechError):
        fd.load_findings(missing, analyses=analyses)
    restated = tmp_path / "restated.yaml"  # what judges it belongs to the declaration
    restated.write_text(yaml.safe_dump({"findings": [{**entry, "rule": "x", "quantity": "q"}]}))
    with pytest.raises(PosmechError, match="rule"):
        fd.load_findings(restated, analyses=analyses)


# ---------------------------------------------------------------- config keys of an analysis's own
def stand_in(tmp_path: Path) -> dict[str, fam.Analysis]:
    return fam.read_declarations(write(tmp_path / "analyses", {"stand_in": {"stand_in": analysis(
        config={"width": {"type": "integer", "default": 3, "minimum": 1,
                          "description": "how many positions the stand-in reads: 3, the posts' window"}},
        thresholds={"x1_min_value": {"type": "number", "default": 0.5, "minimum": 0, "maximum": 1,
                                     "description": "P99: half, above what a uniform head gives"}},
        claims={"P99": {"quantity": "q", "predicate": ">=", "threshold": "x1_min_value"}})}}))


def test_an_analysis_declares_its_own_config_keys_and_thresholds_once(tmp_path):
    base = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())
    schema = fam.compose_schema(base, stand_in(tmp_path))
    section = schema["properties"]["stand_in"]
    assert section["properties"]["width"]["default"] == 3 and section["additionalProperties"] is False
    assert schema["properties"]["findings"]["properties"]["x1_min_value"]["maximum"] == 1
    assert "stand_in" not in base["properties"]  # the loaded schema is not changed
    cfg = yaml.safe_load((REPO / "config/ci.yaml").read_text())
    filled = apply_defaults(cfg, schema)
    assert filled["stand_in"] == {"width": 3} and filled["findings"]["x1_min_value"] == 0.5
    with pytest.raises(PosmechError, match="stand_in"):
        validate_config({**cfg, "stand_in": {"width": 0}}, schema, base=str(REPO))
    twice = fam.read_declarations(write(tmp_path / "twice", {"g": {"g": analysis(
        section="geometry", config={"seed": {"type": "integer", "default": 1, "description": "restated here"}})}}))
    with pytest.raises(PosmechError, match="`geometry.seed` is declared twice"):
        fam.compose_schema(base, twice)
    misspelt = fam.read_declarations(write(tmp_path / "misspelt", {"m": {"m": analysis(
        claims={"P6": {"quantity": "q", "predicate": ">=", "threshold": "p6_min_fractoin"}})}}))
    with pytest.raises(PosmechError, match="claim P6's threshold `p6_min_fractoin` is not a key"):
        fam.compose_schema(base, misspelt)


def test_the_shipped_schema_is_composed_with_the_declarations():
    composed = load_schema(REPO / "workflow/schemas/config.schema.yaml")
    own = {(a.section, k) for a in fam.ANALYSES.values() for k in a.config} | {
        ("findings", k) for a in fam.ANALYSES.values() for k in a.thresholds}
    for section, key in own:
        assert key in composed["properties"][section]["properties"]


# ---------------------------------------------------------------- who names an analysis
#: the files outside an analysis's own rooms that may name analyses, each with why: they read
#: an analysis's outputs by name (consumers), or they are prose, data or generated
READERS = {
    "src/posmech/store/hdf5.py": "names the rule to rerun for each kind of artifact (KIND_RULES)",
    "src/posmech/verdicts/heads.py": "the head-roles table reads the per-head tables of five analyses",
    "src/posmech/verdicts/dynamics.py": "the sweep follows the quantities of named analyses' tables",
    "src/posmech/pipeline/preflight.py": "pre-run checks name the analysis whose config key is wrong",
    "src/posmech/core/families.py": "HEAD_TABLE_SOURCES: the head table's inputs",
    "src/posmech/pipeline/demo_numbers.py": "make demo-numbers quotes named scorecards of the demo run",
}
#: a config section or key that shares an analysis's name is not a mention of the analysis
SECTION_NAMED = ("src/posmech/settings/", "src/posmech/core/config.py", "src/posmech/core/errors.py")


def naming_files(name: str, files: list[str], texts: dict[str, str]) -> list[str]:
    rx = re.compile(r"(?<![A-Za-z0-9_])" + re.escape(name) + r"(?![A-Za-z0-9_])")
    return sorted(f for f in files if rx.search(texts[f]))


def room_of(f: str, a: fam.Analysis) -> str | None:
    """Which room of analysis ``a`` file ``f`` is, or ``None``."""
    readers = [b for b in fam.ANALYSES.values() if a.name in b.after]
    family = "posembed" if a.rule.startswith("posembed_") else fam.rule_of(a.name)
    family = {"extended_averaging": "interventions", "bos_induction": "attn_only",
              "rotary_frequencies": "rotary"}.get(family, family)
    rooms = {
        "declaration": f == f"workflow/analyses/{a.rule}.yaml",
        "script": f == f"scripts/{a.name}.py" or f == f"scripts/{a.rule}_family.py",
        "library": f.startswith((f"src/posmech/analyses/{family}", "src/posmech/analyses/")) and f.endswith(".py"),
        "plot": f == f"src/posmech/plots/{family}.py",
        "test": f.startswith("tests/"),
        "caption": f.startswith("workflow/report/"),
        "a reader's declaration or script": any(f in (f"workflow/analyses/{b.rule}.yaml", f"scripts/{b.name}.py")
                                                 for b in readers),
        "workflow (its rule's resources, a rule that reads it)": f.startswith("workflow/rules/"),
        "prose, data or generated": f.endswith(".md") or f.startswith(("bench/", "resources/", "config/"))
        or f == "docs/demo-numbers.json"
        or f == "workflow/schemas/config.schema.yaml",
        "reader": f in READERS or f.startswith(SECTION_NAMED),
    }
    return next((room for room, yes in rooms.items() if yes), None)


def test_the_files_that_name_each_analysis_are_its_rooms_readers_and_prose(capsys):
    """For every analysis, the files that name it (printed with -s): its declaration, script,
    library, plot, tests, caption, prose and data, and the few readers of its outputs
    (:data:`READERS`). No other file restates it: a registry of analyses is derived."""
    files = [f for f in subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True).stdout.split()
             if not f.endswith((".png", ".h5", ".lock"))]
    texts = {f: (REPO / f).read_text(encoding="utf-8", errors="replace") for f in files if (REPO / f).is_file()}
    files = list(texts)
    strays = []
    with capsys.disabled():
        for a in fam.ANALYSES.values():
            named = naming_files(a.name, files, texts)
            rooms = [room_of(f, a) for f in named]
            strays += [f"{a.name}: {f}" for f, r in zip(named, rooms) if r is None]
            if os.environ.get("POSMECH_LIST_NAMING"):
                print(f"{a.name}: {len(named)} files; " + ", ".join(f"{r}: {rooms.count(r)}" for r in dict.fromkeys(rooms)))
    assert not strays, "files that name an analysis outside its rooms (derive them from the declaration):\n" + \
        "\n".join(strays)
