"""One behaviour logprob at every temperature and top-p: what the embedded engine and the vLLM and
SGLang servers record is what the trainer's `Policy` recomputes as π_old, so the first update's
importance ratios exp(π_old - behaviour) are 1 on every trained token (a real tiny Llama on CPU;
the servers are the fakes of `inference.fake_servers`, served over HTTP on 127.0.0.1)."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import pytest

from inference.fake_servers import FakeSglang, FakeVllm
from reinforge.algorithms import GRPO
from reinforge.engine import Engine
from reinforge.engine.engine_backend import EngineBackend
from reinforge.inference.contract import Backend, GenerationRequest, GenerationResult, SamplingParams
from reinforge.inference.upstream import UpstreamBackend
from reinforge.net.background import BackgroundServer
from reinforge.training.config import OptimSettings
from reinforge.training.policy import Policy
from reinforge.types import Transition

from .conftest import small_model

SETTINGS = [(t, p) for t in (0.3, 0.7, 1.0, 1.5) for p in (1.0, 0.9)]
QUESTIONS = ("What is 3 + 4?", "What is 12 * 9?")
SAMPLES = 3
"""Calls per question: the policy encodes each shared prompt once (`shared_prefix`)."""

Serving = Callable[[Any, Any], AbstractAsyncContextManager[Backend]]


@asynccontextmanager
async def engine_backend(model: Any, tokenizer: Any) -> AsyncIterator[Backend]:
    engine = Engine(model, tokenizer, max_batch_size=8, seed=0)
    try:
        yield EngineBackend(engine)
    finally:
        engine.stop()


@asynccontextmanager
async def vllm_backend(
    model: Any, tokenizer: Any, mode: str = "processed_logprobs"
) -> AsyncIterator[Backend]:
    fake = FakeVllm(model, tokenizer, token_delay_s=0.0)
    fake.logprobs_mode = mode
    with BackgroundServer(fake.app()) as server:
        backend = UpstreamBackend(server.url, fake.served_model)
        try:
            yield backend
        finally:
            await backend.aclose()


@asynccontextmanager
async def sglang_backend(model: Any, tokenizer: Any) -> AsyncIterator[Backend]:
    fake = FakeSglang(model, tokenizer, token_delay_s=0.0)
    with BackgroundServer(fake.app()) as server:
        backend = UpstreamBackend(server.url, fake.served_model, flavor="sglang", tokenizer=tokenizer)
        try:
            yield backend
        finally:
            await backend.aclose()


BACKENDS: dict[str, Serving] = {"engine": engine_backend, "vllm": vllm_backend, "sglang": sglang_backend}


async def rollouts(backend: Backend, temperature: float, top_p: float) -> list[Transition]:
    """One group per question, every call sampled at (temperature, top_p) with its own seed."""
    out = []
    for q, question in enumerate(QUESTIONS):
        for i in range(SAMPLES):
            sampling = SamplingParams(temperature=temperature, top_p=top_p, max_tokens=10, seed=10 * q + i)
            result: GenerationResult = await backend.generate(
                GenerationRequest(messages=[{"role": "user", "content": question}], sampling=sampling)
            )
            out.append(
                Transition(
                    rollout_id=f"r{q}-{i}",
                    attempt_id=f"a{q}-{i}",
                    group_id=f"g{q}",
                    prompt_ids=result.prompt_token_ids,
                    response_ids=result.completion_token_ids,
                    response_mask=[1] * len(result.completion_token_ids),
                    behaviour_logprobs=result.logprobs,
                    advantage=1.0 if i % 2 else -1.0,
                )
            )
    return out


def first_update(
    model: Any, tokenizer: Any, batch: list[Transition], temperature: float, top_p: float, share: bool = True
) -> dict[str, float]:
    policy = Policy(
        copy.deepcopy(model),
        GRPO(group_size=SAMPLES),
        OptimSettings(learning_rate=1e-3),
        pad_token_id=int(tokenizer.pad_token_id),
        temperature=temperature,
        top_p=top_p,
        share_prompts=share,
    )
    return policy.update(batch)


@pytest.mark.parametrize("kind", list(BACKENDS))
async def test_first_update_ratios_are_one_at_every_temperature_and_top_p(kind: str, tokenizer: Any) -> None:
    model = small_model(tokenizer)
    async with BACKENDS[kind](model, tokenizer) as backend:
        for temperature, top_p in SETTINGS:
            batch = await rollouts(backend, temperature, top_p)
            assert sum(len(t.response_ids) for t in batch) > 2 * len(batch)
            for share in (True, False) if kind == "engine" else (True,):
                metrics = first_update(model, tokenizer, batch, temperature, top_p, share)
                setting = (kind, temperature, top_p, share, metrics)
                # |π_old - behaviour| ≤ 1e-4 on every token: exp of it is 1 within 1e-4.
                assert metrics["policy/behaviour_drift_max"] < 1e-4, setting
                assert metrics["tis/weight_mean"] == pytest.approx(1.0, abs=1e-4), setting
                assert metrics["policy/ratio_max"] == pytest.approx(1.0, abs=1e-4), setting


async def test_raw_logprobs_from_vllm_would_be_off_at_temperature_07(tokenizer: Any) -> None:
    """The control: vLLM's default logprobs mode (the raw model's) disagrees with the distribution
    sampled from, which is why the gateway's docs say to start it with processed logprobs."""
    model = small_model(tokenizer)
    async with vllm_backend(model, tokenizer, mode="raw_logprobs") as backend:
        batch = await rollouts(backend, 0.7, 1.0)
    metrics = first_update(model, tokenizer, batch, 0.7, 1.0)
    assert metrics["policy/behaviour_drift"] > 1e-2
