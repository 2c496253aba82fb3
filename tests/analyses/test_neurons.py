"""Contextual neurons (C1–C3) on a hand-built model whose answer is known.

The model (layout of ``tests/analyses/test_contextual.py``: one-hot positions and tokens,
constant layer-0 LayerNorm scale σ) has a contextual head 2 with a planted positional score
``−λ(n − i)`` and planted content scores ``C[x]`` (equal for tokens 1, 2, 3), whose OV circuit
writes a known zero-mean vector ``u_x`` per token (``(b/σ)·u_x`` through the LayerNorm), a
"self" head 3 attending to the current token only and writing ``v_x``, and an MLP whose
neuron ``J`` reads a known direction ``w``.  Analytically:
``E'(x) = exp C[x] / Z̄ · (b/σ) u_x``, ``TC_J(x) = E'(x)·w / s₂``, and along a text
``r̂(n) = e(x_n) + p_n + (b/σ) v_{x_n} + (1/Z̄) Σ_i softmax_i(−λ(n − i)) exp C[x_i] (b/σ) u_{x_i}``.
On a text of tokens 1–3 only, every Z(n) is exp C[1]: the approximation is exact."""

from __future__ import annotations

import math
import os

import h5py
import numpy as np
import pandas as pd
import pytest
import torch

from posmech.analyses import contextual as cx
from posmech.analyses import neurons as nr
from posmech.core.errors import PosmechError
from posmech.models import handbuilt as hb

from .test_contextual import B, N_CTX, V, offsets, plant, tokenset
from tests.tolerances import FLOAT32_FORWARD_ABS, FLOAT32_FORWARD_REL, FLOAT64_ABS

LAM = 0.1
C = np.array([1.0, 0.4, 0.4, 0.4, -0.8, 0.3, -0.2, 1.5])
OUT = slice(120, 136)  # residual dimensions the OV circuits write to (unused by embeddings)
J = 7


def zero_mean(v):
    return v - v.mean(axis=-1, keepdims=True)


RNG = np.random.default_rng(3)
U_VEC = np.zeros((V, 256))
U_VEC[:, OUT] = RNG.normal(0, 0.3, (V, 16))
U_VEC = zero_mean(U_VEC)
V_VEC = np.zeros((V, 256))
V_VEC[:, 140:150] = RNG.normal(0, 0.2, (V, 10))
V_VEC = zero_mean(V_VEC)
DIRECTION = np.zeros(256)
DIRECTION[OUT] = RNG.normal(0, 1, 16)
DIRECTION[140:150] = RNG.normal(0, 1, 10)
DIRECTION[60:64] = 0.5  # reads the token embeddings too


def ov_head(vecs, dh=64):
    """``W_V, W_O`` writing ``vecs[x]`` for token ``x`` (token dims ``N_CTX + 1 + x``)."""
    d = vecs.shape[1]
    W_V, W_O = np.zeros((d, dh)), np.zeros((dh, d))
    W_V[N_CTX + 1 + np.arange(V), np.arange(V)] = 1.0
    W_O[:V] = vecs
    return W_V, W_O


@pytest.fixture(scope="module")
def model():
    spec, sigma = plant({0: {"D": 10.0}, 2: {"P": -LAM * offsets(N_CTX), "C": C}, 3: {"P": 30.0 * np.eye(N_CTX)}})
    for h, vecs in ((2, U_VEC), (3, V_VEC)):
        W_V, W_O = ov_head(vecs)
        spec.heads[(0, h)].update({"W_V": W_V, "W_O": W_O})
    W_in = np.zeros((256, 1024))
    W_in[:, J] = DIRECTION
    W_in[:, 3] = RNG.normal(0, 1, 256)
    spec.mlps[0] = {"W_in": W_in}
    m = hb.to_hf(spec)
    return m, cx.weights_from_hf(m), nr.ov_from_hf(m), sigma


