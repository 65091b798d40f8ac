"""Prompts that start with tokens a running sequence has cached copy that KV instead of recomputing
it; the outputs stay exactly those of a full prefill."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import torch
from transformers import PreTrainedTokenizerFast

from inference.reference_sampling import processed_logprobs
from reinforge.engine import Engine, EngineDelta, EngineOutput
from reinforge.inference.contract import SamplingParams

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
        logprobs = processed_logprobs(llama(ids).logits[0], follow_params.temperature)
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


async def test_cpu_tasks_sharing_a_template_compute_only_their_own_tokens(
    llama: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, make_engine: Callable[..., Engine]
) -> None:
    """A training step's batch: several tasks behind one chat template and tools, each asked by a
    group of identical prompts, all arriving at once. The template is computed once, each task's
    own tokens once, and each other member of a group only its last token; outputs stay exact."""
    template = _long_prompt(tokenizer, "You are a calculator agent. Call the tool, then answer.")
    questions = [f" Question {q}: what is {q} times {q + 3}?" for q in (2, 5, 7)]
    tasks = [template + tokenizer(q)["input_ids"] for q in questions]
    group = 4
    greedy = SamplingParams(temperature=0, max_tokens=5)
    engine = make_engine(llama, tokenizer, max_batch_size=16)
    outs = await asyncio.gather(*(engine.generate(t, greedy) for t in tasks for _ in range(group)))
    for i, task in enumerate(tasks):
        expected = hf_greedy(llama, task, 5, tokenizer.eos_token_id)
        assert all(out.token_ids == expected for out in outs[i * group : (i + 1) * group])
    shared_template = len(template)  # at least: the questions differ right after it
    cached = engine.stats()["prefix_cached_tokens"]
    # First task in full; the other tasks copy the template; every other group member copies all but
    # its last token.
    assert cached >= (len(tasks) - 1) * shared_template + sum((group - 1) * (len(t) - 1) for t in tasks)


def test_cpu_moving_many_slots_reads_every_source_before_writing(
    llama: torch.nn.Module,
) -> None:
    """Repacking slots after several sequences end moves caches along a chain (4 -> 3, then the
    sequence now at 3 -> 1); done in one copy, each destination gets its source's original cache."""
    from reinforge.engine.model_runner import SlotCacheRunner, _copy_ranges

    runner = SlotCacheRunner(llama, max_slots=8, max_seq_len=64)
    runner.prefill(0, [[5 + i] * 6 for i in range(5)])
    before = runner._k.clone()
    runner.move_many([(4, 1, 6), (2, 0, 6)])  # slot 1 takes slot 4's cache, slot 0 takes slot 2's
    runner.move_many([(3, 2, 6), (2, 4, 6)])  # a destination that is also another move's source
    # The copies are deferred where they can be (engine.deferred_copies); made now, each slot holds
    # what it was given.
    assert len(runner._deferred) > 0
    with torch.inference_mode():
        _copy_ranges(runner._k, runner._v, runner._deferred.before_reads(range(runner.slot_capacity()), 0))
    assert torch.equal(runner._k[:, 1, :, :6], before[:, 4, :, :6])
    assert torch.equal(runner._k[:, 0, :, :6], before[:, 2, :, :6])
    assert torch.equal(runner._k[:, 2, :, :6], before[:, 3, :, :6])
    assert torch.equal(runner._k[:, 4, :, :6], before[:, 2, :, :6])


def test_cpu_padded_prefill_attention_equals_one_call_per_prompt(llama: torch.nn.Module) -> None:
    """Prompts of different lengths, some behind a cached prefix: one padded attention call gives the
    logits a call per prompt gives."""
    from reinforge.engine import model_runner as runner_module
    from reinforge.engine.model_runner import SlotCacheRunner

    prompts_ = [[3, 4, 5, 6, 7, 8, 9], [3, 4, 5, 6, 11], [3, 4, 5, 6, 12, 13, 14, 15, 16], [20, 21]]
    results = []
    for cheap in (True, False):
        runner = SlotCacheRunner(llama, max_slots=8, max_seq_len=64)
        original = runner_module._pads_cheaply
        runner_module._pads_cheaply = lambda starts, lens, cheap=cheap: cheap  # type: ignore[assignment]
        try:
            first = runner.prefill(0, prompts_[:1])
            runner.move_many([(0, 1, 4), (0, 2, 4)])
            rest = runner.prefill(1, prompts_[1:], [4, 4, 0])
        finally:
            runner_module._pads_cheaply = original
        results.append(torch.cat([first, rest]))
    assert torch.allclose(results[0], results[1], atol=1e-5, rtol=0)
