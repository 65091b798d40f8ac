"""Tiny Llama- and Qwen2-style causal LMs, built from a config and a seed (no downloads).

The sizes default to the small model that learns the calculator task on a CPU; hidden 256 / 6 layers
gives the larger model the benchmarks use (docs/engine.md gives their sizes).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from reinforge.errors import InvalidRequestError


def _config(
    tokenizer: PreTrainedTokenizerBase,
    *,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    intermediate_size: int = 512,
    num_kv_heads: int | None = None,
    max_position_embeddings: int = 2048,
) -> dict[str, Any]:
    """The config fields both families share, sized to `tokenizer`, with tied embeddings; the one
    place the tiny models' sizes and their defaults are declared."""
    if hidden_size % num_heads:
        raise InvalidRequestError(f"hidden_size={hidden_size} must be divisible by num_heads={num_heads}")
    kv_heads = num_kv_heads or num_heads
    if num_heads % kv_heads:
        raise InvalidRequestError(f"num_heads={num_heads} must be divisible by num_kv_heads={kv_heads}")
    return {
        "vocab_size": len(tokenizer),
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": kv_heads,
        "max_position_embeddings": max_position_embeddings,
        "tie_word_embeddings": True,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }


def _seeded(build: type[torch.nn.Module], config: object, seed: int) -> torch.nn.Module:
    # fork_rng: building a model must not move the caller's global RNG.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build(config)
    model.eval()
    return model


def tiny_llama(tokenizer: PreTrainedTokenizerBase, *, seed: int = 0, **sizes: Any) -> LlamaForCausalLM:
    """A randomly initialised Llama with tied embeddings sized to `tokenizer`; `sizes` are the
    keywords of `_config` (hidden_size, num_layers, num_heads, intermediate_size, num_kv_heads,
    max_position_embeddings)."""
    model = _seeded(LlamaForCausalLM, LlamaConfig(**_config(tokenizer, **sizes)), seed)
    assert isinstance(model, LlamaForCausalLM)
    return model


def tiny_qwen2(tokenizer: PreTrainedTokenizerBase, *, seed: int = 0, **sizes: Any) -> Qwen2ForCausalLM:
    """A randomly initialised Qwen2 (biased q/k/v projections), sized as `tiny_llama` is."""
    model = _seeded(Qwen2ForCausalLM, Qwen2Config(**_config(tokenizer, **sizes)), seed)
    assert isinstance(model, Qwen2ForCausalLM)
    return model