def real_pre(m, ids):
    store = {}
    hook = m.transformer.h[0].mlp.c_fc.register_forward_hook(lambda mod, i, o: store.setdefault("pre", o))
    with torch.no_grad():
        m(torch.as_tensor(ids)[None])
    hook.remove()
    return store["pre"][0].double().numpy()


def layer0(tmp_path, w, texts, destination=2):
    path = tmp_path / "layer0.h5"
    cx.build_decomposition(w, destination, "x", tokenset(texts),
                           [{"corpus": "c", "doc_index": j, "title": f"t{j}", "ids": t} for j, t in enumerate(texts)],
                           N_CTX - 2, None, path, {"model": "planted"})
    return cx.read_decomposition(path)


def stored_keys(dec):
    return lambda ids: dec.content_key(ids)


@pytest.mark.float32
def test_numpy_layer0_is_the_real_hook_pre(model):
    m, w, ov, _ = model
    ids = RNG.integers(0, V, N_CTX)
    np.testing.assert_allclose(nr.hook_pre(w, ov, ids), real_pre(m, ids), atol=2e-5)


@pytest.mark.float32
def test_exact_when_the_denominators_are_constant(model, tmp_path):
    m, w, ov, sigma = model
    texts = [RNG.integers(1, 4, N_CTX) for _ in range(3)]  # tokens 1-3: every c = exp 0.4
    dec = layer0(tmp_path, w, texts)
    np.testing.assert_allclose(dec.log_z_linear[:, 2], 0.4, atol=1e-6)
    st, _ = nr.build_setup(dec, w, ov, [2], 0, 1, None)
    np.testing.assert_allclose(st.z_bar[2], math.exp(0.4), rtol=1e-6)
    for t in texts:
        got = nr.approximate(st, stored_keys(dec), t, "exact")
        np.testing.assert_allclose(got["resid"], nr.layer0_residual(w, ov, t), atol=1e-5)
        np.testing.assert_allclose(got["pre"], real_pre(m, t), atol=1e-4)


@pytest.mark.float32
@pytest.mark.parametrize("layout", ["rms", "parallel"])
def test_exact_on_rms_and_parallel_layouts(model, tmp_path, layout):
    """The same exactness with an RMSNorm in front of the MLP (not centred) and with a parallel
    layer 0 (the neurons are layer 1's, which also reads layer 0's MLP output, a function of
    the residual before layer 0: entered exactly); the C rules' hook follows the layer."""
    import dataclasses

    m, w, ov, _ = model
    if layout == "rms":
        # an output bias with a mean: LayerNorm would subtract it, RMSNorm does not
        var = dataclasses.replace(ov, ln2_rms=True, ln2_b=np.zeros_like(ov.ln2_b), b_O=ov.b_O + 0.5)
    else:
        W = np.random.default_rng(5).normal(0, 0.1, (256, 256))
        var = dataclasses.replace(ov, layer=1, embed_mlp=lambda r: np.tanh(r @ W))
    texts = [RNG.integers(1, 4, N_CTX) for _ in range(3)]
    dec = layer0(tmp_path, w, texts)
    st, _ = nr.build_setup(dec, w, var, [2], 0, 1, None)
    for t in texts:
        got = nr.approximate(st, stored_keys(dec), t, "exact")
        np.testing.assert_allclose(got["resid"], nr.layer0_residual(w, var, t), atol=1e-5)
        np.testing.assert_allclose(got["pre"], nr.hook_pre(w, var, t), atol=1e-4)
        if layout == "rms":  # RMSNorm by its formula, not centred
            r = nr.layer0_residual(w, var, t)
            x = r / np.sqrt(np.square(r).mean(axis=-1, keepdims=True) + var.ln2_eps) * var.ln2_w
            np.testing.assert_allclose(got["pre"], x @ var.W_in + var.b_in, atol=1e-4)
        # ... and it is not the plain layout's: the variant changed what the neurons read
        assert np.abs(got["pre"][:, [J, 3]] - nr.hook_pre(w, ov, t)[:, [J, 3]]).max() > 1.0
    assert var.hook == ("blocks.1.mlp.hook_pre" if layout == "parallel" else "blocks.0.mlp.hook_pre")


