"""Decode attention in length buckets and the packed (unpadded) prefill keep outputs exact."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

import pytest
import torch
from transformers import PreTrainedTokenizerFast

from reinforge.engine import Engine
from reinforge.engine.model_runner import SlotCacheRunner
from reinforge.inference.contract import SamplingParams

from .conftest import hf_greedy


def _mixed_prompts(tokenizer: PreTrainedTokenizerFast, count: int) -> list[list[int]]:
    """Short and long prompts interleaved, so one decode batch spans a wide range of lengths."""
    out = []
    for i in range(count):
        text = f"What is {i} plus {i * 3 % 11}?" + (" It is 7 plus 5." * 25 if i % 3 == 0 else "")
        out.append([tokenizer.bos_token_id, *tokenizer(text)["input_ids"]])
    return out


def _runner(llama: torch.nn.Module) -> SlotCacheRunner:
    return SlotCacheRunner(llama, max_slots=8, max_seq_len=512)


def test_cpu_bucket_plan_covers_every_slot_and_each_bucket_its_longest(llama: torch.nn.Module) -> None:
    runner = _runner(llama)
    positions = [400, 10, 12, 395, 11, 9, 13, 390]
    plan = runner._buckets(positions)
    assert len(plan) > 1
    assert plan[0][0] == 0 and plan[-1][1] == len(positions)
    assert all(a < b for a, b, _ in plan)
    assert all(prev[1] == nxt[0] for prev, nxt in itertools.pairwise(plan))
    for a, b, span in plan:
        assert span == max(positions[a:b]) + 1
    read = sum((b - a) * span for a, b, span in plan)
    assert read < len(positions) * (max(positions) + 1)


def test_cpu_bucket_plan_moves_with_a_decode_step_and_skips_small_gains(llama: torch.nn.Module) -> None:
    runner = _runner(llama)
    plan = runner._buckets([400, 10, 12, 395])
    stepped = runner._buckets([401, 11, 13, 396])  # every sequence one token longer: same cuts
    assert stepped == [(a, b, span + 1) for a, b, span in plan]
    assert runner._buckets([100, 99, 98, 101]) == [(0, 4, 102)]  # a second call would cost more


@pytest.mark.parametrize("arch", ["llama", "qwen"])
async def test_cpu_mixed_lengths_equal_hf_and_full_recompute(
    arch: str,
    request: pytest.FixtureRequest,
    tokenizer: PreTrainedTokenizerFast,
    make_engine: Callable[..., Engine],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = request.getfixturevalue(arch)
    engine = make_engine(model, tokenizer, max_batch_size=16)
    runner = engine._runner
    assert isinstance(runner, SlotCacheRunner)
    most_buckets = 0
    plan_of = runner._buckets

    def recording(positions: list[int]) -> list[tuple[int, int, int]]:
        nonlocal most_buckets
        plan = plan_of(positions)
        most_buckets = max(most_buckets, len(plan))
        return plan

    monkeypatch.setattr(runner, "_buckets", recording)
    batch = _mixed_prompts(tokenizer, 12)
    budgets = [4 + (i * 5) % 17 for i in range(len(batch))]
    params = [
        SamplingParams(temperature=0.0 if i % 2 else 1.0, max_tokens=n, seed=i) for i, n in enumerate(budgets)
    ]
    outs = await asyncio.gather(*(engine.generate(p, s) for p, s in zip(batch, params, strict=True)))
    assert most_buckets > 1, "the batch should have been split into length buckets"
    for prompt, s, budget, out in zip(batch, params, budgets, outs, strict=True):
        if s.temperature == 0:
            assert out.token_ids == hf_greedy(model, prompt, budget, tokenizer.eos_token_id)
        ids = torch.tensor([prompt + out.token_ids])
        with torch.no_grad():
            logprobs = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
        positions = torch.arange(len(prompt) - 1, len(prompt) - 1 + len(out.token_ids))
        expected = logprobs[positions, torch.tensor(out.token_ids)]
        assert torch.allclose(torch.tensor(out.logprobs), expected, atol=1e-4, rtol=0)
