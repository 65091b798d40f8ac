"""The engine's outputs equal Hugging Face's: greedy tokens and chosen-token logprobs (float32, CPU)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import pytest
import torch
from transformers import PreTrainedTokenizerFast

from inference.reference_sampling import processed_logprobs
from reinforge.engine import Engine
from reinforge.inference.contract import SamplingParams

from .conftest import hf_greedy, prompts

GREEDY = SamplingParams(temperature=0.0, max_tokens=24)


@pytest.mark.parametrize("arch", ["llama", "qwen"])
@pytest.mark.parametrize(("max_batch_size", "stagger"), [(1, False), (3, True), (16, False), (16, True)])
async def test_cpu_greedy_equals_hf_generate(
    arch: str,
    max_batch_size: int,
    stagger: bool,
    request: pytest.FixtureRequest,
    tokenizer: PreTrainedTokenizerFast,
    make_engine: Callable[..., Engine],
) -> None:
    model = request.getfixturevalue(arch)
    engine = make_engine(model, tokenizer, max_batch_size=max_batch_size)
    assert engine.uses_fast_path
    batch = prompts(tokenizer, 10)
    rng = random.Random(0)
    lengths = [rng.randint(1, 24) for _ in batch]

    async def one(i: int) -> list[int]:
        if stagger:  # requests join a batch that is already decoding
            await asyncio.sleep(0.003 * i)
        out = await engine.generate(batch[i], GREEDY.model_copy(update={"max_tokens": lengths[i]}))
        return out.token_ids

    got = await asyncio.gather(*(one(i) for i in range(len(batch))))
    for i, p in enumerate(batch):
        assert got[i] == hf_greedy(model, p, lengths[i], tokenizer.eos_token_id), f"prompt {i}"


@pytest.mark.parametrize("arch", ["llama", "qwen"])
async def test_cpu_logprobs_equal_full_forward_recompute(
    arch: str,
    request: pytest.FixtureRequest,
    tokenizer: PreTrainedTokenizerFast,
    make_engine: Callable[..., Engine],
) -> None:
    model = request.getfixturevalue(arch)
    engine = make_engine(model, tokenizer, max_batch_size=8)
    batch = prompts(tokenizer, 12)
    params = [
        SamplingParams(temperature=t, top_p=p, top_k=k, max_tokens=20, seed=i)
        for i, (t, p, k) in enumerate(
            [(1.0, 1.0, 0), (0.7, 0.9, 0), (1.3, 1.0, 5), (0.0, 1.0, 0), (0.5, 0.8, 20), (1.5, 0.95, 0)] * 2
        )
    ]
    outs = await asyncio.gather(*(engine.generate(p, s) for p, s in zip(batch, params, strict=True)))
    for prompt, out, s in zip(batch, outs, params, strict=True):
        ids = torch.tensor([prompt + out.token_ids])
        with torch.no_grad():
            # The logprob under the distribution sampled from (temperature, top-k, top-p).
            logprobs = processed_logprobs(model(ids).logits[0], s.temperature, s.top_p, s.top_k)
        positions = torch.arange(len(prompt) - 1, len(prompt) - 1 + len(out.token_ids))
        expected = logprobs[positions, torch.tensor(out.token_ids)]
        assert len(out.logprobs) == len(out.token_ids)
        assert torch.allclose(torch.tensor(out.logprobs), expected, atol=1e-4, rtol=0)


async def test_cpu_top_k_one_is_greedy_and_seeds_reproduce(
    llama: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, make_engine: Callable[..., Engine]
) -> None:
    engine = make_engine(llama, tokenizer, max_batch_size=8)
    p = prompts(tokenizer, 3)
    greedy = await engine.generate(p[0], GREEDY)
    top1 = await engine.generate(p[0], SamplingParams(temperature=1.0, top_k=1, max_tokens=24))
    assert top1.token_ids == greedy.token_ids
    seeded = SamplingParams(temperature=1.0, max_tokens=24, seed=42)
    alone = await engine.generate(p[1], seeded)
    # The same seed gives the same sample whatever else shares the batch.
    crowded = await asyncio.gather(
        engine.generate(p[1], seeded), *(engine.generate(q, SamplingParams(max_tokens=24)) for q in p)
    )
    assert crowded[0].token_ids == alone.token_ids
    other = await engine.generate(p[1], seeded.model_copy(update={"seed": 43}))
    assert other.token_ids != alone.token_ids
