"""A model lacking what findings study is not an error (issue 27, Deliver 3): the CI-sized
DAG on a random-init one-layer GPT-2 (tests/tiny_archs.py) — no layer ≥ 1, so no later head
can read layer 0's previous-token copy (P5), no previous-token head sits below another (P13,
P15) and there is no layer 1 (K10) — completes, judges every claim, gives those findings
`not measurable` with the reason in words, and builds the report."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

from posmech.findings import VERDICTS, load_findings
from tests import tiny_archs
from tests.workflow.conftest import REPO, snakemake


@pytest.fixture(scope="module")
def one_layer_run(tmp_path_factory):
    model = tiny_archs.gpt2_one_layer(tmp_path_factory.mktemp("one-layer-model") / "one")
    cfg = yaml.safe_load((REPO / "config" / "ci.yaml").read_text())
    cfg["models"] = {"one": {"source": str(model), "device": "cpu"}}
    cfg["corpora"]["bible"]["n_documents"] = 20
    path = tmp_path_factory.mktemp("one-layer-cfg") / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    work = tmp_path_factory.mktemp("one-layer-run")
    proc = snakemake(work, configfile=path)
    if proc.returncode != 0:
        pytest.fail(f"CI-sized DAG on a one-layer model failed (rc {proc.returncode}):\n{proc.stderr[-6000:]}")
    return work


def test_one_layer_model_findings_not_measurable_with_reasons_and_report_built(one_layer_run):
    work = one_layer_run
    assert (work / "results/report/index.html").stat().st_size > 0
    table = pd.read_csv(work / "results/report/findings.csv")
    claims = [f.claim for f in load_findings(REPO / "resources/findings.yaml")]
    assert sorted(table["claim"]) == sorted(claims) and set(table["model"]) == {"one"}
    assert set(table["verdict"]) <= set(VERDICTS)
    by = table.set_index("claim")
    for claim in ("P5", "P13", "P15", "K10"):
        assert by.loc[claim, "verdict"] == "not measurable", claim
        assert pd.isna(by.loc[claim, "value"]), claim
    assert "layer 0" in by.loc["P5", "reason"] and "no earlier layer" in by.loc["P5", "reason"]
    assert "below" in by.loc["P13", "reason"] and "below" in by.loc["P15", "reason"]
    assert "one layer" in by.loc["K10", "reason"] and "layer 1" in by.loc["K10", "reason"]
    # the rest of the run went on: the layer-0 and W_pos findings are judged
    assert set(by.loc[["P1", "P6", "K1", "K7", "C1"], "verdict"]) <= {"holds", "fails"}
    errors = [p for p in (work / "logs").rglob("*.log") if " ERROR " in p.read_text(errors="replace")]
    assert errors == []
