"""Position scheme and layout read from a model's config (posmech.models.architecture), the
applicability table built on it (posmech.pipeline.applicability), and the preflight error for a
missing context length.

The models are random-init tiny GPT-NeoX (Pythia: partial rotary), Llama (rotary,
grouped-query attention), BLOOM (ALiBi, no context length) and OPT (learned positions stored
from row 2) built from ``transformers`` configs and saved locally (tests/tiny_archs.py);
what the config says is checked against the saved weights' shapes where they show it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from safetensors import safe_open

from posmech.pipeline.applicability import FAMILIES, RULES, Needs, Requirement, check_table, family_problems, not_applicable, why_not
from posmech.core.config import load_schema, validate_config
from posmech.core.errors import PosmechError
from posmech.verdicts.findings import Finding, judge
from posmech.models.architecture import architecture, context_length, read_architecture, train_architecture
from posmech.models.lens import with_engine_refusal
from posmech.models.loading import prepare_local_model
from posmech.pipeline.preflight import preflight
from tests import tiny_archs

#: the rules that read layer 0's weights (requirement layer0_weights, directly or through what they read): K6-K10, C1-C3
LAYER0_RULES = ("layer0_decomposition", "layer0_positional_patterns", "layer0_head_classes", "softmax_denominators",
                "denominator_variance", "layer1_patterns", "extended_token_embeddings", "contextual_neurons",
                "bag_of_tokens_fit")

REPO = Path(__file__).resolve().parents[2]
SCHEMA = load_schema(REPO / "workflow" / "schemas" / "config.schema.yaml")


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("archs")
    return {name: build(root / name) for name, build in tiny_archs.BUILDERS.items()}


def _shapes(d: Path) -> dict[str, tuple[int, ...]]:
    with safe_open(str(d / "model.safetensors"), "pt") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}


def test_neox_partial_rotary(dirs):
    a = read_architecture(dirs["neox"])
    assert (a.model_type, a.positions, a.rotary_fraction) == ("gpt_neox", "rotary", 0.5)
    assert (a.context, a.context_key) == (tiny_archs.N_CTX, "max_position_embeddings")
    assert (a.n_heads, a.n_kv_heads, a.d_head, a.position_offset) == (4, 4, 8, 0)
    assert a.attn_scale == pytest.approx(1 / math.sqrt(8))
    assert not any("pos" in k and "embed" in k for k in _shapes(dirs["neox"]))  # no W_pos to find


def test_llama_rotary_grouped_query(dirs):
    a = read_architecture(dirs["llama"])
    assert (a.positions, a.rotary_fraction, a.n_heads, a.n_kv_heads) == ("rotary", 1.0, 4, 2)
    k_proj = _shapes(dirs["llama"])["model.layers.0.self_attn.k_proj.weight"]
    assert k_proj[0] == a.n_kv_heads * a.d_head  # the saved keys really are grouped


def test_bloom_alibi_has_no_context(dirs):
    a = read_architecture(dirs["bloom"])
    assert (a.positions, a.context, a.context_key, a.rotary_fraction) == ("alibi", None, None, None)
    with pytest.raises(PosmechError, match=r"models\.bloom\.n_ctx"):
        context_length(a, "bloom", None)
    assert context_length(a, "bloom", 32) == 32


def test_opt_learned_with_offset(dirs):
    a = read_architecture(dirs["opt"])
    assert (a.positions, a.context, a.position_offset) == ("learned", tiny_archs.N_CTX, 2)
    rows = _shapes(dirs["opt"])["model.decoder.embed_positions.weight"][0]
    assert rows == a.context + a.position_offset


def test_gpt_neo_unscaled_and_tl_legacy():
    neo = architecture({"model_type": "gpt_neo", "hidden_size": 32, "num_layers": 2, "num_heads": 4,
                        "max_position_embeddings": 16})
    assert (neo.positions, neo.attn_scale) == ("learned", 1.0)
    tl = architecture({"d_model": 32, "n_layers": 2, "n_heads": 4, "d_head": 8, "n_ctx": 24, "attn_only": True,
                       "positional_embedding_type": "standard", "use_attn_scale": False})
    assert (tl.model_type, tl.positions, tl.has_mlp, tl.attn_scale, tl.context) == (
        "transformer_lens", "learned", False, 1.0, 24)
    assert train_architecture({"architecture": "gpt2", "n_ctx": 32}).model_type == "gpt2"
    assert not train_architecture({"architecture": "attn_only"}).has_mlp


def test_unknown_scheme_is_not_measurable_with_its_reason():
    """A scheme neither the weights, the config nor transformers' code tells is ``unknown``:
    every rule of the table is not applicable, with why (decided before any job)."""
    a = architecture({"model_type": "my_model", "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 1})
    assert a.positions == "unknown" and "model_type 'my_model'" in a.undecided
    skipped = not_applicable(a)
    assert set(skipped) == set(RULES)
    assert all(r.startswith("position scheme not decided before the run: model_type 'my_model'")
               for r in skipped.values())


#: what each architecture is, written out here only as the cross-check of what
#: posmech reads from config, weights and code: (positions, rotary fraction, interleaved
#: pairs, attention grouping, parallel blocks, MLP kind, position offset)
EXPECTED = {
    "gpt2": ("learned", None, None, "multi-head", False, "plain", 0),
    "gpt2_one_layer": ("learned", None, None, "multi-head", False, "plain", 0),
    "gpt_neo": ("learned", None, None, "multi-head", False, "plain", 0),
    "opt": ("learned", None, None, "multi-head", False, "plain", 2),
    "gpt_bigcode": ("learned", None, None, "multi-query", False, "plain", 0),
    "neox": ("rotary", 0.5, False, "multi-head", True, "plain", 0),
    "llama": ("rotary", 1.0, False, "grouped-query", False, "gated", 0),
    "qwen2": ("rotary", 1.0, False, "grouped-query", False, "gated", 0),
    "gemma2": ("rotary", 1.0, False, "grouped-query", False, "gated", 0),
    "phi": ("rotary", 0.5, False, "multi-head", True, "plain", 0),
    "gptj": ("rotary", 0.5, True, "multi-head", True, "plain", 0),
    "falcon": ("rotary", 1.0, False, "multi-query", True, "plain", 0),
    "bloom": ("alibi", None, None, "multi-head", False, "plain", 0),
    "mpt": ("alibi", None, None, "multi-head", False, "plain", 0),
}


def test_layout_read_from_config_weights_and_code(dirs):
    """Position scheme, rotary layout, attention grouping, block layout and MLP kind of
    thirteen architectures, each with where it was read (``sources``) and in the manifest's
    JSON; the key heads agree with the saved key projection."""
    assert set(EXPECTED) == set(dirs)
    for name, d in dirs.items():
        a = read_architecture(d)
        got = (a.positions, a.rotary_fraction, a.rotary_interleaved, a.attention, a.parallel_blocks, a.mlp_kind,
               a.position_offset)
        assert got == EXPECTED[name], (name, got, dict(a.sources))
        assert {"positions", "n_kv_heads", "mlp_kind", "parallel_blocks"} <= set(a.sources), name
        assert a.to_dict()["attention"] == a.attention and type(a).from_dict(a.to_dict()) == a
    assert read_architecture(dirs["gemma2"]).score_softcap == 50.0
    assert read_architecture(dirs["gptj"]).sources["rotary_interleaved"].endswith("rotate_every_two")
    assert read_architecture(dirs["opt"]).sources["positions"].startswith("weights: position table")


def test_weights_decide_where_the_config_is_silent_or_wrong(dirs):
    """No model-type list: a GPT-2 directory whose config names an unknown model type is still
    learned (its position table), with its offset; Falcon's config says ``num_kv_heads: 4``
    beside ``multi_query``: the fused projection's width says one key head."""
    cfg = json.loads((dirs["gpt2"] / "config.json").read_text())
    shapes = _shapes(dirs["gpt2"])
    a = architecture({**cfg, "model_type": "renamed_gpt"}, "m", shapes)
    assert (a.positions, a.context, a.n_kv_heads, a.mlp_kind) == ("learned", tiny_archs.N_CTX, 4, "plain")
    wide = {**shapes, "transformer.wpe.weight": (tiny_archs.N_CTX + 3, 32)}
    assert architecture({**cfg, "model_type": "renamed_gpt"}, "m", wide).position_offset == 3
    falcon = json.loads((dirs["falcon"] / "config.json").read_text())
    assert falcon["num_kv_heads"] == 4 and falcon["multi_query"]
    assert read_architecture(dirs["falcon"]).n_kv_heads == 1
    # a rotary config of a type transformers has no code for: rotary, pair order not told, so
    # the raw scores (which rotate halves) are not measurable with that reason
    rope = architecture({"model_type": "my_rope", "hidden_size": 32, "num_hidden_layers": 2,
                         "num_attention_heads": 4, "rope_theta": 10000.0, "max_position_embeddings": 32})
    assert (rope.positions, rope.rotary_interleaved) == ("rotary", None)
    assert "rotary pair order that cannot be told" in not_applicable(rope)["attention_statistics"]


