"""Rotary frequency usage (P17, P18; posmech.analyses.rotary) on hand-built rotary models
whose heads' q·k live in known frequency pairs (posmech.models.handbuilt.rotary_model), and on
random-init tiny Llama (grouped-query) and GPT-NeoX (partial rotation) models, where the
decomposition must add up to the model's own pattern."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from posmech.analyses import rotary as ro
from posmech.core.errors import PosmechError
from posmech.models.handbuilt import RotaryHead, rotary_model, save_hf_model_dir
from posmech.models.loading import load_bridge
from tests.tolerances import FLOAT32_FORWARD_ABS, FLOAT64_ABS

N_CTX = 6  # offsets ≤ 5: cos(1 − Δ) peaks at Δ = 1 alone (Δ = 7 would come back near it)


def _docs(n_docs: int, n: int, vocab: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    docs = rng.integers(1, vocab, size=(n_docs, n))
    docs[:, 0] = 0  # BOS
    return docs


@pytest.fixture(scope="module")
def handbuilt(tmp_path_factory):
    """Layer 0: H0 a positional previous-token head in the highest-frequency pair (θ_0 = 1 rad per
    position, phase 1: its score a²·cos(1 − Δ)/sqrt(8) peaks at the previous key), H1 a content head in
    the lowest pair; layer 1: both content heads in the lowest pair."""
    heads = {(0, 0): RotaryHead((0,), "positional", amplitude=8.0), (0, 1): RotaryHead((3,), "content", 2.0),
             (1, 0): RotaryHead((3,), "content", 2.0), (1, 1): RotaryHead((3,), "content", 2.0)}
    d = save_hf_model_dir(rotary_model(heads, n_layer=2, n_ctx=N_CTX), tmp_path_factory.mktemp("rot") / "hf")
    bridge = load_bridge({"hf_dir": str(d), "name": "rot"}, device="cpu")
    return ro.frequency_usage(bridge, _docs(12, N_CTX, 40), batch_size=5)


@pytest.mark.float32
def test_the_pairs_frequencies_are_read_from_the_models_own_rotation(handbuilt):
    # Llama's θ_f = 10000^(-2f/d_head), d_head 8: 1, 0.1, 0.01, 0.001 rad per position
    assert handbuilt.frequency == pytest.approx([10000.0 ** (-2 * f / 8) for f in range(4)], rel=1e-6)
    assert handbuilt.max_pattern_diff <= FLOAT32_FORWARD_ABS
    assert handbuilt.n_queries == 12 * (N_CTX - 1)


def test_each_heads_selectivity_lives_in_its_one_pair(handbuilt):
    shares = handbuilt.shares
    assert shares.shape == (2, 2, 4)  # full rotation: no unrotated component
    np.testing.assert_allclose(shares[0, 0], [1, 0, 0, 0], atol=FLOAT64_ABS)
    for la, h in ((0, 1), (1, 0), (1, 1)):
        np.testing.assert_allclose(shares[la, h], [0, 0, 0, 1], atol=FLOAT64_ABS)
    assert (handbuilt.selectivity.sum(-1) > 0).all()  # every head attends selectively
    np.testing.assert_allclose(handbuilt.usage_shares[0, 0], [1, 0, 0, 0], atol=FLOAT64_ABS)
    # the positional head's usage is its amplitude squared: |q_0| = |k_0| = 8 at every token
    assert handbuilt.usage[0, 0, 0] == pytest.approx(64.0, rel=1e-5)


def test_the_positional_head_is_the_sharp_previous_token_head(handbuilt):
    assert ro.sharpest_previous_token_head(handbuilt) == (0, 0)
    # scores 64·cos(1 − Δ)/sqrt(8): Δ = 1 leads Δ = 0 and 2 by 22.6·(1 − cos 1) = 10.4
    assert handbuilt.prev[0, 0] > 0.99


def test_scorecard_p17_reads_the_high_band_and_p18_the_usage_profile(handbuilt):
    rows = {r["claim"]: r for r in ro.frequency_scorecard(handbuilt, "rot", 0.25, 0.5, "f.png")}
    assert rows["P17"]["value"] == pytest.approx(1.0, abs=FLOAT64_ABS) and "L0H0" in rows["P17"]["detail"]
    # usage shares per head: [1,0,0,0] once, [0,0,0,1] three times -> profile [.25, 0, 0, .75]
    np.testing.assert_allclose(ro.usage_profile(handbuilt), [0.25, 0, 0, 0.75], atol=FLOAT64_ABS)
    assert rows["P18"]["value"] == pytest.approx(3.0, rel=1e-9)
    # no head reaches the previous-token threshold: P17 has no value, with the reason
    nm = ro.frequency_scorecard(handbuilt, "rot", 0.25, 1.01, "f.png")[0]
    assert nm["value"] is None and "min_previous_token_score" in nm["detail"]
    table = ro.frequency_table(handbuilt, "rot")
    assert len(table) == 2 * 2 * 4 and table["selectivity_share"].sum() == pytest.approx(4.0)


def test_a_head_in_the_lowest_pair_is_not_a_previous_token_head_there():
    """The same positional construction in the lowest-frequency pair (θ_3 = 0.001 rad): the
    score is nearly constant over six positions, so the head is no previous-token head and
    its (tiny) selectivity still lives in pair 3 alone."""
    heads = {(0, 0): RotaryHead((3,), "positional", amplitude=8.0)}
    fu = _usage(rotary_model(heads, n_ctx=N_CTX))
    assert fu.prev[0, 0] < 0.3
    np.testing.assert_allclose(fu.shares[0, 0], [0, 0, 0, 1], atol=FLOAT64_ABS)


def _usage(model):
    import tempfile

    with tempfile.TemporaryDirectory() as t:
        d = save_hf_model_dir(model, f"{t}/hf")
        bridge = load_bridge({"hf_dir": str(d), "name": "m"}, device="cpu")
        return ro.frequency_usage(bridge, _docs(6, N_CTX, int(model.config.vocab_size)), batch_size=6)


@pytest.mark.float32
@pytest.mark.parametrize("which, processing", [("llama", "compatibility"), ("neox", "raw")])
def test_the_components_add_up_to_the_models_pattern_on_tiny_random_models(which, processing, tmp_path):
    """Grouped-query Llama (keys repeated per query group) and GPT-NeoX rotating half of each
    head (an unrotated component beside the pairs): the softmax of the summed components is the
    model's own pattern (frequency_usage checks it and records the largest difference)."""
    from tests import tiny_archs

    d = getattr(tiny_archs, which)(tmp_path / which)
    bridge = load_bridge({"hf_dir": str(d), "name": which}, device="cpu", processing=processing)
    fu = ro.frequency_usage(bridge, _docs(4, 16, tiny_archs.V), batch_size=3)
    d_head = int(bridge.cfg.d_head)
    rotated = d_head if which == "llama" else int(0.5 * d_head)
    assert fu.n_pairs == rotated // 2 and fu.selectivity.shape[-1] == fu.n_pairs + (which == "neox")
    assert fu.max_pattern_diff <= 10 * FLOAT32_FORWARD_ABS
    np.testing.assert_allclose(np.nansum(fu.shares, -1), 1.0, atol=FLOAT64_ABS)
    assert math.isfinite(ro.frequency_scorecard(fu, which, 0.25, 0.0, "x")[1]["value"])


