"""The agent every misbehaving test runs: the task says how to behave, `good` being the norm."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import openai

import reinforge
from reinforge.runner import LLM

LATE_CALLERS: dict[str, LLM] = {}
"""The credentials a `late_call` agent kept, by rollout id, to call with after its attempt ended."""
STREAMS_DROPPED = 300
"""Enough to show a leak per dropped stream (calls in flight, open generators) hundreds of times over;
sized for a busy 2-core CI machine."""
BODY_BYTES = 100 * 1024 * 1024


async def _ask(llm: LLM) -> str:
    client = openai.AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    async with client:
        reply = await client.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": "what is 2 + 2?"}]
        )
    return reply.choices[0].message.content or ""


async def _drop_streams(llm: LLM) -> None:
    """Open many streaming calls, read each one's first bytes, and hang up."""
    body = {"model": llm.model, "stream": True, "messages": [{"role": "user", "content": "hello"}]}
    headers = {"Authorization": f"Bearer {llm.api_key}"}
    limits = httpx.Limits(max_connections=50)
    async with httpx.AsyncClient(
        base_url=llm.base_url, headers=headers, limits=limits, timeout=httpx.Timeout(30, pool=None)
    ) as client:

        async def one() -> None:
            async with client.stream("POST", "/chat/completions", json=body) as response:
                assert response.status_code == 200
                async for _ in response.aiter_raw():
                    break  # the first chunk, then the connection goes back half-read (closed)

        await asyncio.gather(*(one() for _ in range(STREAMS_DROPPED)))


def _send_huge_body(llm: LLM) -> None:
    with openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0) as client:
        padding = "x" * BODY_BYTES
        client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": padding}])


@reinforge.agent(name="misbehaving")
async def misbehaving(task: dict[str, Any], llm: LLM) -> Any:
    kind = task["kind"]
    if kind == "good":
        return 1.0 if "4" in await _ask(llm) else 0.0
    if kind == "never_returns":
        await asyncio.sleep(3600)
    if kind == "nan":
        return float("nan")
    if kind == "inf":
        return float("-inf")
    if kind == "string":
        return "1.0"
    if kind == "flood_calls":
        for _ in range(task["calls"]):
            try:
                await _ask(llm)
            except openai.RateLimitError:
                break  # a runaway agent that shrugs the refusal off and reports success
        return 1.0
    if kind == "flood_spans":
        for i in range(task["spans"]):
            with reinforge.span(f"step {i}", kind="tool"):
                pass
        return 1.0
    if kind == "huge_body":
        # Building and sending 100 MB is CPU work: in a thread, as another process would do it.
        await asyncio.to_thread(_send_huge_body, llm)
        return 1.0
    if kind == "late_call":
        LATE_CALLERS[task["key"]] = llm
        return 1.0
    if kind == "drop_streams":
        # In a thread with its own event loop, as another process would: the flood competes with the
        # other rollouts for the gateway, not for this runner's event loop.
        await asyncio.to_thread(asyncio.run, _drop_streams(llm))
        return 1.0
    raise AssertionError(f"unknown kind {kind!r}")
