"""`Engine.release_cache`: the KV cache's memory goes back once no sequence runs, a running sequence
finishes as if nothing were asked, and later requests are served as by an engine that never freed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import torch
from transformers import PreTrainedTokenizerFast

from reinforge.engine import Engine
from reinforge.inference.contract import SamplingParams

from .conftest import prompts

GREEDY = SamplingParams(temperature=0, max_tokens=24)


async def _until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the engine did not get there in time"
        await asyncio.sleep(0.01)


def _cache_bytes(engine: Engine) -> int:
    runner = engine._runner
    return sum(t.numel() * t.element_size() for t in (runner._k, runner._v))  # type: ignore[attr-defined]


async def test_cpu_an_idle_engine_frees_its_cache_and_serves_the_same_outputs_after(
    llama: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, make_engine: Callable[..., Engine]
) -> None:
    engine = make_engine(llama, tokenizer, max_batch_size=8, max_seq_len=128).start()
    batch = prompts(tokenizer, 6)
    before = await asyncio.gather(*(engine.generate(p, GREEDY) for p in batch))
    assert engine._runner.slot_capacity() >= 6 and _cache_bytes(engine) > 0
    assert engine.stats()["retained_entries"] > 0

    engine.release_cache()
    await _until(lambda: engine._runner.slot_capacity() == 0)
    assert _cache_bytes(engine) == 0
    assert engine.stats()["retained_entries"] == 0  # their slots are gone with the cache

    hits = engine.stats()["prefix_retained_hits"]
    after = await asyncio.gather(*(engine.generate(p, GREEDY) for p in batch))
    assert [o.token_ids for o in after] == [o.token_ids for o in before]
    for a, b in zip(after, before, strict=True):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0)
    assert engine.stats()["prefix_retained_hits"] == hits  # nothing was copied from a freed slot
    assert engine._runner.slot_capacity() >= 6


async def test_cpu_a_release_asked_while_sequences_run_waits_for_them(
    llama: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, make_engine: Callable[..., Engine]
) -> None:
    batch = prompts(tokenizer, 4)
    long = SamplingParams(temperature=0, max_tokens=60)
    reference = make_engine(llama, tokenizer, max_batch_size=8, max_seq_len=128).start()
    expected = await asyncio.gather(*(reference.generate(p, long) for p in batch))

    engine = make_engine(llama, tokenizer, max_batch_size=8, max_seq_len=128).start()
    running = [asyncio.ensure_future(engine.generate(p, long)) for p in batch]
    await _until(lambda: engine.stats()["running"] == len(batch))
    engine.release_cache()
    await asyncio.sleep(0.05)
    if not all(task.done() for task in running):
        assert engine._runner.slot_capacity() > 0  # not while the four decode
    outputs = await asyncio.gather(*running)
    assert [o.token_ids for o in outputs] == [o.token_ids for o in expected]
    await _until(lambda: engine._runner.slot_capacity() == 0)  # then, once they are done