@pytest.mark.float32
def test_extended_embeddings_contributions_and_approximation_are_analytic(model, tmp_path):
    m, w, ov, sigma = model
    texts = [RNG.integers(0, V, N_CTX) for _ in range(3)]
    dec = layer0(tmp_path, w, texts)
    st, ln2 = nr.build_setup(dec, w, ov, [2], 1, 10, None)
    # Z̄ is the median of the stored denominators of the calibration text over n >= 10
    z = np.array([np.sum(cx.softmax(-LAM * (n - np.arange(n + 1))) * np.exp(C[np.r_[texts[1][:n], 2]]))
                  for n in range(10, N_CTX - 1)])
    assert st.z_bar[2] == pytest.approx(np.median(z), rel=1e-6)
    # s2 is the median of the real ln2 scale (hooked in the HF model) over the stored texts, positions >= 1
    scales = []
    for t in dec.token_ids:
        store = {}
        hook = m.transformer.h[0].ln_2.register_forward_hook(lambda mod, i, o: store.setdefault("r", i[0]))
        with torch.no_grad():
            m(torch.as_tensor(t)[None])
        hook.remove()
        r = store["r"][0].double().numpy()
        scales.append(np.sqrt(r.var(axis=-1) + 1e-12)[1:])
    assert st.s2 == pytest.approx(np.median(np.concatenate(scales)), rel=FLOAT32_FORWARD_REL)
    assert ln2["n_tokens"] == 3 * (N_CTX - 2)
    E = nr.extended_embeddings(st, stored_keys(dec), np.arange(V))
    expected = (np.exp(C) / st.z_bar[2])[:, None] * (B / sigma) * U_VEC
    np.testing.assert_allclose(E, expected, atol=1e-6)
    tc = nr.token_contributions(E, st.win())
    np.testing.assert_allclose(tc[:, J], expected @ DIRECTION / st.s2, atol=1e-5)
    # the approximation along a text, linear LayerNorm 2
    t = texts[2]
    got = nr.approximate(st, stored_keys(dec), t, "linear")
    n = np.arange(N_CTX)
    weight = np.tril(np.exp(-LAM * np.subtract.outer(n, n)))
    weight = np.where(np.tril(np.ones((N_CTX, N_CTX), bool)), weight, 0)
    weight = weight / weight.sum(axis=1, keepdims=True) * np.exp(C[t])[None] / st.z_bar[2]
    resid = w.resid(t, n) + (B / sigma) * V_VEC[t] + weight @ ((B / sigma) * U_VEC[t])
    np.testing.assert_allclose(got["resid"], resid, atol=1e-5)
    np.testing.assert_allclose(got["pre"][:, J], zero_mean(resid) @ DIRECTION / st.s2, atol=1e-4)
    # the contextual term is the decaying average of the token contributions
    np.testing.assert_allclose(got["context"][:, J], (weight * st.z_bar[2] / np.exp(C[t])[None]) @ tc[t, J],
                               atol=1e-4)


def test_artifact_stores_what_the_library_computes(model, tmp_path):
    m, w, ov, _ = model
    texts = [RNG.integers(0, V, N_CTX) for _ in range(2)]
    dec = layer0(tmp_path, w, texts)
    st, _ = nr.build_setup(dec, w, ov, [2], 0, 1, 20)
    ids = np.array([5, 0, 5, 7])
    np.testing.assert_array_equal(nr.content_keys(dec)(ids), dec.content_key(ids))
    path = tmp_path / "extended.h5"
    info = nr.write_extended(st, nr.content_keys(dec), path, {"model": "planted"}, block=3)
    E = nr.extended_embeddings(st, stored_keys(dec), np.arange(V))
    tc = nr.token_contributions(E, st.win())
    got = nr.read_contributions(path, [J, 3])
    np.testing.assert_allclose(got, tc[:, [J, 3]], rtol=2e-3, atol=1e-3 * np.abs(tc).max())
    attrs = nr.read_extended_attrs(path)
    assert attrs["heads"] == ["L0H2"] and attrs["reference_position"] == 20 and not info["overflow"]


