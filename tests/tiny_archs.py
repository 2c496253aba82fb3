"""Random-init tiny causal LMs of the common Hugging Face architectures, saved locally.

Each builder makes a model from a ``transformers`` config (no Hub), with the character
tokenizer the hand-built models use (``posmech.models.handbuilt.char_tokenizer``: id 0 is
``<|endoftext|>``, then the printable ASCII characters, so the KJV corpus tokenizes), and
saves both with ``save_pretrained`` (safetensors) into a directory a config's
``models.<m>.source`` can point at. Sizes: 2 layers, d_model 32, 4 heads, a context of
:data:`N_CTX` positions (BLOOM records none: ALiBi has no length limit).
"""

from __future__ import annotations

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


def neox(d: Path, seed: int = 0) -> Path:
    """GPT-NeoX (Pythia's layout): rotary on half of each head's dimensions (``rotary_pct``)."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    cfg = GPTNeoXConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                        max_position_embeddings=N_CTX, rotary_pct=0.5, **COMMON)
    return _save(GPTNeoXForCausalLM(cfg), d, seed)


def llama(d: Path, seed: int = 1) -> Path:
    """Llama: rotary on every dimension, grouped-query attention (4 query heads, 2 key/value heads)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=64, max_position_embeddings=N_CTX, **COMMON)
    return _save(LlamaForCausalLM(cfg), d, seed)


def bloom(d: Path, seed: int = 2) -> Path:
    """BLOOM: ALiBi positions, no context length in its config."""
    from transformers import BloomConfig, BloomForCausalLM

    cfg = BloomConfig(hidden_size=32, n_layer=2, n_head=4, **COMMON)
    return _save(BloomForCausalLM(cfg), d, seed)


def opt(d: Path, seed: int = 3) -> Path:
    """OPT: learned absolute positions stored with an offset of 2 rows."""
    from transformers import OPTConfig, OPTForCausalLM

    cfg = OPTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=64,
                    max_position_embeddings=N_CTX, word_embed_proj_dim=32, **COMMON)
    return _save(OPTForCausalLM(cfg), d, seed)


def gpt_neo(d: Path, seed: int = 4) -> Path:
    """GPT-Neo: learned absolute positions, unscaled attention, a local layer."""
    from transformers import GPTNeoConfig, GPTNeoForCausalLM

    cfg = GPTNeoConfig(hidden_size=32, num_layers=2, num_heads=4, max_position_embeddings=N_CTX,
                       attention_types=[[["global", "local"], 1]], window_size=8, **COMMON)
    return _save(GPTNeoForCausalLM(cfg), d, seed)


def gpt2_one_layer(d: Path, seed: int = 5) -> Path:
    """GPT-2 with a single layer: no layer ≥ 1 for a head to read layer 0's output."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_embd=32, n_layer=1, n_head=4, n_positions=N_CTX, **COMMON)
    return _save(GPT2LMHeadModel(cfg), d, seed)


BUILDERS = {"neox": neox, "llama": llama, "bloom": bloom, "opt": opt, "gpt_neo": gpt_neo,
            "gpt2_one_layer": gpt2_one_layer}