def test_structure_decides_applicability(dirs):
    """Raw scores and kernels run where the score function computes the model's scores
    (learned, rotary halves, ALiBi, soft-capped; grouped and multi-query keys repeated); GPT-J's
    interleaved pairs are computed where the posmech engine runs them (GPT-J) and named
    elsewhere, and Gemma 2's soft-capped scores for the kernels only."""
    for name in ("phi", "falcon", "qwen2", "gpt_bigcode", "gptj"):  # Gemma 2: its raw scores, not its kernels
        skipped = not_applicable(read_architecture(dirs[name]))
        assert "attention_statistics" not in skipped and "positional_kernels" not in skipped, name
    # GPT-J on the engine: the L rules' token-only input and its layer 0 too; only the W_pos rules are skipped
    assert all("W_pos" in why for why in not_applicable(read_architecture(dirs["gptj"])).values())
    # the same interleaved pairs in a model type the engine does not run: named, before any job
    cfg = json.loads((dirs["gptj"] / "config.json").read_text())
    other = architecture({**cfg, "model_type": "my_gptj", "rotary_interleaved": True}, "m", _shapes(dirs["gptj"]))
    assert other.rotary_interleaved is True
    assert "interleaved rotary pairs" in not_applicable(other)["positional_kernels"]
    gemma = not_applicable(read_architecture(dirs["gemma2"]))
    assert "attention_statistics" not in gemma and "soft-capped at 50" in gemma["positional_kernels"]