def test_a_twins_artifact_without_the_vocabulary_gives_the_same_c1_to_c3(model, tmp_path):
    """A twin's null (config twins.claims_only) writes no token's E' or TC, which no claim
    reads: the setup read back, and so C1's LN2 scale range, C2's ranking and C3's
    approximation on the same texts, equal the full artifact's exactly."""
    m, w, ov, _ = model
    texts = [RNG.integers(0, V, N_CTX) for _ in range(3)]
    dec = layer0(tmp_path, w, texts)
    st, ln2 = nr.build_setup(dec, w, ov, [2], 0, 1, 20)
    full, null = tmp_path / "full.h5", tmp_path / "null.h5"
    nr.write_extended(st, nr.content_keys(dec), full, {"model": "planted"}, block=3)
    info = nr.write_extended(st, nr.content_keys(dec), null, {"model": "planted"}, vocabulary=False)
    assert not info["overflow"]
    with h5py.File(null) as f:
        assert "contributions" not in f and "extended_embeddings" not in f
    assert nr.read_extended_attrs(null)["vocabulary"] == nr.NO_VOCABULARY
    assert nr.read_extended_attrs(full)["vocabulary"] == "every token"
    a, b = nr.setup_from_artifact(full, dec, w, ov), nr.setup_from_artifact(null, dec, w, ov)
    np.testing.assert_array_equal(a.z_bar, b.z_bar)
    assert (a.heads, a.s, a.s2, a.n_ref, a.s_a) == (b.heads, b.s, b.s2, b.n_ref, b.s_a)
    keys = nr.content_keys(dec)
    real = [nr.hook_pre(w, ov, t) for t in texts]
    got = {}
    for name, s in (("full", a), ("null", b)):
        approx = [nr.approximate(s, keys, t) for t in texts]
        got[name] = (nr.neuron_ranking(real, [x["context"] for x in approx], "m", 1),
                     [x["pre"] for x in approx])
    pd.testing.assert_frame_equal(got["full"][0], got["null"][0])  # C2
    for x, y in zip(got["full"][1], got["null"][1]):  # C3's approximation
        np.testing.assert_array_equal(x, y)
    c1 = {v: nr.extended_scorecard(st, ln2, V, 256, ov.d_mlp, [2], 1, "t", "m", "x.h5", v) for v in (True, False)}
    assert c1[True][1] == c1[False][1]  # C1's claim row, ln2_scale_range
    assert c1[False][0]["value"] == "not computed" and nr.NO_VOCABULARY in c1[False][0]["detail"]


