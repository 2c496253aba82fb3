"""The contextual neurons (C1–C3) on models whose positions are not in the residual stream:
random-init tiny Llama (rotary, SwiGLU, RMSNorm), BLOOM (ALiBi, LayerNorm) and GPT-NeoX
(partial rotary, parallel block: the neurons are layer 1's) models (tests/tiny_archs.py) read
by posmech.analyses.neurons.RelativeLayer0. The residual the
neurons' MLP reads and their pre-activation (Llama: the gate's), rebuilt in float64 from the
one-token queries, keys and residuals and the checkpoint's value/MLP weights, equal the
Hugging Face forward; and the neurons family's library calls (rule scripts
extended_token_embeddings, contextual_neurons, bag_of_tokens_fit) run on them."""

from __future__ import annotations

import numpy as np
import pytest

from posmech.analyses import contextual as cx
from posmech.analyses import neurons as nr
from posmech.models import lens
from posmech.models.handbuilt import char_tokenizer
from tests import tiny_archs as ta
from tests.models.test_mlp_layouts import _configs, _hooked_forward
from tests.tolerances import FLOAT32_FORWARD_REL, FLOAT64_ABS

T = 20
SCHEMES = {"llama": "rotary", "bloom": "alibi", "neox": "rotary", "mpt": "alibi"}
LAYOUT = {"llama": "llama", "bloom": "bloom", "neox": "gpt_neox", "mpt": "mpt"}  # tests/models/test_mlp_layouts.py's names


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    from posmech.models.lens import hf_dir_reader
    from posmech.models.loading import WeightView

    root = tmp_path_factory.mktemp("neurons_schemes")
    out = {}
    for name in SCHEMES:
        d = getattr(ta, name)(root / name)
        hf = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager").eval()
        m = lens.from_hf_dir(str(d), char_tokenizer(ta.V), "raw", "cpu", "float32")
        get, cfg = hf_dir_reader(d, framework="numpy")
        b0, b1 = nr.blocks_from_hf(WeightView(get, get.names, cfg), name)
        ov = nr.ov_from_blocks(b0, b1, name)
        out[name] = (hf, m, b0, ov, nr.relative_layer0(m, b0.ln1, name, ta.N_CTX))
    return out


def _close(got, want):
    np.testing.assert_allclose(got, want, rtol=0, atol=FLOAT32_FORWARD_REL * max(1.0, np.abs(want).max()))


@pytest.mark.float32
@pytest.mark.parametrize("name", list(SCHEMES))
def test_residual_and_pre_activation_are_the_hugging_face_forward(models, name):
    hf_model, _, b0, ov, w = models[name]
    assert w.rel.scheme == SCHEMES[name] and ov.gated is (name == "llama") and ov.ln2_rms is (name == "llama")
    block_path, ins, down, _, parallel = _configs()[LAYOUT[name]][1:6]
    assert ov.layer == (1 if parallel else 0)
    ids = np.random.default_rng(1).integers(1, ta.V, T)
    hf = _hooked_forward(hf_model, block_path, ins, down, ids)
    _close(w.resid(ids, np.arange(T)), hf["resid"])  # no position in the residual: e(x) per token
    r = nr.layer0_residual(w, ov, ids)  # scores from the one-token q/k factors, not HF's patterns
    if parallel:  # layer 1's MLP reads its input, layer 0's output
        hf = _hooked_forward(hf_model, block_path[: -len(".0")] + ".1", ins, down, ids)
        _close(r, hf["resid"])
    else:
        _close(r, hf["resid"] + b0.attention(hf["resid"], hf["patterns"]))
    _close(nr.hook_pre(w, ov, ids), hf["pre"])
    # the position-independent parts: content value + constant value = the exact value of the token
    st = nr.Setup(w, ov, [0], np.ones(4), 1.0, 1.0, np.zeros((4, T, w.rel.width)), np.zeros((4, T, w.rel.width)),
                  w.attn_scale, 1)
    np.testing.assert_allclose(st.content_values(0, ids) + st.positional_values(0, T), ov.ov(0, w.ln(ids)),
                               atol=FLOAT64_ABS)


@pytest.mark.float32
@pytest.mark.parametrize("name", list(SCHEMES))
def test_the_neurons_family_runs(models, name, tmp_path):
    """What the three scripts call, in order, on layer0.h5 of the model (heads pinned)."""
    from posmech.data.tokens import TokenSet

    _, m, _, ov, w = models[name]
    rng = np.random.default_rng(2)
    docs = [rng.integers(1, ta.V, size=T + 4) for _ in range(3)]
    toks = TokenSet(np.concatenate(docs).astype(np.int32), np.arange(4) * (T + 4), {}, [f"d{i}" for i in range(3)])
    texts = [{"corpus": "c", "doc_index": i, "title": f"d{i}", "ids": d} for i, d in enumerate(docs)]
    cx.build_decomposition(w.rel, 7, "x", toks, texts, T - 2, None, tmp_path / "layer0.h5", {"model": name})
    dec = cx.read_decomposition(tmp_path / "layer0.h5")
    heads = nr.select_heads(None, ["L0H0", "L0H2"], (), w.n_heads)
    cal = nr.calibration_index(dec, heads, None, 2)
    st, ln2 = nr.build_setup(dec, w, ov, heads, cal, 2, None)
    keys = nr.content_keys(dec)
    info = nr.write_extended(st, keys, tmp_path / "ext.h5", {"model": name})
    assert np.isfinite(info["max_abs"]) and info["max_abs"] > 0
    c1 = nr.extended_scorecard(st, ln2, w.d_vocab, ov.d_model, ov.d_mlp, heads, 2, "d0", name, "ext.h5")
    lo, hi = c1[1]["value"]
    assert 0 < lo <= hi
    st2 = nr.setup_from_artifact(tmp_path / "ext.h5", dec, w, ov)
    assert st2.heads == heads and st2.s2 == st.s2
    real = [nr.hook_pre(w, ov, ids) for ids in dec.token_ids]
    context = [nr.approximate(st2, keys, ids)["context"] for ids in dec.token_ids]
    ranking = nr.neuron_ranking(real, context, name, 2)
    assert np.isfinite(nr.best_explained_row(ranking, name, "r")["value"])
    neurons = [int(j) for j in ranking["neuron"][:3]]
    df, _ = nr.fit_table(m, st2, keys, dec, neurons, 2, "exact", name)
    for ids in dec.token_ids:  # the engine's hook_pre is the float64 one C2 ranks
        _close(nr.real_pre_activations(m, ids, ov.hook), nr.hook_pre(w, ov, ids))
    c3 = nr.fit_scorecard(df, 2, name, "fit.csv")
    assert -1 <= c3[0]["value"] <= 1