def test_soft_capped_scores():
    """Gemma 2's scores: c·tanh(q·k/(scale·c)) (the bridge's hook_attn_scores, to 5e-7, on the
    tiny Gemma 2 of tests/tiny_archs.py; the end-to-end check: tests/workflow/test_ten_architectures.py)."""
    import torch

    from posmech.models.scores import ScoreFunction

    q, k = torch.randn(1, 5, 2, 4, dtype=torch.float64), torch.randn(1, 5, 2, 4, dtype=torch.float64)
    plain = ScoreFunction("learned", 2.0).full(q, k)
    capped = ScoreFunction("learned", 2.0, softcap=0.5).full(q, k)
    assert torch.allclose(capped, 0.5 * torch.tanh(plain / 0.5)) and capped.abs().max() < 0.5 < plain.abs().max()


def test_key_head_of_grouped_and_multi_query_keys():
    import torch

    from posmech.models.scores import key_head

    k = torch.arange(2 * 3 * 2 * 1, dtype=torch.float32).reshape(2, 3, 2, 1)  # 2 key heads
    assert torch.equal(key_head(k, 3, 4), k[:, :, 1]) and torch.equal(key_head(k, 1, 4), k[:, :, 0])
    one = k[:, :, :1]  # multi-query
    assert all(torch.equal(key_head(one, h, 4), one[:, :, 0]) for h in range(4))
    with pytest.raises(PosmechError, match="evenly"):
        key_head(torch.zeros(1, 1, 3, 1), 0, 4)