def test_the_per_text_memo_returns_what_is_computed_once_and_notices_a_rewritten_file(model, tmp_path, monkeypatch):
    """The neurons family's analyses read the same texts: with a memo key each text's exact
    layer-0 residual and bag-of-tokens sums are computed once in a process (bitwise what the
    unmemoised call gives, read-only); a rewritten artifact is another key, recomputed."""
    m, w, ov, _ = model
    texts = [RNG.integers(0, V, N_CTX) for _ in range(2)]
    dec = layer0(tmp_path, w, texts)
    st, _ = nr.build_setup(dec, w, ov, [2], 0, 1, 20)
    path = tmp_path / "extended.h5"
    nr.write_extended(st, nr.content_keys(dec), path, {"model": "planted"}, vocabulary=False)
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    memo = nr.weights_key({"hf_dir": str(tmp_path / "hf")}, "planted", {"dtype": "float32"})
    assert memo == nr.weights_key({"hf_dir": str(tmp_path / "hf")}, "planted", {"dtype": "float32"})
    monkeypatch.setattr(nr, "_MEMO", {})
    calls = {"resid": 0, "bag": 0}
    real_resid, real_bag = nr._layer0_residual, nr._bag_of_tokens

    def count(name, f):
        def wrapped(*a):
            calls[name] += 1
            return f(*a)
        return wrapped

    monkeypatch.setattr(nr, "_layer0_residual", count("resid", real_resid))
    monkeypatch.setattr(nr, "_bag_of_tokens", count("bag", real_bag))
    plain = nr.setup_from_artifact(path, dec, w, ov)
    memoised = nr.setup_from_artifact(path, dec, w, ov, memo)
    assert plain.memo is None and memoised.memo is not None
    keys = nr.content_keys(dec)
    for t in texts:
        want_pre, want = nr.hook_pre(w, ov, t), nr.approximate(plain, keys, t, "exact")
        for _ in range(2):
            np.testing.assert_array_equal(nr.hook_pre(w, ov, t, memo), want_pre)
            for ln2 in ("exact", "linear"):
                got = nr.approximate(memoised, keys, t, ln2)
                ref = nr.approximate(plain, keys, t, ln2)
                for k in ("resid", "pre", "context"):
                    np.testing.assert_array_equal(got[k], ref[k])
        np.testing.assert_array_equal(got["resid"], want["resid"])
        assert not got["resid"].flags.writeable
    assert nr.ln2_scale_summary(w, ov, texts, memo) == nr.ln2_scale_summary(w, ov, texts)
    n_resid, n_bag = calls["resid"], calls["bag"]
    nr.hook_pre(w, ov, texts[0], memo), nr.approximate(memoised, keys, texts[0])
    assert (calls["resid"], calls["bag"]) == (n_resid, n_bag)  # from the memo
    assert sum(1 for k in nr._MEMO if k[0] == "layer0_residual") == len(texts)  # one per text
    assert sum(1 for k in nr._MEMO if k[0] == "bag_of_tokens") == len(texts)
    os.utime(path, ns=(1, 1))  # the artifact rewritten: another key
    again = nr.setup_from_artifact(path, dec, w, ov, memo)
    assert again.memo != memoised.memo
    nr.approximate(again, keys, texts[0])
    assert calls["bag"] == n_bag + 1
    # a bounded memo: past MEMO_BYTES the oldest entries go (and are recomputed when asked again)
    one = nr._MEMO[next(iter(nr._MEMO))]
    monkeypatch.setattr(nr, "MEMO_BYTES", (one[0] if isinstance(one, tuple) else one).nbytes * 3)
    nr.hook_pre(w, ov, RNG.integers(0, V, N_CTX), memo)
    assert nr._memo_bytes() <= nr.MEMO_BYTES and len(nr._MEMO) <= 3


def test_top_tokens_and_ranking():
    tc = np.array([[3.0], [-1.0], [2.0], [-5.0], [9.0]])
    counts = np.array([4, 1, 2, 3, 0])  # token 4 never occurs: excluded
    df = nr.top_tokens(tc, counts, [17], 2, 1, str, "m")
    assert df[df.side == "top"]["token_id"].tolist() == [0, 2]
    assert df[df.side == "bottom"]["token_id"].tolist() == [3, 1]
    real = [np.c_[np.arange(10.0), np.ones(10) * np.arange(10) % 2]]
    ctx = [np.c_[np.arange(10.0), np.zeros(10)]]
    rk = nr.neuron_ranking(real, ctx, "m", 0)
    assert rk["neuron"].tolist() == [0, 1] and rk["explained"][0] == pytest.approx(1.0)
    assert rk["explained"][1] == pytest.approx(0.0)


def test_fit_metrics():
    a = np.array([1.0, -2.0, 3.0, -4.0])
    m = nr.fit_metrics(a, a * 0.5)
    assert m["pearson_r"] == pytest.approx(1.0) and m["sign_agreement"] == 1.0
    assert m["fvu"] == pytest.approx(np.sum((0.5 * a) ** 2) / np.sum((a - a.mean()) ** 2))
    m = nr.fit_metrics(np.ones(4), a)  # a neuron that reads nothing that varies: r and FVU undefined
    assert np.isnan(m["pearson_r"]) and np.isnan(m["fvu"]) and m["sign_agreement"] == 0.5
    with pytest.raises(PosmechError, match="fewer than 2 positions"):
        nr.fit_metrics(a[:1], a[:1])