def test_a_learned_position_model_is_refused_naming_the_scheme(tmp_path):
    from tests import tiny_archs

    d = tiny_archs.opt(tmp_path / "opt")
    bridge = load_bridge({"hf_dir": str(d), "name": "opt"}, device="cpu")
    with pytest.raises(PosmechError, match="not rotary"):
        ro.frequency_usage(bridge, _docs(2, 8, tiny_archs.V), batch_size=2)


def test_band_size_is_a_fraction_of_the_pairs_at_least_one_at_most_half():
    assert [ro.band_size(p, 0.25) for p in (2, 4, 8, 32, 64)] == [1, 1, 2, 8, 16]
    assert ro.band_size(8, 0.9) == 4
    with pytest.raises(PosmechError, match="at least 2"):
        ro.band_size(1, 0.25)


def test_pair_frequencies_refuse_an_interleaved_rotation():
    theta = torch.tensor([1.0, 0.1])
    pos = torch.arange(3.0)[:, None] * theta.repeat_interleave(2)[None]  # GPT-J's layout: f, f, g, g
    with pytest.raises(PosmechError, match="interleaved"):
        ro.pair_frequencies(pos.cos()[None], pos.sin()[None])


def test_a_single_rotated_pair_gives_no_bands_and_no_values_with_the_reason():
    """A rotation of one pair per head (a small head with a partial rotation): P17 and P18 are
    not measurable, never an error."""
    fu = ro.FrequencyUsage(selectivity=np.array([[[0.3, 0.1]]]), usage=np.array([[[2.0]]]),
                           prev=np.array([[0.9]]), frequency=np.array([1.0]), n_queries=10, max_pattern_diff=0.0)
    rows = ro.frequency_scorecard(fu, "m", 0.25, 0.5, "f.png")
    assert [r["value"] for r in rows] == [None, None] and all("1 rotated pair" in r["detail"] for r in rows)
    np.testing.assert_allclose(fu.shares[0, 0], [0.75, 0.25], atol=FLOAT64_ABS)


