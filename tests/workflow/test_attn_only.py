"""The attention-only family (L1-L5) end to end: on the CI-sized DAG's demo model, and on a
hand-built attention-only model given as a legacy TransformerLens directory (config.json +
model_final.pth, the format of attn-only-2l) whose planted answers the scorecards must equal."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from scipy.special import softmax

from posmech.models import handbuilt as hb
from posmech.models.loading import read_manifest
from posmech.store.tables import SCORECARD_COLUMNS, read_table
from tests.workflow.conftest import REPO, snakemake
from tests.tolerances import FLOAT32_FORWARD_ABS

RULES = {"random_token_patterns": {"L1", "L4", "L5"}, "input_decomposition": {"L2", "L3", "L5"},
         "bos_induction": {"L4"}}
FIGURES = ["random_token_patterns", "decomposition_previous", "position_only_previous",
           "decomposition_look_back_two", "bos_induction"]


def _card(d, rule):
    card = read_table(d / f"scorecard/{rule}.csv")
    return card, dict(zip(card["quantity"], card["value"]))


def test_ci_run_has_every_l_output(ci_run):
    d = ci_run / "results/demo"
    for rule, claims in RULES.items():
        card, _ = _card(d, rule)
        assert list(card.columns) == SCORECARD_COLUMNS and set(card["claim"]) == claims
        table = read_table(d / f"attn_only/{rule}.csv")
        assert table["claim"].str.match(r"^L\d(,L\d)*$").all() and (table["model"] == "demo").all()
    for f in FIGURES:
        assert (d / f"attn_only/{f}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    heads = read_table(d / "attn_only/head_roles.csv")
    assert list(heads["role"]) == ["previous", "look_back_two", "induction"]
    patterns = read_table(d / "attn_only/random_token_patterns.csv")
    sums = patterns.groupby(["head_name", "query"])["attention"].sum()
    np.testing.assert_allclose(sums.to_numpy(), 1.0, atol=1e-5)  # every mean row is a distribution
    assert patterns["query"].max() == 12 and patterns.attrs["attn_only_config"]["n_sequences"] == 40
    html = (ci_run / "results/report/index.html").read_text()
    assert "L4 — induction needs BOS" in html and "random_token_patterns.png" in html
    sc = read_table(ci_run / "results/report/scorecard.csv")
    assert {"L1", "L2", "L3", "L4", "L5"} <= set(sc.loc[sc["model"] == "demo", "claim"])


def _spec():
    """32 positions: the CI config's other sections (e.g. contextual positions 24, 30) fit it."""
    n = 32
    S_prev = hb.offset_scores(n, {1: 60.0}, self_first=60.0)
    S_prev[0, 0] = 60.0
    return hb.AttnOnlySpec(n_ctx=n, scores_pos={(0, 0): S_prev, (0, 1): hb.offset_scores(n, {2: 5.0, 1: 4.0, 3: 3.0})},
                           copy_head=0, induction=(0, 6.0, 4.0, 12.0))


def _config(tmp_path, source, **attn):
    cfg = yaml.safe_load((REPO / "config/ci.yaml").read_text())
    cfg["models"] = {"hand": {"source": str(source), "device": "cpu", "dtype": "float32",
                              "processing": "compatibility", "prepend_bos": True}}
    cfg["attn_only"].update({"models": ["hand"], "induction_score": {"n_sequences": 8, "half_length": 6}, **attn})
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_legacy_attention_only_model_gives_the_planted_answers(tmp_path):
    """fetch_model converts the .pth checkpoint; the L rules find the planted roles and report
    the analytic values (the look-back-two head's position-only softmax, the exact previous-token
    head's position-0 exception, the BOS effect of the planted induction circuit)."""
    spec = _spec()
    src = hb.save_attn_only_dir(spec, tmp_path / "legacy", weights="pth")
    work = tmp_path / "run"
    work.mkdir()
    targets = [f"results/hand/scorecard/{r}.csv" for r in RULES]
    proc = snakemake(work, *targets, configfile=_config(tmp_path, src), timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    man = json.loads((work / "resources/models/hand/manifest.json").read_text())
    # the converted checkpoint lives in the model's own folder; hf_dir is relative to the manifest
    assert man["kind"] == "local" and man["hf_dir"] == "hf"
    assert read_manifest(work / "resources/models/hand/manifest.json")["hf_dir"] == str(
        (work / "resources/models/hand/hf").resolve())
    d = work / "results/hand"
    _, roles = _card(d, "random_token_patterns")
    assert json.loads(roles["previous_token_head"]) == ["L0H0"]
    assert json.loads(roles["look_back_two_head"]) == ["L0H1"]
    assert json.loads(roles["induction_head"]) == ["L1H0"]
    _, dec = _card(d, "input_decomposition")
    lb2 = softmax(spec.scores_pos[(0, 1)][8, :9])
    for name, off in (("offset2", 2), ("offset1", 1), ("offset3", 3), ("offset4", 4), ("self", 0)):
        assert float(dec[f"posonly_pattern_{name}"]) == pytest.approx(lb2[8 - off], abs=FLOAT32_FORWARD_ABS)
    assert float(dec["posonly_score_offset2"]) == pytest.approx(5.0, abs=1e-4)
    assert float(dec["posonly_row1_self"]) == pytest.approx(1.0, abs=FLOAT32_FORWARD_ABS)  # the planted L3 exception
    assert float(dec["posonly_min_prev_q2plus"]) == pytest.approx(1.0, abs=FLOAT32_FORWARD_ABS)
    _, ind = _card(d, "bos_induction")
    assert float(ind["p_b_with_bos"]) > 10 * float(ind["p_b_without_bos"])
    # the scorecard judges the published attn-only-2l values as other model to this model
    assert "L0H0" in read_table(d / "attn_only/head_roles.csv")["head_name"].tolist()


def test_sequence_longer_than_a_trained_models_context_fails_before_any_job(tmp_path):
    cfg = yaml.safe_load((REPO / "config/ci.yaml").read_text())
    cfg["attn_only"]["n_tokens"] = 40  # demo n_ctx is 32
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = snakemake(tmp_path, "-n", configfile=path, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "attn_only.n_tokens" in out and "context of 32 tokens (from models.demo.train)" in out
