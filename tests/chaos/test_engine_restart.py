"""A SIGKILLed engine child is replaced, serving the weights last published; a crash loop is not."""

from __future__ import annotations

import asyncio
import copy
import os
import signal
import time

import pytest
import torch
from transformers import PreTrainedTokenizerFast

from reinforge.engine import EngineProcess, EngineProcessDiedError, EngineRestartPolicy
from reinforge.inference.contract import SamplingParams
from reinforge.models import build_tokenizer, tiny_llama

GREEDY = SamplingParams(temperature=0.0, max_tokens=8)


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return build_tokenizer(
        [f"What is {a} plus {b}? It is {a + b}." for a in range(30) for b in range(20)], 300
    )


def _model(tokenizer: PreTrainedTokenizerFast, seed: int) -> torch.nn.Module:
    model = tiny_llama(tokenizer, hidden_size=32, num_layers=1, intermediate_size=64)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2, generator=gen)
    return model


def _prompt(tokenizer: PreTrainedTokenizerFast) -> list[int]:
    return list(tokenizer("What is 3 plus 4?", add_special_tokens=False)["input_ids"])


async def test_a_killed_engine_child_comes_back_with_the_published_weights(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    first, second = _model(tokenizer, 1), _model(tokenizer, 2)
    engine = EngineProcess(
        copy.deepcopy(first),
        tokenizer,
        max_batch_size=4,
        max_seq_len=2048,
        seed=0,
        restarts=EngineRestartPolicy(backoff_s=0.05, crash_loop_deaths=2, crash_loop_window_s=600),
    ).start()
    try:
        prompt = _prompt(tokenizer)
        before = await engine.generate(prompt, GREEDY)
        await engine.load_weights(second.state_dict(), 1)
        published = await engine.generate(prompt, GREEDY)
        assert published.token_ids != before.token_ids  # the update changed what is served

        # A call decoding when the child dies fails cleanly (HTTP 503 at the gateway: it retries).
        never_ends = SamplingParams(
            temperature=0.0, max_tokens=2000, logit_bias={tokenizer.eos_token_id: -100}
        )
        stream = engine.stream(prompt, never_ends)
        await anext(stream)  # decoding has started
        old = engine.pid
        assert old is not None
        os.kill(old, signal.SIGKILL)
        with pytest.raises(EngineProcessDiedError):
            async for _ in stream:
                pass
        # A call made while the child is being replaced waits for the new one.
        after = await engine.generate(prompt, GREEDY)
        assert engine.pid != old and engine.restarted == 1
        assert after.token_ids == published.token_ids
        assert after.policy_version == 1 and engine.policy_version == 1

        # A second death within the window is a crash loop: the engine stays failed, and says why.
        replacement = engine.pid
        assert replacement is not None
        os.kill(replacement, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while engine.failure is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert isinstance(engine.failure, EngineProcessDiedError)
        assert "died 2 times within 600 s" in str(engine.failure) and engine.restarted == 1
        with pytest.raises(EngineProcessDiedError, match="not restarted again"):
            await engine.generate(prompt, GREEDY)
    finally:
        engine.stop()