def test_bad_input_names_the_key(model, tmp_path):
    m, w, ov, _ = model
    with pytest.raises(PosmechError, match=r"`neurons.neurons`.*1024.*0\.\.1023"):
        nr.check_neurons([3, 1024], ov.d_mlp, "planted")
    dec = layer0(tmp_path, w, [RNG.integers(0, V, N_CTX)])
    with pytest.raises(PosmechError, match="`neurons.calibration_text`: empty"):
        nr.calibration_index(dec, [2], "", 1)
    with pytest.raises(PosmechError, match="`neurons.from_position`.*empty calibration text"):
        nr.calibration_denominators(dec, 0, 10_000)
    classes = pd.DataFrame({"head": [0, 1], "head_name": ["L0H0", "L0H1"], "head_class": ["other", "other"]})
    with pytest.raises(PosmechError, match="`neurons.head_classes`"):
        nr.select_heads(classes, None, ["contextual"], 2)
    with pytest.raises(PosmechError, match="`neurons.heads`"):
        nr.select_heads(classes, ["L1H0"], ["contextual"], 2)
    with pytest.raises(PosmechError, match="no MLP in layer 0.*`neurons.models`"):
        nr.ov_from_tl({"blocks.0.attn.W_V": np.zeros((1, 4, 2))}, {"attn_only": True, "d_model": 4}, "attn")


def test_calibration_text_is_the_typical_one(model, tmp_path):
    m, w, ov, _ = model
    # three texts whose content factors are low, middle and high: the middle one is typical
    texts = [np.full(N_CTX, 6), np.full(N_CTX, 5), np.full(N_CTX, 7)]
    dec = layer0(tmp_path, w, texts, destination=5)
    assert nr.calibration_index(dec, [2], None, 5) == 1
    assert nr.calibration_index(dec, [2], "t2", 5) == 2