@pytest.mark.float32
def test_a_soft_capped_models_pairs_split_the_logit_before_its_cap(tmp_path):
    """Gemma 2 (grouped-query, soft-capped scores, a sliding layer) with its cap at 1 and
    weights large enough that the cap bends the scores: the softmax of the *capped* sum of the
    components is Hugging Face's own attention (output_attentions of its eager forward), the
    uncapped sum's is not; the shares still sum to 1 and the selectivities are >= 0 (the cap
    is monotone)."""
    import transformers

    from posmech.models.handbuilt import char_tokenizer
    from posmech.models.scores import ScoreFunction, score_function
    from tests import tiny_archs

    keys = {**tiny_archs.ARCHS["gemma2"][4], "attn_logit_softcapping": 1.0, **tiny_archs.COMMON}
    hf = transformers.Gemma2ForCausalLM(transformers.Gemma2Config(**keys))
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if p.ndim >= 2:
                p.copy_((1.0 if "q_proj" in name or "k_proj" in name else 0.2) * torch.randn(p.shape, generator=g))
    hf.save_pretrained(tmp_path, safe_serialization=True)
    char_tokenizer(tiny_archs.V).save_pretrained(tmp_path)
    bridge = load_bridge({"hf_dir": str(tmp_path), "name": "gemma2"}, device="cpu", processing="raw")
    assert score_function(bridge.cfg).softcap == 1.0
    docs = _docs(3, 24, tiny_archs.V)  # longer than layer 0's sliding window of 16
    assert ro._layer_windows(bridge, 2) == [16, 0]
    fu = ro.frequency_usage(bridge, docs, batch_size=3)  # raises if softmax(cap(Σ c)) is not hook_pattern
    assert fu.max_pattern_diff <= 10 * FLOAT32_FORWARD_ABS
    np.testing.assert_allclose(np.nansum(fu.shares, -1), 1.0, atol=FLOAT64_ABS)
    assert (fu.selectivity.sum(-1) >= -FLOAT64_ABS).all()
    # against Hugging Face's forward: layer 0's components, capped, give its attention; uncapped, not
    got = {}
    names = ("hook_q", "hook_k", "hook_cos", "hook_sin")
    with torch.inference_mode(), bridge.hooks(fwd_hooks=[(f"blocks.0.attn.{n}", lambda t, hook, n=n: got.__setitem__(
            n, t.double())) for n in names]):
        bridge(torch.as_tensor(docs), return_type=None)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    with torch.no_grad():
        ref = hf_model(torch.as_tensor(docs), output_attentions=True).attentions[0].double()
    fn = score_function(bridge.cfg)
    qr, kr = fn.prepare(got["hook_q"], got["hook_k"], {"hook_cos": got["hook_cos"], "hook_sin": got["hook_sin"]})
    r = int(got["hook_cos"].shape[-1])
    diffs = []
    for cap in (fn.cap, ScoreFunction("rotary", fn.scale).cap):
        worst = 0.0
        for h in range(qr.shape[2]):
            c = ro.components(qr[:, :, h:h + 1], kr[:, :, h:h + 1], r, fn.scale)
            worst = max(worst, ro.head_accumulate(c, ref[:, h:h + 1], cap, window=16)[3])
        diffs.append(worst)
    assert diffs[0] <= 10 * FLOAT32_FORWARD_ABS < 100 * FLOAT32_FORWARD_ABS < diffs[1], diffs
