"""Queueing, caps, cancellation, streaming, stop conditions and input validation."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
import torch
from transformers import PreTrainedTokenizerFast

from reinforge.engine import Engine, EngineDelta, EngineError, EngineOutput, EngineStoppedError
from reinforge.errors import InvalidRequestError, PromptTooLongError
from reinforge.inference.contract import SamplingParams

from .conftest import prompts

GREEDY = SamplingParams(temperature=0.0, max_tokens=24)


async def _wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


async def test_cpu_requests_beyond_the_slot_cap_queue_and_all_finish(
    llama: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, make_engine: Callable[..., Engine]
) -> None:
    engine = make_engine(llama, tokenizer, max_batch_size=2)
    batch = prompts(tokenizer, 7)
    outs = await asyncio.gather(*(engine.generate(p, GREEDY) for p in batch))
    solo = make_engine(llama, tokenizer, max_batch_size=1)
    for p, out in zip(batch, outs, strict=True):
        assert out.token_ids == (await solo.generate(p, GREEDY)).token_ids
    stats = engine.stats()
    assert stats["peak_running"] == 2
    assert (stats["running"], stats["waiting"]) == (0, 0)


async def test_cpu_token_budget_limits_concurrency(
    llama: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, make_engine: Callable[..., Engine]
) -> None:
    # Each request reserves prompt + max_tokens (< 64 tokens); a 100-token budget fits one at a time.
    engine = make_engine(llama, tokenizer, max_batch_size=8, max_seq_len=100, max_num_tokens=100)
    batch = prompts(tokenizer, 4)
    outs = await asyncio.gather(
        *(engine.generate(p, SamplingParams(temperature=0, max_tokens=40)) for p in batch)
    )
    assert all(len(o.token_ids) <= 40 for o in outs)
    assert engine.stats()["peak_running"] == 1


async def test_cpu_cancellation_frees_the_slot(
    endless: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, make_engine: Callable[..., Engine]
) -> None:
    engine = make_engine(endless, tokenizer, max_batch_size=1)
    p = prompts(tokenizer, 2)
    long = SamplingParams(temperature=1.0, max_tokens=10_000, seed=0)
    first = asyncio.create_task(engine.generate(p[0], long))
    await _wait_for(lambda: engine.stats()["running"] == 1)
    second = asyncio.create_task(engine.generate(p[1], GREEDY))
    await _wait_for(lambda: engine.stats()["waiting"] == 1)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    out = await asyncio.wait_for(second, 10)  # it got the freed slot
    assert out.finish_reason in ("stop", "length")
    await _wait_for(lambda: engine.stats()["running"] == 0)


async def test_cpu_cancelling_a_queued_request_removes_it(
    endless: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, make_engine: Callable[..., Engine]
) -> None:
    engine = make_engine(endless, tokenizer, max_batch_size=1)
    p = prompts(tokenizer, 2)
    running = asyncio.create_task(engine.generate(p[0], SamplingParams(max_tokens=10_000, seed=1)))
    await _wait_for(lambda: engine.stats()["running"] == 1)
    queued = asyncio.create_task(engine.generate(p[1], GREEDY))
    await _wait_for(lambda: engine.stats()["waiting"] == 1)
    queued.cancel()
    await _wait_for(lambda: engine.stats()["waiting"] == 0)
    running.cancel()
    await _wait_for(lambda: engine.stats()["running"] == 0)


async def test_cpu_stream_deltas_add_up_to_the_output(
    qwen: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, make_engine: Callable[..., Engine]
) -> None:
    engine = make_engine(qwen, tokenizer)
    p = prompts(tokenizer, 1)[0]
    items = [item async for item in engine.stream(p, SamplingParams(temperature=0.8, max_tokens=30, seed=3))]
    final = items[-1]
    assert isinstance(final, EngineOutput)
    deltas = [i for i in items[:-1] if isinstance(i, EngineDelta)]
    assert len(deltas) == len(items) - 1 >= 2
    assert [t for d in deltas for t in d.token_ids] == final.token_ids
    assert [x for d in deltas for x in d.logprobs] == final.logprobs
    assert "".join(d.text for d in deltas) == final.text
    again = await engine.generate(p, SamplingParams(temperature=0.8, max_tokens=30, seed=3))
    assert again.token_ids == final.token_ids


async def test_cpu_stop_strings_cut_text_and_stop_generation(
    llama: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, make_engine: Callable[..., Engine]
) -> None:
    engine = make_engine(llama, tokenizer)
    # A stop string from a readable stretch (a random model also emits partial UTF-8 bytes).
    for p in prompts(tokenizer, 8):
        base = await engine.generate(p, SamplingParams(temperature=0, max_tokens=40))
        text = base.text
        starts = [i for i in range(8, len(text) - 3) if "\ufffd" not in text[i : i + 3]]
        if starts:
            break
    stop = text[starts[0] : starts[0] + 3]
    cut = text.find(stop)
    out = await engine.generate(p, SamplingParams(temperature=0, max_tokens=40, stop=[stop, "never-there"]))
    assert out.finish_reason == "stop"
    assert out.text == text[:cut]
    # Tokens run up to the one that completed the stop string, and no further.
    assert out.token_ids == base.token_ids[: len(out.token_ids)]
    shorter = tokenizer.decode(out.token_ids[:-1], skip_special_tokens=True)
    assert stop not in shorter
    assert stop in tokenizer.decode(out.token_ids, skip_special_tokens=True)
    # Streaming holds back a possible stop-string prefix, so the deltas equal the cut text.
    streamed = [i async for i in engine.stream(p, SamplingParams(temperature=0, max_tokens=40, stop=[stop]))]
    assert "".join(i.text for i in streamed if isinstance(i, EngineDelta)) == out.text


async def test_cpu_stop_token_ids_and_max_tokens(
    llama: torch.nn.Module,
    endless: torch.nn.Module,
    tokenizer: PreTrainedTokenizerFast,
    make_engine: Callable[..., Engine],
) -> None:
    engine = make_engine(llama, tokenizer, max_seq_len=64)
    long_engine = make_engine(endless, tokenizer, max_seq_len=64)
    p = prompts(tokenizer, 1)[0]
    base = await engine.generate(p, SamplingParams(temperature=0, max_tokens=30))
    stop_id = base.token_ids[6]
    first = base.token_ids.index(stop_id)
    out = await engine.generate(p, SamplingParams(temperature=0, max_tokens=30, stop_token_ids=[stop_id]))
    assert (out.finish_reason, out.token_ids) == ("stop", base.token_ids[: first + 1])
    assert out.text == tokenizer.decode(base.token_ids[:first], skip_special_tokens=True)
    short = await engine.generate(p, SamplingParams(temperature=0, max_tokens=3))
    assert (short.finish_reason, short.token_ids) == ("length", base.token_ids[:3])
    # A budget past the context ends at the context's end with "length".
    huge = await long_engine.generate(p, SamplingParams(temperature=1.0, max_tokens=5000, seed=0))
    assert huge.finish_reason == "length"
    assert len(p) + len(huge.token_ids) == 64
    assert huge.num_prompt_tokens == len(p)


async def test_cpu_bad_requests_are_rejected_with_clear_errors(
    llama: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, make_engine: Callable[..., Engine]
) -> None:
    engine = make_engine(llama, tokenizer, max_seq_len=32)
    with pytest.raises(InvalidRequestError, match="empty"):
        await engine.generate([], GREEDY)
    with pytest.raises(InvalidRequestError, match="outside the vocabulary"):
        await engine.generate([1, 10**6], GREEDY)
    with pytest.raises(PromptTooLongError, match="maximum context length is 32 tokens") as too_long:
        await engine.generate([1] * 40, GREEDY)
    assert (too_long.value.prompt_tokens, too_long.value.limit) == (40, 32)
    with pytest.raises(InvalidRequestError, match="max_num_tokens"):
        Engine(llama, tokenizer, max_seq_len=64, max_num_tokens=10)
    # The engine still serves after rejecting.
    assert (await engine.generate([1, 2, 3], GREEDY)).token_ids


async def test_cpu_stop_fails_queued_and_running_requests(
    endless: torch.nn.Module, tokenizer: PreTrainedTokenizerFast
) -> None:
    engine = Engine(endless, tokenizer, max_batch_size=1)
    p = prompts(tokenizer, 2)
    tasks = [asyncio.create_task(engine.generate(q, SamplingParams(max_tokens=10_000, seed=0))) for q in p]
    await _wait_for(lambda: engine.stats()["running"] == 1 and engine.stats()["waiting"] == 1)
    await asyncio.to_thread(engine.stop)
    for task in tasks:
        with pytest.raises(EngineStoppedError):
            await task
    with pytest.raises(EngineStoppedError):
        await engine.generate(p[0], GREEDY)


async def test_cpu_a_failing_forward_fails_its_requests_and_serving_goes_on(
    llama: torch.nn.Module,
    tokenizer: PreTrainedTokenizerFast,
    make_engine: Callable[..., Engine],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = make_engine(llama, tokenizer)
    runner = engine._runner
    real_prefill = runner.prefill

    def broken(*args: object, **kwargs: object) -> torch.Tensor:
        raise RuntimeError("out of memory (simulated)")

    # Simulates a device failure such as running out of memory inside a forward.
    monkeypatch.setattr(runner, "prefill", broken)
    batch = prompts(tokenizer, 3)
    results = await asyncio.gather(*(engine.generate(p, GREEDY) for p in batch), return_exceptions=True)
    assert all(isinstance(r, EngineError) and "out of memory" in str(r) for r in results)
    monkeypatch.setattr(runner, "prefill", real_prefill)
    assert (await engine.generate(batch[0], GREEDY)).token_ids