def test_weights_read_from_the_files_equal_the_models(model, tmp_path):
    """The rules read layer-0 weights from the safetensors files (no model built, no torch or
    transformers imported without a tokenizer); they equal the model's own parameters."""
    import subprocess
    import sys
    from dataclasses import fields

    from posmech.models.loading import prepare_local_model

    m, w, ov, _ = model
    m.save_pretrained(tmp_path / "hf", safe_serialization=True)
    hb.char_tokenizer(V).save_pretrained(tmp_path / "hf")
    man = prepare_local_model("planted", {"source": str(tmp_path / "hf")}, tmp_path)
    w2, ov2, tok = nr.load_weights(man, "planted")
    assert tok is not None and len(tok) == len(hb.char_tokenizer(V))
    for mine, theirs in ((w, w2), (ov, ov2)):
        for f in fields(mine):
            np.testing.assert_array_equal(getattr(theirs, f.name), getattr(mine, f.name), err_msg=f.name)
    code = f"""
import sys
from posmech.analyses import neurons as nr
from posmech.models.loading import read_manifest
w, ov, tok = nr.load_weights(read_manifest({str(tmp_path)!r}), "planted", tokenizer=False)
print(tok, "torch" in sys.modules, "transformers" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["None", "False", "False"]


def test_c_scorecard_rows_read_the_analysis(model, tmp_path):
    """C1–C3 rows come from the library (scripts only write them): values and detail from the
    setup, the ranking and the fit table, with known answers."""
    _, w, ov, _ = model
    texts = [RNG.integers(0, V, N_CTX) for _ in range(3)]
    dec = layer0(tmp_path, w, texts)
    st, ln2 = nr.build_setup(dec, w, ov, [2], 1, 10, None)
    c1 = nr.extended_scorecard(st, ln2, V, 256, ov.d_mlp, [2], 10, "t1", "m", "x.h5")
    assert [r["quantity"] for r in c1] == list(nr.C1_QUANTITIES) and {r["model"] for r in c1} == {"m"}
    assert c1[1]["value"] == [round(ln2["p05"], 4), round(ln2["p95"], 4)] and c1[1]["value"][0] <= c1[1]["value"][1]
    assert f"'L0H2': {round(float(st.z_bar[2]), 4)}" in c1[0]["detail"] and "'t1'" in c1[0]["detail"]
    ranking = pd.DataFrame({"neuron": [1710, 300, 1621, 7, 5, 9] + list(range(10, 1994)),
                            "explained": np.linspace(0.9, 0.0, 1990), "rank": np.arange(1, 1991)})
    top = pd.DataFrame({"neuron": [7, 7], "side": ["top", "bottom"], "token": ["a", "b"]})
    c2 = nr.contextual_scorecard(top, ranking, [7], "m", "t.csv", "r.csv")
    assert [r["quantity"] for r in c2] == [*nr.C2_QUANTITIES, "post_neurons_rank_percent"]
    assert c2[0]["detail"] == "7: +['a'] -['b']" and c2[1]["value"] == [1710, 300, 1621, 7, 5]
    assert c2[3]["value"] == round(100 * 3 / 1990, 2)  # neuron 1621 ranks third of 1990
    assert len(nr.contextual_scorecard(top, ranking.head(1000), [7], "m", "t.csv", "r.csv")) == 3  # no post neurons
    fits = pd.DataFrame({"neuron": [3, 3, 3, 4, 4, 4], "pearson_r": [0.9, 0.8, 0.1, 0.5, 0.6, 0.7],
                         "sign_agreement": [1.0, 0.9, 0.8, 0.7, 0.6, 0.5], "fvu": [0.1, 0.2, 0.3, 0.4, 0.5, np.nan]})
    c3 = {r["quantity"]: r for r in nr.fit_scorecard(fits, 5, "m", "fit.csv")}
    assert c3["median_pearson_r"]["value"] == 0.6  # neuron 4's median; neuron 3's is 0.8
    assert c3["median_sign_agreement"]["value"] == 0.6 and c3["median_fvu"]["value"] == 0.3
    assert "n >= 5" in c3["median_pearson_r"]["detail"]


@pytest.mark.float32
def test_gpt_neo_layer0_from_its_files_is_the_real_hook_pre(tmp_path):
    """GPT-Neo (nn.Linear projections, no value bias, unscaled scores): the layer-0 weights
    read from its files give Hugging Face's own layer-0 MLP pre-activations."""
    from posmech.models.loading import load_hf, prepare_local_model
    from tests import tiny_archs

    d = tiny_archs.gpt_neo(tmp_path / "neo")
    man = prepare_local_model("neo", {"source": str(d)}, tmp_path)
    w, ov, _ = nr.load_weights(man, "neo", tokenizer=False)
    assert ov.d_mlp == 4 * 32 and not ov.b_V.any()
    hf, _ = load_hf(man)
    ids = np.random.default_rng(3).integers(1, tiny_archs.V, tiny_archs.N_CTX)
    store = {}
    hook = hf.transformer.h[0].mlp.c_fc.register_forward_hook(lambda mod, i, o: store.setdefault("pre", o))
    with torch.no_grad():
        hf(torch.as_tensor(ids)[None])
    hook.remove()
    np.testing.assert_allclose(nr.hook_pre(w, ov, ids), store["pre"][0].double().numpy(), atol=2e-5)


# --------------------------------------------------------------------------- C3 through the engine
@pytest.fixture(scope="module")
def bridge(model, tmp_path_factory):
    """The planted model as the pipeline runs it (a TransformerLens bridge, Hugging Face weights)."""
    from posmech.models.loading import load_bridge

    path = tmp_path_factory.mktemp("planted") / "m"
    model[0].save_pretrained(path, safe_serialization=True)
    hb.char_tokenizer(V).save_pretrained(path)
    return load_bridge({"name": "planted", "hf_dir": str(path)}, device="cpu", processing="raw")


