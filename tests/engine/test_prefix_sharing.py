"""Prompts that start with tokens a running sequence has cached copy that KV instead of recomputing
it; the outputs stay exactly those of a full prefill."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import torch
from transformers import PreTrainedTokenizerFast

from reinforge.engine import Engine, EngineDelta, EngineOutput
from reinforge.gateway.backend import SamplingParams

from .conftest import hf_greedy, prompts


def _long_prompt(tokenizer: PreTrainedTokenizerFast, text: str) -> list[int]:
    return [tokenizer.bos_token_id, *tokenizer(text)["input_ids"]]


async def test_cpu_a_group_of_identical_prompts_is_prefilled_once(
    qwen: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, make_engine: Callable[..., Engine]
) -> None:
    engine = make_engine(qwen, tokenizer, max_batch_size=16)
    task = _long_prompt(tokenizer, "What is 12 plus 30? Think step by step, then answer. " * 2)
    others = prompts(tokenizer, 3)
    greedy = [SamplingParams(temperature=0, max_tokens=6 + i) for i in range(8)]
    outs = await asyncio.gather(
        *(engine.generate(task, s) for s in greedy), *(engine.generate(p, greedy[0]) for p in others)
    )
    for out, s in zip(outs[:8], greedy, strict=False):
        assert out.token_ids == hf_greedy(qwen, task, s.max_tokens or 0, tokenizer.eos_token_id)
    for out, p in zip(outs[8:], others, strict=True):
        assert out.token_ids == hf_greedy(qwen, p, 6, tokenizer.eos_token_id)
    assert engine.stats()["prefix_cached_tokens"] == 7 * (len(task) - 1)


async def test_cpu_a_conversation_continues_from_a_running_sequence(
    llama: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, make_engine: Callable[..., Engine]
) -> None:
    engine = make_engine(llama, tokenizer)
    first = _long_prompt(tokenizer, "What is 3 plus 4? It is 7. What is 5 plus 6?")
    params = SamplingParams(temperature=0, max_tokens=40)
    reference = hf_greedy(llama, first, 40, tokenizer.eos_token_id)
    assert len(reference) >= 20, "the fixture model should not stop early on this prompt"
    # The next turn: the first call's prompt and part of its answer, then new text.
    follow = first + reference[:12] + tokenizer(" And 8 plus 9?")["input_ids"]
    follow_params = SamplingParams(temperature=0.9, max_tokens=15, seed=4)
    seen = 0
    follow_task: asyncio.Task[EngineOutput] | None = None
    async for item in engine.stream(first, params):
        if isinstance(item, EngineDelta):
            seen += len(item.token_ids)
            if seen >= 14 and follow_task is None:
                follow_task = asyncio.create_task(engine.generate(follow, follow_params))
    assert follow_task is not None
    out = await follow_task
    assert engine.stats()["prefix_cached_tokens"] == len(first) + 12
    # Exactly what a full forward gives: the logprobs match a recompute within float32 noise.
    ids = torch.tensor([follow + out.token_ids])
    with torch.no_grad():
        logprobs = torch.log_softmax(llama(ids).logits[0], dim=-1)
    n = len(out.token_ids)
    expected = logprobs[torch.arange(len(follow) - 1, len(follow) - 1 + n), torch.tensor(out.token_ids)]
    assert torch.allclose(torch.tensor(out.logprobs), expected, atol=1e-4, rtol=0)


async def test_cpu_prefix_sharing_can_be_turned_off(
    llama: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, make_engine: Callable[..., Engine]
) -> None:
    engine = make_engine(llama, tokenizer, prefix_min_tokens=0)
    task = _long_prompt(tokenizer, "What is 12 plus 30? Think step by step, then answer.")
    outs = await asyncio.gather(
        *(engine.generate(task, SamplingParams(temperature=0, max_tokens=5)) for _ in range(3))
    )
    assert len({tuple(o.token_ids) for o in outs}) == 1
    assert engine.stats()["prefix_cached_tokens"] == 0
