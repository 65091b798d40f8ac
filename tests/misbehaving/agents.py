"""The agent every misbehaving test runs: the task says how to behave, `good` being the norm."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import openai

import reinforge
from reinforge.runner import LLM

LATE_CALLERS: dict[str, LLM] = {}
"""The credentials a `late_call` agent kept, by rollout id, to call with after its attempt ended."""
STREAMS_DROPPED = 2000
"""Thousands: a leak per dropped stream (a call in flight, an open generator, a socket, a task) shows
thousands of times over; still a few seconds on a busy 2-core CI machine."""
STREAMS_AT_ONCE = 200
"""Streams the agent holds open at a time (as many sockets on the gateway's side)."""
BODY_BYTES = 100 * 1024 * 1024


async def _ask(llm: LLM) -> str:
    client = openai.AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    async with client:
        reply = await client.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": "what is 2 + 2?"}]
        )
    return reply.choices[0].message.content or ""


async def _drop_streams(llm: LLM) -> int:
    """Open many streaming calls, read each one's first bytes and hang up, from another process (as
    an agent's own subprocess would); returns how many were answered with a 200."""
    args = [llm.base_url, llm.api_key, str(STREAMS_DROPPED), str(STREAMS_AT_ONCE)]
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.misbehaving.stream_dropper", *args, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await process.communicate()
    assert process.returncode == 0, process.returncode
    return int(out)


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
        answered = await _drop_streams(llm)
        assert answered == STREAMS_DROPPED, answered
        # What the agent ends with is what its runner reports: the dropped calls are the gateway's to
        # record (as cancelled), not the agent's.
        return 1.0
    raise AssertionError(f"unknown kind {kind!r}")
