"""W_pos group averaging (P2–P4) and repeat-prompt probabilities on hand-built models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from posmech.analyses.attention import mean_prev_token_mass
from posmech.analyses.posembed import (
    averaged_W_pos,
    group_average,
    head_pattern,
    max_unchanged_k,
    next_token_loss,
    pattern_similarity,
    posembed_averaging,
)
from posmech.analyses.readout import continuation_probability, target_probabilities
from posmech.data.prompts import Prompt, load_prompts, prompt_token_ids, variant_token_ids
from posmech.core.errors import PosmechError
from posmech.models import handbuilt as hb
from posmech.models.loading import load_bridge

from tests.tolerances import FLOAT32_FORWARD_ABS, float32_logit_tol

REPO = Path(__file__).resolve().parents[2]
N = 12


@pytest.fixture(scope="module")
def bridge(tmp_path_factory):
    """Positional model (residual = W_pos at every layer) with an exact previous-token head
    L0H1 and a random unembedding, so logits depend on the position."""
    spec = hb.positional_spec(n_ctx=N, n_layer=2, n_head=2, scores={(0, 1): hb.previous_token_scores(N)})
    spec.W_U = np.random.default_rng(0).normal(size=(spec.d_model, spec.d_vocab))
    path = hb.save_model_dir(spec, tmp_path_factory.mktemp("models") / "pos_unembed")
    return load_bridge({"name": "pos", "hf_dir": str(path)}, device="cpu")


def _state(bridge):
    return {k: v.detach().clone() for k, v in bridge.state_dict().items()}


def _assert_same_state(bridge, before):
    after = bridge.state_dict()
    assert before.keys() == after.keys()
    for k in before:
        assert torch.equal(before[k], after[k]), k


def _doc(length=N, seed=0):
    return np.concatenate([[0], np.random.default_rng(seed).integers(1, 40, size=length - 1)])


@pytest.mark.float32
def test_group_average_numpy_and_torch():
    x = np.arange(14.0).reshape(7, 2)
    expect = np.array([[2, 3]] * 3 + [[8, 9]] * 3 + [[12, 13]], dtype=float)
    np.testing.assert_array_equal(group_average(x, 3), expect)
    np.testing.assert_array_equal(group_average(torch.as_tensor(x), 3).numpy(), expect)
    np.testing.assert_array_equal(group_average(x, 100), np.broadcast_to(x.mean(0), x.shape))
    r = torch.randn(2, 7, 3, generator=torch.Generator().manual_seed(0))
    assert torch.equal(group_average(r, 1, dim=1), r)
    torch.testing.assert_close(group_average(r, 3, dim=1)[1], group_average(r[1], 3))
    # float32 means of order-one values, summed in another order: absolute (a mean near 0 has no relative precision)
    np.testing.assert_allclose(group_average(r.numpy(), 3, dim=1), group_average(r, 3, dim=1).numpy(), rtol=0,
                               atol=FLOAT32_FORWARD_ABS)
    for bad in (0, -2, 2.5, True):
        with pytest.raises(PosmechError, match="positive integer"):
            group_average(x, bad)


def test_k1_leaves_loss_and_logits_bitwise_unchanged(bridge):
    x = torch.as_tensor(_doc())[None]
    before = _state(bridge)
    with torch.inference_mode():
        intact = bridge(x)
        loss = next_token_loss(bridge, [_doc(), _doc(seed=1)])
        with averaged_W_pos(bridge, 1):
            assert torch.equal(bridge(x), intact)
            assert next_token_loss(bridge, [_doc(), _doc(seed=1)]) == loss
    _assert_same_state(bridge, before)


@pytest.mark.float32
def test_averaging_changes_the_model_inside_and_restores_it_bitwise(bridge):
    x = torch.as_tensor(_doc())[None]
    before = _state(bridge)
    w_pos = bridge.W_pos.detach().clone()
    with torch.inference_mode():
        intact = bridge(x)
        with averaged_W_pos(bridge, N):  # one group: every position looks the same
            torch.testing.assert_close(bridge.W_pos, w_pos.mean(0, keepdim=True).expand_as(w_pos))
            flat = bridge(x)
            pat = head_pattern(bridge, _doc(), 0, 1)
        assert torch.equal(bridge(x), intact)
    assert not torch.allclose(flat, intact)
    torch.testing.assert_close(flat[0], flat[0, :1].expand_as(flat[0]))  # logits equal at every position
    np.testing.assert_allclose(pat[5, :6], 1 / 6, rtol=1e-5)  # the previous-token head turns uniform
    _assert_same_state(bridge, before)
    with pytest.raises(RuntimeError, match="boom"), averaged_W_pos(bridge, 4):
        raise RuntimeError("boom")
    _assert_same_state(bridge, before)


@pytest.mark.float32
def test_previous_token_head_sees_groups_of_k(bridge):
    # k = 2: positions (2g, 2g+1) share an embedding, so query 2g+1 cannot tell keys 2g and 2g+1 apart
    with averaged_W_pos(bridge, 2):
        pat = head_pattern(bridge, _doc(), 0, 1)
    assert mean_prev_token_mass(head_pattern(bridge, _doc(), 0, 1)) == pytest.approx(1.0, abs=FLOAT32_FORWARD_ABS)
    assert mean_prev_token_mass(pat) < 0.9


def test_posembed_averaging_table_and_model_unchanged(bridge):
    before = _state(bridge)
    prompt = Prompt("p", "P3", "!\"#$%&", {"a": ["'", "("], "b": [")"]})
    df = posembed_averaging(bridge, [1, 2, N], [_doc(), _doc(seed=1)], [prompt], prepend_bos=True)
    _assert_same_state(bridge, before)
    loss = df[df["quantity"] == "loss"].set_index("k")["value"]
    total, count = next_token_loss(bridge, [_doc(), _doc(seed=1)])
    assert loss[1] == total / count and count == 2 * (N - 1)
    assert loss[N] != loss[1]
    probs = df[df["quantity"] == "probability"]
    assert set(probs["target"]) == {"a", "b"} and len(probs) == 6
    assert ((probs["value"] > 0) & (probs["value"] < 1)).all()


@pytest.mark.float32
def test_continuation_probability_single_and_multi_token(bridge):
    ids = np.array([0, 2, 3, 4])
    with torch.inference_mode():
        lg = [bridge(torch.as_tensor(np.append(ids, s).astype(int))[None])[0, -1].double() for s in ([], [7], [7, 8])]
    p0, p1, p2 = (torch.softmax(g, -1) for g in lg)
    # logits made from the read positions only (another matmul) vs full passes: float32 rounding of logits up to ~14
    rel = float32_logit_tol(torch.stack(lg))
    assert continuation_probability(bridge, ids, [[5], [6]]) == pytest.approx(float(p0[5] + p0[6]), rel=rel)
    assert continuation_probability(bridge, ids, [[7, 9]]) == pytest.approx(float(p0[7] * p1[9]), rel=rel)
    probs, top, top_p = target_probabilities(bridge, ids, {"a": [[5], [7, 9]], "b": [[7, 8, 3]], "c": [[6]]})
    assert probs["a"] == pytest.approx(float(p0[5] + p0[7] * p1[9]), rel=rel)
    assert probs["b"] == pytest.approx(float(p0[7] * p1[8] * p2[3]), rel=rel)
    assert probs["c"] == pytest.approx(float(p0[6]), rel=rel)
    assert top == int(p0.argmax()) and top_p == pytest.approx(float(p0.max()), rel=rel)


def test_variant_sets_are_deduplicated_and_prefix_free():
    tok = hb.char_tokenizer(40)
    seqs = variant_token_ids(tok, ["!", "!!", "\"", "\"", "#$"])
    assert seqs == [tok("!").input_ids, tok("\"").input_ids, tok("#$").input_ids]
    ids, truncated = prompt_token_ids(tok, "!\"#$%&'", prepend_bos=True, max_len=4)
    assert truncated and ids.tolist() == [0, *tok("%&'").input_ids]


def test_shipped_prompt_file():
    path = REPO / "resources" / "prompts" / "repeat_string.yaml"
    prompts = {p.id: p for p in load_prompts(path)}
    assert {"apple_orange", "orange_apple", "ninja_turtle_pirate"} <= set(prompts)
    ao = prompts["apple_orange"]
    assert ao.text.endswith('Request: Please repeat the following string exactly: "apple orange"\nReply: "')
    assert ao.text.count("Request:") == 14  # hello, gorapopefm, ten more, 1pdjpm3efe4, the prompt
    assert " apple" in ao.targets["apple"] and "apple" in ao.targets["apple"]
    assert prompts["ninja_turtle_pirate"].text.endswith('Reply: "ninja')
    assert [p.id for p in load_prompts(path, ["orange_apple"])] == ["orange_apple"]
    with pytest.raises(PosmechError, match="no prompt"):
        load_prompts(path, ["nope"])


def test_max_unchanged_k():
    rows = []
    for k, loss, pa in [(1, 3.0, 0.99), (5, 3.01, 0.99), (10, 3.02, 0.985), (20, 3.3, 0.98), (50, 3.05, 0.99)]:
        rows += [{"k": k, "quantity": "loss", "prompt": "", "target": "", "value": loss},
                 {"k": k, "quantity": "probability", "prompt": "ao", "target": "apple", "value": pa}]
    df = pd.DataFrame(rows)
    assert max_unchanged_k(df, 0.05, 0.02) == 10  # k=20 breaks the loss tolerance; later k do not count
    assert max_unchanged_k(df, 0.5, 0.005) == 5


def test_max_unchanged_k_counts_a_large_loss_drop_as_a_change():
    """|Δloss| <= tolerance, two-sided: averaging that lowers a confidently wrong model's loss by
    41 nats (57.4 -> 16.4, as the self-check's position-readout model does at k = 5) changes the
    output; a drop within the tolerance does not."""
    rows = []
    for k, loss in [(1, 57.4), (2, 57.38), (5, 16.4), (10, 57.4)]:
        rows += [{"k": k, "quantity": "loss", "prompt": "", "target": "", "value": loss},
                 {"k": k, "quantity": "probability", "prompt": "ao", "target": "apple", "value": 0.5}]
    df = pd.DataFrame(rows)
    assert max_unchanged_k(df, 0.05, 0.02) == 2  # k = 5's drop of 41 nats is a change: k = 10 does not count
    assert max_unchanged_k(df, 0.01, 0.02) == 1  # k = 2's drop of 0.02 nats exceeds a 0.01 tolerance
    assert max_unchanged_k(df, 50.0, 0.02) == 10


def test_similarity_numbers():
    a = np.eye(4, k=-1)
    a[0, 0] = 1
    s = pattern_similarity(a, a)
    assert s["cosine_similarity"] == pytest.approx(1.0) and s["mean_abs_diff"] == 0 and s["mean_row_tv"] == 0
    b = np.tril(np.ones((4, 4))) / np.arange(1, 5)[:, None]
    assert pattern_similarity(a, b)["mean_row_tv"] == pytest.approx(np.mean([0, 0.5, 2 / 3, 0.75]))


def test_p_scorecard_rows_read_the_analysis():
    """P2–P4 rows come from the library (scripts only write them), with known values."""
    from posmech.analyses.posembed import attention_scorecard, averaging_scorecard

    df = pd.DataFrame({"quantity": ["loss", "probability", "probability", "probability", "probability"],
                       "k": [1, 1, 10, 1, 10], "prompt": ["", "a", "a", "b", "b"],
                       "target": ["", " x", " x", " y", " z"], "value": [3.0, 0.9, 0.4, 0.8, 0.7]})
    rows = averaging_scorecard(df, 5, {"a": " x", "b": " y"}, 0.01, 0.02, "m", "f.png", "t.csv")
    got = {r["quantity"]: r["value"] for r in rows}
    # prompt b's k = 10 row is for another target: no p_ y_k10 row
    assert got == {"max_unchanged_k": 5, "p_ x_intact": 0.9, "p_ x_k10": 0.4, "p_ y_intact": 0.8,
                   "p_repeat_min_k10": 0.4}
    assert rows[0]["claim"] == "P2" and "within 0.01 nats" in rows[0]["detail"] and {r["model"] for r in rows} == {"m"}
    # a grid without the post's k = 10: the k10 rows have no value and say why (the scorecard's reason)
    no10 = averaging_scorecard(df.assign(k=df["k"].replace(10, 8)), 1, {"a": " x"}, 0.01, 0.02, "m", "f.png", "t.csv")
    (k10,) = [r for r in no10 if r["quantity"] == "p_ x_k10"]
    assert k10["value"] is None and k10["claim"] == "P3"
    assert k10["detail"] == "prompt a: the post's group size k = 10 is not in this run's grid k = 1, 8 (posembed_averaging.ks)"
    att = pd.DataFrame({"layer": [1, 0], "head": [2, 0], "head_name": ["L1H2", "L0H0"], "cosine_similarity": [0.75, 0.1],
                        "prev_token_mass_intact": [0.9, 0.2], "prev_token_mass_averaged": [0.3, 0.2]})
    (p4,) = attention_scorecard(att, 10, 64, 32, "m", "f.png")
    assert (p4["claim"], p4["quantity"], p4["value"]) == ("P4", "pattern_similarity_k10", 0.75)
    assert p4["detail"] == "L1H2, cosine of the 32x32 window at 64; previous-token mass 0.900 -> 0.300"


def test_p_tables_put_claim_model_and_role_in_front():
    from posmech.analyses.posembed import attention_table, averaging_table

    df = pd.DataFrame({"quantity": ["loss", "probability", "loss"], "k": [1, 1, 4], "value": [3.0, 0.9, 3.1]})
    averaging_table(df, "m")
    assert list(df.columns[:3]) == ["claim", "model", "quantity"]
    assert df["claim"].tolist() == ["P2", "P2,P3", "P2"]  # the prompt probabilities are read by both claims
    heads = pd.DataFrame({"head_name": ["L1H0", "L0H1", "L0H0"], "cosine_similarity": [0.9, 0.8, 0.7]})
    attention_table(heads, {"sharp": ["L1H0"], "early": ["L0H1", "L0H0"]}, "m")
    assert list(heads.columns[:4]) == ["claim", "model", "role", "head_name"]
    assert heads["role"].tolist() == ["sharp", "early", "early"] and (heads["claim"] == "P4").all()


def test_posembed_settings_resolve_the_corpus():
    from posmech.settings import defaults

    config = {"corpora": {"web": {}, "bible": {}}}
    assert defaults("posembed_averaging", config).corpus == "web"
    assert defaults("posembed_attention", config, corpus="bible").corpus == "bible"