def test_manifest_records_the_architecture(dirs, tmp_path):
    m = prepare_local_model("llama", {"source": str(dirs["llama"])}, tmp_path)
    on_disk = json.loads((tmp_path / "manifest.json").read_text())
    assert m["architecture"] == on_disk["architecture"] == read_architecture(dirs["llama"]).to_dict()
    assert on_disk["architecture"]["n_kv_heads"] == 2


def _ci_config_with(name, source):
    cfg = yaml.safe_load((REPO / "config" / "ci.yaml").read_text())
    cfg["models"][name] = {"source": str(source), "device": "cpu"}
    validate_config(cfg, SCHEMA)
    return cfg


def test_missing_context_is_a_preflight_error(dirs):
    cfg = _ci_config_with("bloom", dirs["bloom"])
    with pytest.raises(PosmechError) as err:
        preflight(cfg, SCHEMA, REPO)
    assert "`models.bloom.n_ctx`" in str(err.value) and "before any job" in str(err.value)
    cfg["models"]["bloom"]["n_ctx"] = 32
    preflight(cfg, SCHEMA, REPO)


def test_neox_in_compatibility_mode_is_a_preflight_error(dirs):
    cfg = _ci_config_with("neox", dirs["neox"])
    with pytest.raises(PosmechError) as err:
        preflight(cfg, SCHEMA, REPO)
    assert "`models.neox.processing`" in str(err.value) and "processing: raw" in str(err.value)
    cfg["models"]["neox"]["processing"] = "raw"
    preflight(cfg, SCHEMA, REPO)


