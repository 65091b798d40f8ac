"""Architectures outside the fast path run through the exact recompute runner."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedTokenizerFast,
)

from reinforge.engine import Engine
from reinforge.inference.contract import SamplingParams

from .conftest import diversify, hf_greedy, prompts


async def test_cpu_gpt2_greedy_equals_hf_generate(
    tokenizer: PreTrainedTokenizerFast, make_engine: Callable[..., Engine]
) -> None:
    with torch.random.fork_rng():
        torch.manual_seed(0)
        config = GPT2Config(vocab_size=len(tokenizer), n_embd=64, n_layer=2, n_head=4, n_positions=256)
        model = diversify(GPT2LMHeadModel(config).eval(), seed=5)
    engine = make_engine(model, tokenizer, max_batch_size=3)
    assert not engine.uses_fast_path
    batch = prompts(tokenizer, 5)
    outs = await asyncio.gather(
        *(engine.generate(p, SamplingParams(temperature=0, max_tokens=12)) for p in batch)
    )
    for p, out in zip(batch, outs, strict=True):
        assert out.token_ids == hf_greedy(model, p, 12, tokenizer.eos_token_id)
        with torch.no_grad():
            logits = model(torch.tensor([p + out.token_ids])).logits[0]
        expected = torch.log_softmax(logits, -1)[
            torch.arange(len(p) - 1, len(p) - 1 + len(out.token_ids)), out.token_ids
        ]
        assert torch.allclose(torch.tensor(out.logprobs), expected, atol=1e-4, rtol=0)


async def test_cpu_mistral_applies_its_sliding_window_on_the_fast_path(
    tokenizer: PreTrainedTokenizerFast, make_engine: Callable[..., Engine]
) -> None:
    config = MistralConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        sliding_window=16,
        max_position_embeddings=1024,
        eos_token_id=tokenizer.eos_token_id,
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = diversify(MistralForCausalLM(config).eval(), seed=6)
    fast = make_engine(model, tokenizer, max_seq_len=512)
    assert fast.uses_fast_path
    batch = prompts(tokenizer, 4)  # up to ~40 tokens, plus 20 generated: well past the 16-token window
    outs = await asyncio.gather(
        *(fast.generate(p, SamplingParams(temperature=0, max_tokens=20)) for p in batch)
    )
    for p, out in zip(batch, outs, strict=True):
        assert out.token_ids == hf_greedy(model, p, 20, tokenizer.eos_token_id)
