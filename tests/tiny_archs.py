"""Random-init tiny causal LMs of the common Hugging Face architectures, saved locally.

Each builder makes a model from a ``transformers`` config (no Hub), with the character
tokenizer the hand-built models use (``posmech.models.handbuilt.char_tokenizer``: id 0 is
``<|endoftext|>``, then the printable ASCII characters, so the KJV corpus tokenizes), and
saves both with ``save_pretrained`` (safetensors) into a directory a config's
``models.<m>.source`` can point at. Sizes: 2 layers, d_model 32, 4 heads, a context of
:data:`N_CTX` positions (BLOOM records none: ALiBi has no length limit).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

V = 96  # ids 0 (BOS) and the 95 printable ASCII characters
N_CTX = 32
COMMON = {"vocab_size": V, "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0}


def _save(model: Any, d: Path, seed: int) -> Path:
    import torch

    from posmech.models.handbuilt import char_tokenizer

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
    d.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    char_tokenizer(V).save_pretrained(d)
    return d


#: ``name: (config class, model class, seed, what it is, config keys)``: every builder's model
#: (``COMMON`` added to each config)
ARCHS: dict[str, tuple[str, str, int, str, dict[str, Any]]] = {
    "neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", 0,
             "GPT-NeoX (Pythia's layout): rotary on half of each head's dimensions (rotary_pct), parallel blocks",
             dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                  max_position_embeddings=N_CTX, rotary_pct=0.5)),
    "llama": ("LlamaConfig", "LlamaForCausalLM", 1,
              "Llama: rotary on every dimension, grouped-query attention (4 query, 2 key heads), gated MLP",
              dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                   intermediate_size=64, max_position_embeddings=N_CTX)),
    "bloom": ("BloomConfig", "BloomForCausalLM", 2, "BLOOM: ALiBi positions, no context length in its config",
              dict(hidden_size=32, n_layer=2, n_head=4)),
    "opt": ("OPTConfig", "OPTForCausalLM", 3, "OPT: learned absolute positions stored with an offset of 2 rows",
            dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=64,
                 max_position_embeddings=N_CTX, word_embed_proj_dim=32)),
    "gpt_neo": ("GPTNeoConfig", "GPTNeoForCausalLM", 4,
                "GPT-Neo: learned absolute positions, unscaled attention, a local layer",
                dict(hidden_size=32, num_layers=2, num_heads=4, max_position_embeddings=N_CTX,
                     attention_types=[[["global", "local"], 1]], window_size=8)),
    "gpt2_one_layer": ("GPT2Config", "GPT2LMHeadModel", 5,
                       "GPT-2 with a single layer: no layer >= 1 for a head to read layer 0's output",
                       dict(n_embd=32, n_layer=1, n_head=4, n_positions=N_CTX)),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", 6, "GPT-2: learned absolute positions (wpe), Conv1D weights",
             dict(n_embd=32, n_layer=2, n_head=4, n_positions=N_CTX)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", 7,
              "Qwen2: rotary, q/k/v biases, grouped-query attention, a gated MLP",
              dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                   intermediate_size=64, max_position_embeddings=N_CTX)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", 8,
               "Gemma 2: rotary, grouped-query, GeGLU MLP, query_pre_attn_scalar, soft-capped scores, a sliding layer",
               dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                    intermediate_size=64, max_position_embeddings=N_CTX, query_pre_attn_scalar=8,
                    sliding_window=16)),
    "phi": ("PhiConfig", "PhiForCausalLM", 9, "Phi (1/1.5/2): partial rotary, parallel attention and MLP blocks",
            dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                 max_position_embeddings=N_CTX, partial_rotary_factor=0.5)),
    "gptj": ("GPTJConfig", "GPTJForCausalLM", 10, "GPT-J: interleaved partial rotary (rotary_dim), parallel blocks",
             dict(n_embd=32, n_layer=2, n_head=4, n_positions=N_CTX, rotary_dim=4, n_inner=64)),
    "falcon": ("FalconConfig", "FalconForCausalLM", 11,
               "Falcon (7B's layout): rotary, multi-query attention (one key/value head), parallel blocks",
               dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, multi_query=True,
                    new_decoder_architecture=False, parallel_attn=True, alibi=False,
                    max_position_embeddings=N_CTX)),
    "gpt_bigcode": ("GPTBigCodeConfig", "GPTBigCodeForCausalLM", 12,
                    "GPT-BigCode (StarCoder's layout): learned absolute positions, multi-query attention",
                    dict(n_embd=32, n_layer=2, n_head=4, n_positions=N_CTX, multi_query=True)),
    "mpt": ("MptConfig", "MptForCausalLM", 14,
            "MPT: ALiBi positions (MPT's slopes, BLOOM's for 4 heads), fused Wqkv, bias-free LayerNorms",
            dict(d_model=32, n_layers=2, n_heads=4, expansion_ratio=2, max_seq_len=N_CTX)),
}


def build(name: str, d: Path, seed: int | None = None) -> Path:
    """Model ``name`` of :data:`ARCHS` (random weights of ``seed``, else its own) saved in ``d``."""
    import transformers

    config, model, own_seed, _, keys = ARCHS[name]
    made = getattr(transformers, model)(getattr(transformers, config)(**keys, **COMMON))
    return _save(made, d, own_seed if seed is None else seed)


#: ``name: builder(dir, seed=None)``, one per architecture of :data:`ARCHS`
BUILDERS = {name: functools.partial(build, name) for name in ARCHS}
neox, llama, bloom, opt, gpt_neo, gpt2_one_layer, mpt = (BUILDERS[n] for n in ("neox", "llama", "bloom", "opt", "gpt_neo",
                                                                               "gpt2_one_layer", "mpt"))