def test_applicability_by_scheme(dirs):
    arch = {n: read_architecture(d) for n, d in dirs.items()}
    assert check_table() == []
    rotary = not_applicable(arch["neox"])
    # raw scores (rotated q/k, ALiBi bias) and kernels are defined on rotary and ALiBi models
    for rule in ("attention_statistics", "diagonal_taxonomy", "score_anatomy", "positional_kernels", "etc_table"):
        assert rule not in rotary and rule not in not_applicable(arch["bloom"]) and rule not in not_applicable(
            arch["llama"])
    assert rotary["posembed_averaging"] == "no learned W_pos: rotary positions"
    assert rotary["positional_pca"].startswith("no learned W_pos: rotary positions (it needs rule extended")
    assert not_applicable(arch["bloom"])["posembed_averaging"] == "no learned W_pos: ALiBi positions"
    opt = not_applicable(arch["opt"])
    assert "positional_kernels" not in opt and "extended_positional_embeddings" not in opt
    assert "attention_statistics" not in opt and "score_anatomy" not in opt  # the engine's scores are OPT's
    # OPT's layer 0 is read through the engine's converter (W_pos from row 2): K6-K10, C1-C3 run
    # the rotary frequencies (P17, P18) are the one thing a learned-position model lacks
    learned_only = {"rotary_frequencies": "no rotary frequencies: learned absolute positions"}
    assert opt == learned_only
    # GPT-BigCode's layer 0 (multi-query: one key head) is read through the engine's converter too
    bc_cfg = {"model_type": "gpt_bigcode", "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 32}
    assert not_applicable(with_engine_refusal(architecture(bc_cfg), bc_cfg)) == learned_only
    # one the engine refuses (no scale_attn_weights) is not measurable with the engine's own reason
    odd = {**bc_cfg, "scale_attn_weights": False}
    why = not_applicable(with_engine_refusal(architecture(odd), odd))
    assert set(why) == {*learned_only, *LAYER0_RULES}, sorted(why)
    assert "the posmech engine does not run it (GPT-BigCode without scale_attn_weights" in why["contextual_neurons"]
    assert not_applicable(arch["gpt_neo"]) == learned_only  # C1-C3 read GPT-Neo's layer 0 too
    gpt2 = train_architecture({"architecture": "gpt2"})
    assert not_applicable(gpt2) == learned_only and not_applicable(None) == {}
    # every table rule either runs on GPT-2 or not: the table decides every rule it names
    assert all(why_not(r, gpt2) is None for r in RULES if r not in learned_only)


def test_every_family_runs_on_a_model_all_or_not_at_all(dirs):
    """A family's analyses share one job (docs/workflow.md, "Families"): on every architecture
    they are all applicable or none is; every family analysis is in the table once."""
    archs = [read_architecture(d) for d in dirs.values()] + [
        train_architecture({"architecture": a}) for a in ("gpt2", "attn_only", "llama")] + [
        architecture({"model_type": "gpt_bigcode", "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 32}), None]
    for arch in archs:
        assert family_problems(arch) == [], arch
    named = [a for analyses in FAMILIES.values() for a in analyses]
    assert len(named) == len(set(named)) and set(named) <= set(RULES)
    # a family split by its requirements is named with the analysis that cannot run
    split = {**RULES, "layer1_patterns": Needs(("mlp",))}
    attn = train_architecture({"architecture": "attn_only"})
    assert family_problems(attn, rules=split) == [
        "family contextual: " + "; ".join(f"{a}: applicable" for a in FAMILIES["contextual"][:-1])
        + f"; layer1_patterns: {why_not('layer1_patterns', attn, split)}"]


def test_one_entry_makes_a_rule_applicable(dirs):
    """Dropping a requirement from a rule's entry lets it (and what reads it) run."""
    arch = read_architecture(dirs["neox"])
    assert why_not("posembed_attention", arch) is not None
    table = {**RULES, "posembed_averaging": Needs(), "posembed_attention": Needs(after=("diagonal_taxonomy",))}
    assert why_not("posembed_averaging", arch, table) is None
    assert why_not("posembed_attention", arch, table) is None
    assert why_not("extended_averaging", arch, table) is not None  # its W_pos requirement (via its inputs) stays
    req = Requirement("needs ALiBi ({positions})", schemes=("alibi",))
    assert req.why_not(arch) == "needs ALiBi (rotary positions)"


def test_finding_of_an_inapplicable_rule():
    f = Finding(claim="K1", finding="f", rule="etc_table", quantity="q", predicate=">=", threshold="t",
                not_measurable="no learned W_pos")
    v = judge(f, "neox", {"t": 1.0}, None, False, "no learned W_pos: rotary positions")
    assert v.verdict == "not measurable" and v.reason.endswith("no learned W_pos: rotary positions")
    assert "config section" in judge(f, "neox", {"t": 1.0}, None, False).reason


def test_every_findings_rule_is_in_the_table():
    """Every rule a finding reads has an applicability entry (adding an analysis adds one)."""
    from posmech.verdicts.findings import load_findings

    rules = {f.rule for f in load_findings(REPO / "resources" / "findings.yaml")}
    assert rules - set(RULES) == set()


@pytest.mark.float32
def test_opt_through_the_bridge_honours_its_offset_and_scale(dirs):
    """What OPT's applicable rules rely on: the bridge's W_pos is OPT's position table from
    row ``position_offset`` on, and softmax(q·k·attn_scale) with the causal mask is OPT's own
    attention pattern (Hugging Face, eager)."""
    import torch

    from posmech.models.loading import load_bridge, load_hf

    a = read_architecture(dirs["opt"])
    man = {"hf_dir": str(dirs["opt"]), "name": "opt"}
    bridge = load_bridge(man, "cpu", processing="raw")
    hf, _ = load_hf(man)
    table = hf.model.decoder.embed_positions.weight
    assert tuple(bridge.W_pos.shape) == (a.context, a.d_model)
    assert torch.allclose(bridge.W_pos, table[a.position_offset:a.position_offset + a.context], atol=1e-6)
    assert not torch.allclose(bridge.W_pos, table[:a.context], atol=1e-3)
    x = torch.randint(1, tiny_archs.V, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        _, cache = bridge.run_with_cache(x)
        ref = hf(x, output_attentions=True).attentions
    mask = torch.triu(torch.ones(12, 12, dtype=torch.bool), 1)
    for layer in range(a.n_layers):
        q, k = cache[f"blocks.{layer}.attn.hook_q"][0], cache[f"blocks.{layer}.attn.hook_k"][0]
        scores = torch.einsum("qhd,khd->hqk", q, k) * a.attn_scale
        pattern = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
        assert torch.allclose(pattern, ref[layer][0], atol=1e-5)


def test_what_only_the_engine_runs_asks_the_engine_not_the_model_type(dirs):
    """The token-only input of a rotary or ALiBi model and its layer-0 decomposition need
    posmech's engine: they are scheduled by what the engine runs (Architecture.engine_refusal,
    posmech.models.lens.unsupported_hf of the config, filled in where the schedule and the
    manifest read a config), so a Falcon of the 40B layout (new decoder architecture) or a Phi
    with qk_layernorm, types the engine runs in other layouts, is not measurable there before
    any job, with the engine's reason; the 7B layout and a plain Phi run them."""
    from posmech.models.loading import manifest_architecture
    from posmech.pipeline.preflight import known_architecture

    falcon = json.loads((dirs["falcon"] / "config.json").read_text())
    found, _ = known_architecture("falcon", {"source": str(dirs["falcon"])})
    assert found.engine_refusal is None and manifest_architecture(dirs["falcon"], "falcon")["engine_refusal"] is None
    runs = not_applicable(found)
    assert "random_token_patterns" not in runs and "layer0_decomposition" not in runs
    wide_cfg = {**falcon, "new_decoder_architecture": True, "num_kv_heads": 2}
    wide = with_engine_refusal(architecture(wide_cfg), wide_cfg)
    assert wide.engine_refusal and "new_decoder_architecture" in wide.engine_refusal
    skipped = not_applicable(wide)
    for rule in ("random_token_patterns", "layer0_decomposition"):
        assert "the posmech engine does not run it (Falcon with new_decoder_architecture" in skipped[rule], rule
    phi = json.loads((dirs["phi"] / "config.json").read_text())
    qk = {**phi, "qk_layernorm": True}
    assert "qk_layernorm" in not_applicable(with_engine_refusal(architecture(qk), qk))["random_token_patterns"]
    assert "random_token_patterns" not in not_applicable(with_engine_refusal(architecture(phi), phi))
    # no list of model types: a type nobody named is in or out as the engine decides
    from dataclasses import replace

    unnamed = replace(found, model_type="a_type_nobody_listed")
    assert not set(not_applicable(unnamed)) & {"random_token_patterns", *LAYER0_RULES}
    refused = not_applicable(replace(unnamed, engine_refusal="model_type 'a_type_nobody_listed'"))
    for rule in ("random_token_patterns", "input_decomposition", *LAYER0_RULES):
        assert "the posmech engine does not run it (model_type 'a_type_nobody_listed')" in refused[rule], rule
    # a legacy TransformerLens checkpoint (no model_type) is the engine's own
    tl = {"d_model": 32, "n_layers": 2, "n_heads": 4, "d_head": 8, "d_mlp": 0, "n_ctx": 32, "d_vocab": 50,
          "attn_only": True, "positional_embedding_type": "standard"}
    assert with_engine_refusal(architecture(tl), tl).engine_refusal is None