@pytest.mark.float32
def test_real_pre_activations_are_the_numpy_layer0(model, bridge):
    _, w, ov, _ = model
    ids = RNG.integers(0, V, N_CTX)
    got = nr.real_pre_activations(bridge, ids)
    assert got.shape == (N_CTX, 1024) and got.dtype == np.float64
    np.testing.assert_allclose(got, nr.hook_pre(w, ov, ids), atol=2e-5)
    with pytest.raises(PosmechError, match="blocks.9.mlp.hook_pre"):
        nr.real_pre_activations(bridge, ids, "blocks.9.mlp.hook_pre")


@pytest.mark.float32
def test_fit_table_is_exact_when_the_denominators_are_constant(model, bridge, tmp_path):
    """Tokens 1-3 only: every Z(n) is exp 0.4, the approximation (LN2 exact) is the real
    pre-activation, so r = 1, FVU = 0, RMSE = 0 on every (neuron, text); with tokens of other
    content scores it is not."""
    _, w, ov, _ = model
    texts = [RNG.integers(1, 4, N_CTX) for _ in range(2)]
    dec = layer0(tmp_path, w, texts)
    st, _ = nr.build_setup(dec, w, ov, [2], 0, 1, None)
    df, traces = nr.fit_table(bridge, st, stored_keys(dec), dec, [J, 3], 5, "exact", "m")
    assert list(df.columns) == ["claim", "model", "neuron", "text", "corpus", "title", "n_positions",
                                "pearson_r", "fvu", "sign_agreement", "rmse"]
    assert df[["neuron", "text"]].values.tolist() == [[J, 0], [3, 0], [J, 1], [3, 1]]
    assert (df["claim"] == "C3").all() and (df["n_positions"] == len(dec.token_ids[0]) - 5).all()
    np.testing.assert_allclose(df["pearson_r"], 1.0, atol=FLOAT32_FORWARD_ABS)
    np.testing.assert_allclose(df["fvu"], 0.0, atol=FLOAT32_FORWARD_ABS)
    assert (df["rmse"] < 1e-4).all()
    # one trace per neuron for the first text of the (only) corpus, along the whole text
    assert [(t["neuron"], t["text"]) for t in traces] == [(J, "c: t0"), (3, "c: t0")]
    np.testing.assert_allclose(traces[0]["real"], nr.hook_pre(w, ov, dec.token_ids[0])[:, J], atol=2e-5)
    mixed = layer0(tmp_path, w, [RNG.integers(0, V, N_CTX)])
    st, _ = nr.build_setup(mixed, w, ov, [2], 0, 1, None)
    df, _ = nr.fit_table(bridge, st, stored_keys(mixed), mixed, [J], 5, "exact", "m")
    assert df["rmse"].iloc[0] > 1e-3


def test_k9_table_has_no_variance_where_every_content_score_is_equal(model, tmp_path):
    """Head 2's content scores are equal for tokens 1-3: on texts of those tokens its
    denominator cannot vary, predicted and observed, resampled and within the text."""
    _, w, _, _ = model
    dec = layer0(tmp_path, w, [RNG.integers(1, 4, N_CTX) for _ in range(2)])
    classes = ["a", "b", "contextual", "d"]
    df = cx.variance_table(dec, classes, [10, 20], 16, 0, 5, "m")
    res, wt = df[df["method"] == "resampled"], df[df["method"] == "within_text"]
    assert len(res) == 2 * 2 * 4 and len(wt) == 2 * 4 and (df["claim"] == "K9").all()
    assert res["n"].tolist() == [10] * 4 + [20] * 4 + [10] * 4 + [20] * 4
    assert wt["n_positions"].unique().tolist() == [int((dec.positions >= 5).sum())]
    head2 = df[df["head"] == 2]
    assert (head2["head_class"] == "contextual").all() and (head2["head_name"] == "L0H2").all()
    np.testing.assert_allclose(head2[["predicted", "observed"]].to_numpy(dtype=float), 0.0, atol=FLOAT64_ABS)
    assert (df.loc[df["head"] == 0, "predicted"] > 0).any()  # head 0 reads D: scores differ
