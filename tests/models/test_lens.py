"""The posmech forward engine (`posmech.models.lens.Lens`) equals TransformerLens's bridge.

Every hook point, the logits and the processed weights are compared with the bridge's, in
both processing modes, on random-weight models whose every weight matters (LayerNorm scales
and biases far from 1 and 0, non-zero biases everywhere): a GPT-2 with MLPs from Hugging
Face, a GPT-Neo (TinyStories' architecture, with a local layer), and a legacy
TransformerLens checkpoint (attention-only, as attn-only-2l). Then the
interventions the analyses make (a pattern replaced, a head's output scaled, an embedding
zeroed, W_pos overwritten in place) must change both engines' outputs the same way.
Tolerance: float32 rounding, 5e-5 relative to the tensor's largest value.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from posmech.core.errors import PosmechError
from posmech.models import lens as lens_mod
from posmech.models.handbuilt import char_tokenizer
from posmech.models.loading import load_bridge, load_model
from posmech.core.perf import forward_passes

from tests.tolerances import FLOAT32_FORWARD_REL

V, N = 40, 24
RTOL = 5e-5


def _randomise(named: dict[str, torch.Tensor], seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in named.items():
            if p.dtype == torch.bool or p.ndim == 0:
                continue
            r = torch.randn(p.shape, generator=g)
            is_ln_w = ("ln" in name and (name.endswith("weight") or name.endswith(".w")))
            p.copy_(1.0 + 0.3 * r if is_ln_w else 0.3 * r)


def _saved(model, d: Path, seed: int) -> Path:
    """``model`` with every weight random (:func:`_randomise`), saved with the character tokenizer in ``d``."""
    _randomise(dict(model.named_parameters()), seed)
    model.save_pretrained(d, safe_serialization=True)
    char_tokenizer(V).save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory) -> Path:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=V, n_positions=N, n_embd=32, n_layer=3, n_head=4, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return _saved(GPT2LMHeadModel(cfg), tmp_path_factory.mktemp("lens-gpt2"), 0)


@pytest.fixture(scope="module")
def neo_dir(tmp_path_factory) -> Path:
    """GPT-Neo (TinyStories' architecture): unscaled attention, a local layer of 5 keys."""
    from transformers import GPTNeoConfig, GPTNeoForCausalLM

    m = GPTNeoForCausalLM(GPTNeoConfig(vocab_size=V, max_position_embeddings=N, hidden_size=32, num_layers=2,
                                       num_heads=4, attention_types=[[["global", "local"], 1]], window_size=5,
                                       resid_dropout=0.0, embed_dropout=0.0, attention_dropout=0.0))
    return _saved(m, tmp_path_factory.mktemp("lens-neo"), 2)


@pytest.fixture(scope="module")
def tl_dir(tmp_path_factory) -> Path:
    """A legacy TransformerLens checkpoint, attention-only with LayerNorms (attn-only-2l's form)."""
    from safetensors.torch import save_file

    d = tmp_path_factory.mktemp("lens-tl")
    L, H, dm, dh = 2, 4, 32, 8
    sd = {"embed.W_E": torch.zeros(V, dm), "pos_embed.W_pos": torch.zeros(N, dm),
          "ln_final.w": torch.zeros(dm), "ln_final.b": torch.zeros(dm),
          "unembed.W_U": torch.zeros(dm, V), "unembed.b_U": torch.zeros(V)}
    for i in range(L):
        sd |= {f"blocks.{i}.ln1.w": torch.zeros(dm), f"blocks.{i}.ln1.b": torch.zeros(dm),
               f"blocks.{i}.attn.W_O": torch.zeros(H, dh, dm), f"blocks.{i}.attn.b_O": torch.zeros(dm)}
        for n in "QKV":
            sd[f"blocks.{i}.attn.W_{n}"] = torch.zeros(H, dm, dh)
            sd[f"blocks.{i}.attn.b_{n}"] = torch.zeros(H, dh)
    _randomise(sd, 1)
    save_file({k: v.contiguous() for k, v in sd.items()}, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({
        "n_layers": L, "d_model": dm, "d_head": dh, "n_heads": H, "d_mlp": -1, "d_vocab": V, "n_ctx": N,
        "act_fn": "solu_ln", "normalization_type": "LN", "attn_only": True, "eps": 1e-5,
        "positional_embedding_type": "standard", "tokenizer_name": None, "original_architecture": "neel"}))
    char_tokenizer(V).save_pretrained(d)
    return d


def _man(d: Path) -> dict:
    return {"hf_dir": str(d), "name": d.name}


def _tokens(seed: int = 0, batch: int = 3) -> torch.Tensor:
    return torch.as_tensor(np.random.default_rng(seed).integers(0, V, size=(batch, N)))


def _capture(model, names, x, extra=()):
    got = {}

    def grab(name):
        def fn(t, hook):
            got[name] = t.detach().clone()
        return fn

    with torch.inference_mode(), model.hooks(fwd_hooks=[*extra, *[(n, grab(n)) for n in names]]):
        logits = model(x)
    return got, logits


def _close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.shape == b.shape, (what, tuple(a.shape), tuple(b.shape))
    fin = torch.isfinite(a)
    assert torch.equal(fin, torch.isfinite(b)), f"{what}: masked entries differ"
    a, b = a.detach(), b.detach()
    scale = float(a[fin].abs().max()) if fin.any() else 1.0
    diff = float((a[fin] - b[fin]).abs().max()) if fin.any() else 0.0
    assert diff <= RTOL * max(scale, 1.0), f"{what}: max |diff| {diff:.3g} (scale {scale:.3g})"


@pytest.mark.float32
@pytest.mark.parametrize("processing", ["compatibility", "raw"])
@pytest.mark.parametrize("which", ["gpt2", "neo", "tl"])
def test_every_hook_logit_and_weight_equals_the_bridge(which, processing, gpt2_dir, neo_dir, tl_dir):
    d = {"gpt2": gpt2_dir, "neo": neo_dir, "tl": tl_dir}[which]
    bridge = load_bridge(_man(d), "cpu", "float32", processing)
    lens = load_model(_man(d), "cpu", "float32", processing, "posmech")
    assert isinstance(lens, lens_mod.Lens)
    names = [n for n in lens.hook_dict if not n.endswith("hook_result")]  # bridge: needs use_attn_result
    assert all(n in bridge.hook_dict for n in names), [n for n in names if n not in bridge.hook_dict]
    x = _tokens()
    got_b, logits_b = _capture(bridge, names, x)
    got_l, logits_l = _capture(lens, names, x)
    _close(logits_b, logits_l, "logits")
    for n in names:
        if which in ("tl", "neo") and n.endswith("hook_attn_scores"):
            # TransformerLens 4.3's bridge records the pattern at hook_attn_scores for legacy
            # checkpoints and for GPT-Neo; the engine records the scores, checked against q, k below
            assert torch.allclose(got_b[n], got_b[n.replace("attn_scores", "pattern")])
            continue
        if n in got_b:  # the bridge fires an aliased point (e.g. resid_pre / ln1.hook_in) once
            _close(got_b[n], got_l[n], n)
    for i in range(lens.cfg.n_layers):
        q, k = got_l[f"blocks.{i}.attn.hook_q"], got_l[f"blocks.{i}.attn.hook_k"]
        raw = torch.einsum("bqhd,bkhd->bhqk", q, k) / lens.cfg.attn_scale
        scores = got_l[f"blocks.{i}.attn.hook_attn_scores"]
        future = torch.ones(N, N, dtype=torch.bool).triu(1)
        if which == "neo" and i == 1:  # the local layer: keys 5 or more positions back are hidden too
            future |= torch.ones(N, N, dtype=torch.bool).tril(-5)
        assert (scores[..., future] < -1e30).all() if processing == "raw" else torch.isneginf(scores[..., future]).all()
        _close(raw[..., ~future], scores[..., ~future], f"layer {i} scores vs q.k")
    assert len(set(got_l) & set(got_b)) >= len(names) - 3 * lens.cfg.n_layers
    for w in ("W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V", "W_O", "b_O", "W_E", "W_pos", "W_U", "b_U"):
        try:
            ref = getattr(bridge, w)
        except AttributeError:  # the bridge has no stacked bias for bias-free projections (GPT-Neo, raw)
            assert which == "neo" and w.startswith("b_") and not getattr(lens, w).any(), w
            continue
        _close(ref, getattr(lens, w), w)
    if which != "tl":
        for w in ("W_in", "b_in", "W_out", "b_out"):
            _close(getattr(bridge, w), getattr(lens, w), w)
    for key in ("n_layers", "n_heads", "d_model", "d_head", "n_ctx", "d_vocab"):
        assert getattr(lens.cfg, key) == getattr(bridge.cfg, key), key


def _interventions(model):
    """The kinds of edit the analyses make, on whichever engine."""
    def zero(t, hook):
        return t * 0.0

    def knock_out(t, hook):  # P5: the previous-token entries of head 1, renormalised
        t = t.clone()
        idx = torch.arange(1, t.shape[-1])
        t[:, 1, idx, idx - 1] = 0.0
        return t / t.sum(-1, keepdim=True)

    def scale_head(t, hook):  # P14: one head's output scaled
        t = t.clone()
        t[:, :, 2] *= 3.0
        return t

    return {
        "token_only": [("hook_pos_embed", zero)],
        "position_only": [("hook_embed", zero)],
        "pattern": [("blocks.0.attn.hook_pattern", knock_out)],
        "head_scale": [("blocks.1.attn.hook_z", scale_head)],
        "scores": [("blocks.1.attn.hook_attn_scores", lambda t, hook: t * 0.5)],
    }


@pytest.mark.float32
@pytest.mark.parametrize("which", ["gpt2", "neo", "tl"])
def test_interventions_change_both_engines_alike(which, gpt2_dir, neo_dir, tl_dir):
    d = {"gpt2": gpt2_dir, "neo": neo_dir, "tl": tl_dir}[which]
    bridge = load_bridge(_man(d), "cpu", "float32", "compatibility")
    lens = load_model(_man(d), "cpu", "float32", "compatibility", "posmech")
    x = _tokens(1)
    with torch.inference_mode():
        plain = lens(x)
        # TL 4.3's bridge discards (with a warning) edits of the scores for legacy checkpoints
        # and GPT-Neo, and of the pattern for GPT-Neo: those are compared with the bridge's
        # result for GPT-2 only; the engine applies them on every architecture
        discarded = {"gpt2": (), "tl": ("scores",), "neo": ("scores", "pattern")}[which]
        for name, hooks in _interventions(lens).items():
            b = lens.run_with_hooks(x, fwd_hooks=hooks)
            assert float((b - plain).abs().max()) > 1e-3, f"{name}: the edit did nothing"
            if name not in discarded:
                _close(bridge.run_with_hooks(x, fwd_hooks=hooks), b, name)
        check_wpos_edit(bridge, lens, x, plain, _close)
    assert not any(hp.fwd_hooks for hp in lens.hook_dict.values())


def check_wpos_edit(bridge, lens, x, plain, close):
    """W_pos overwritten in place (P2's averaging) changes both engines alike, and restored
    gives the engine's ``plain`` logits back (run under inference mode)."""
    saved = [m.W_pos.detach().clone() for m in (bridge, lens)]
    for m in (bridge, lens):
        m.W_pos.copy_(m.W_pos.mean(0, keepdim=True).expand_as(m.W_pos))
    close(bridge(x), lens(x), "W_pos averaged")
    for m, s in zip((bridge, lens), saved):
        m.W_pos.copy_(s)
    assert torch.equal(lens(x), plain)


def test_a_pass_stops_after_the_last_hooked_block_and_counts_itself(gpt2_dir):
    lens = load_model(_man(gpt2_dir), "cpu", "float32", "compatibility", "posmech")
    ran: list[int] = []
    orig = lens._attention
    lens._attention = lambda i, x: (ran.append(i), orig(i, x))[1]  # type: ignore[method-assign]
    x = _tokens(2, batch=2)
    before = forward_passes().get(f"2x{N}", 0)
    with torch.inference_mode():
        assert lens.run_with_hooks(x, fwd_hooks=[("blocks.1.attn.hook_q", lambda t, hook: None)],
                                   return_type=None) is None
        assert ran == [0, 1]
        ran.clear()
        lens(x, return_type=None)  # nothing hooked: nothing to compute
        assert ran == []
        lens(x)
        assert ran == [0, 1, 2]
        resid = lens(x, stop_at_layer=1)
        assert resid.shape == (2, N, 32) and ran == [0, 1, 2, 0]
        ran.clear()
        assert torch.equal(lens(x, return_type=None, stop_at_layer=2), resid_2 := lens(x, stop_at_layer=2))
        assert ran == [0, 1, 0, 1] and resid_2.shape == (2, N, 32)
    assert forward_passes()[f"2x{N}"] - before == 6


def check_token_tree(lens, prompt, conts, close, what):
    """Run ``prompt`` with continuations ``conts`` as one token tree (the prompt once, each
    continuation at positions n, n+1, .. seeing the prompt and itself) and check with
    ``close`` that each position's logits equal a pass of prompt + that continuation alone.
    Returns ``(tokens, positions, visible)`` of the tree."""
    x = np.concatenate([prompt, *conts])
    T, n = len(x), len(prompt)
    positions, visible = np.arange(T), np.tril(np.ones((T, T), dtype=bool))
    visible[n:, n:] = False
    at = n
    for c in conts:
        positions[at : at + len(c)] = np.arange(n, n + len(c))
        visible[at : at + len(c), at : at + len(c)] = np.tril(np.ones((len(c), len(c)), dtype=bool))
        at += len(c)
    with torch.inference_mode():
        tree = lens(torch.as_tensor(x)[None], positions=positions, visible=visible)[0]
        at = n
        for c in conts:
            alone = lens(torch.as_tensor(np.concatenate([prompt, c]))[None])[0]
            close(tree[:n], alone[:n], f"{what}: prompt logits")
            close(tree[at : at + len(c)], alone[n:], f"{what}: continuation {c}")
            at += len(c)
    return x, positions, visible


@pytest.mark.float32
@pytest.mark.parametrize("which", ["gpt2", "neo", "tl"])
def test_a_token_tree_runs_each_continuation_as_if_alone(which, gpt2_dir, neo_dir, tl_dir):
    """A prompt with three continuations in one pass (the prompt once, each continuation at
    positions n, n+1, .. seeing the prompt and itself): every position's logits equal a pass
    of prompt + that continuation alone (GPT-Neo: its local layer's window counts positions,
    not sequence indices); target_probabilities gives the same numbers with the tree as with
    one padded row per continuation."""
    from posmech.analyses.readout import target_probabilities

    d = {"gpt2": gpt2_dir, "neo": neo_dir, "tl": tl_dir}[which]
    lens = load_model(_man(d), "cpu", "float32", "compatibility", "posmech")
    assert lens.runs_token_trees
    prompt = np.random.default_rng(3).integers(0, V, 12)
    conts = [[5, 7, 9], [1], [8, 2]]
    x, positions, visible = check_token_tree(lens, prompt, conts, _close, which)
    T = len(x)
    targets = {"a": [[5, 7, 9, 3], [1]], "b": [[8, 2, 6]], "c": [[4]]}
    with_tree = target_probabilities(lens, prompt, targets)
    padded = target_probabilities(lens, prompt, targets, hooks=[("hook_embed", lambda t, hook: None)])
    for name in targets:
        assert with_tree[0][name] == pytest.approx(padded[0][name], rel=FLOAT32_FORWARD_REL)
    assert with_tree[1:] == pytest.approx(padded[1:], rel=FLOAT32_FORWARD_REL)
    with pytest.raises(PosmechError, match="token tree"):  # a key after its query
        lens(torch.as_tensor(x)[None], positions=positions, visible=np.ones((T, T), dtype=bool))
    with pytest.raises(PosmechError, match="both"):
        lens(torch.as_tensor(x)[None], positions=positions)


@pytest.mark.float32
@pytest.mark.parametrize("which", ["gpt2", "tl"])
def test_a_hooked_pattern_made_by_query_blocks_equals_the_square(which, gpt2_dir, tl_dir, monkeypatch):
    """With only hook_pattern hooked, the pattern is made a block of queries at a time (blocks
    of 4 here); hooked scores force the whole square. Both give the same pattern and logits,
    when the hook reads, edits in place (below and above the diagonal) or replaces it."""
    monkeypatch.setattr(lens_mod, "QUERY_BLOCK", 4)
    lens = load_model(_man({"gpt2": gpt2_dir, "tl": tl_dir}[which]), "cpu", "float32", "compatibility", "posmech")
    x = _tokens(4, batch=2)

    def zero_prev(t, hook):
        t[..., torch.arange(1, N), torch.arange(N - 1)] = 0.0

    def above(t, hook):
        t[..., 2, 20] = 0.5

    def replace(t, hook):
        return torch.flip(t, dims=[-2])

    for name, edit in [("read", None), ("in place", zero_prev), ("above the diagonal", above), ("replaced", replace)]:
        got = {}
        for square in (False, True):
            seen: list[torch.Tensor] = []
            hooks = [("blocks.1.attn.hook_pattern", lambda t, hook: seen.append(t.clone()))]
            if edit is not None:
                hooks.insert(0, ("blocks.1.attn.hook_pattern", edit))
            if square:
                hooks.append(("blocks.1.attn.hook_attn_scores", lambda t, hook: None))
            with torch.inference_mode():
                logits = lens.run_with_hooks(x, fwd_hooks=hooks)
            got[square] = (seen[0], logits)
        _close(got[False][0], got[True][0], f"{which} {name}: pattern")
        _close(got[False][1], got[True][1], f"{which} {name}: logits")
        if edit is None:
            assert torch.equal(torch.triu(got[False][0], 1), torch.zeros_like(got[False][0]))


def test_auto_chooses_the_engine_and_refuses_what_it_cannot_run(gpt2_dir, neo_dir, tl_dir, tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    for d in (gpt2_dir, neo_dir, tl_dir):
        assert isinstance(load_model(_man(d), "cpu", "float32", "compatibility"), lens_mod.Lens), d
    assert not isinstance(load_model(_man(gpt2_dir), "cpu", "float32", "compatibility", "bridge"), lens_mod.Lens)
    odd = GPT2LMHeadModel(GPT2Config(vocab_size=V, n_positions=N, n_embd=32, n_layer=2, n_head=4,
                                     scale_attn_by_inverse_layer_idx=True))
    odd.save_pretrained(tmp_path, safe_serialization=True)
    char_tokenizer(V).save_pretrained(tmp_path)
    auto = load_model(_man(tmp_path), "cpu", "float32", "compatibility")
    assert not isinstance(auto, lens_mod.Lens) and hasattr(auto, "hook_dict")  # the bridge
    with pytest.raises(PosmechError, match="engine.*posmech.*does not run.*scale_attn_by_inverse_layer_idx"):
        load_model(_man(tmp_path), "cpu", "float32", "compatibility", "posmech")
    lens = load_model(_man(gpt2_dir), "cpu", "float32", "compatibility")
    with pytest.raises(PosmechError, match="hook 'blocks.0.attn.hook_nope' does not exist"):
        with lens.hooks(fwd_hooks=[("blocks.0.attn.hook_nope", lambda t, hook: None)]):
            pass
    assert not any(hp.fwd_hooks for hp in lens.hook_dict.values())


@pytest.mark.parametrize("processing", ["compatibility", "raw"])
def test_the_engine_never_writes_into_the_model_it_was_built_from(gpt2_dir, processing):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(gpt2_dir)
    before = {k: v.clone() for k, v in hf.state_dict().items()}
    lens = lens_mod.from_hf(hf, processing=processing)
    with torch.no_grad():
        for p in lens.parameters():
            p.add_(1.0)
    assert all(torch.equal(before[k], v) for k, v in hf.state_dict().items())
