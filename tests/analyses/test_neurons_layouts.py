"""The contextual neurons' weights (posmech.analyses.neurons.ov_from_hf) on every MLP layout,
against the Hugging Face forward of a random-init tiny model of each family: the residual the
neurons' MLP reads, rebuilt from layer 0's input, its norm and attention pattern and the
value/output weights, and the neurons' pre-activation (a gated MLP's gate) equal the hooked
Hugging Face values. Sequential blocks: layer 0's MLP; parallel blocks (GPT-J, GPT-NeoX, Phi,
Falcon): layer 1's, which reads layer 0's attention and MLP outputs."""

from __future__ import annotations

import numpy as np
import pytest

from posmech.models import mlp_layouts as ml
from posmech.analyses import neurons as nr
from tests.tolerances import FLOAT32_FORWARD_REL

from tests.models.test_mlp_layouts import FAMILIES, T, V, _build, _hooked_forward

LAYER1_BLOCK = lambda path: path[: -len(".0")] + ".1"  # noqa: E731


@pytest.mark.float32
@pytest.mark.parametrize("family", FAMILIES)
def test_neurons_read_the_hugging_face_pre_activation(family, tmp_path):
    from posmech.models.lens import hf_dir_reader
    from posmech.models.loading import WeightView

    model, (block_path, ins, down, gated, parallel) = _build(family, tmp_path)
    ids = np.random.default_rng(0).integers(1, V, T)
    hf0 = _hooked_forward(model, block_path, ins, down, ids)
    get, cfg = hf_dir_reader(tmp_path, framework="numpy")
    ov = nr.ov_from_hf(WeightView(get, get.names, cfg), family)
    assert (ov.layer, ov.gated, ov.ln2_rms) == (1 if parallel else 0, gated, "rms_norm_eps" in cfg)
    assert ov.hook == f"blocks.{ov.layer}.mlp.hook_pre"
    hf = _hooked_forward(model, LAYER1_BLOCK(block_path), ins, down, ids) if parallel else hf0
    b0 = ml.read_block(get, get.names, cfg, 0)
    r = nr.mlp_residual(ov, hf0["resid"], b0.ln1(hf0["resid"]), hf0["patterns"])
    if parallel:  # layer 1 reads its input: layer 0's output
        want = hf["resid"]
    else:  # layer 0's MLP reads resid_mid: the norm's input, recovered from what the MLP's norm made of it
        want = hf0["resid"] + b0.attention(hf0["resid"], hf0["patterns"])
    np.testing.assert_allclose(r, want, rtol=0, atol=FLOAT32_FORWARD_REL * max(1.0, np.abs(want).max()))
    pre = ov.ln2(r) @ ov.W_in + ov.b_in
    np.testing.assert_allclose(pre, hf["pre"], rtol=0, atol=FLOAT32_FORWARD_REL * max(1.0, np.abs(hf["pre"]).max()))
    if parallel:  # layer 0's attention reaches layer 1's neurons: they are not a function of the current token
        assert not np.allclose(pre, ov.ln2(hf0["resid"] + ov.embed_mlp(hf0["resid"])) @ ov.W_in + ov.b_in)


def test_layouts_without_the_object_are_layout_errors(tmp_path):
    from posmech.models.lens import hf_dir_reader
    from posmech.models.loading import WeightView

    _build("gptj", tmp_path / "j")
    get, cfg = hf_dir_reader(tmp_path / "j", framework="numpy")
    b0 = ml.read_block(get, get.names, cfg, 0)
    with pytest.raises(ml.LayoutError, match="no layer-1 MLP"):
        nr.ov_from_blocks(b0, None)
    seq = ml.read_block(*_falcon_sequential(tmp_path), 0)
    with pytest.raises(ml.LayoutError, match="layer 1's sequential"):
        nr.ov_from_blocks(b0, seq)


def _falcon_sequential(tmp_path):
    from posmech.models.lens import hf_dir_reader

    _build("falcon_sequential", tmp_path / "f")
    get, cfg = hf_dir_reader(tmp_path / "f", framework="numpy")
    return get, get.names, cfg
