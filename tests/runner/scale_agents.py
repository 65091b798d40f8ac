"""Agents the remote-runner and Ray tests import by name (a Ray actor or a `reinforge runner` child
imports them as `tests.runner.scale_agents:...`)."""

from __future__ import annotations

import asyncio
from typing import Any

from reinforge.runner import LLM, agent


@agent(name="waits")
async def waiting_agent(task: dict[str, Any], llm: LLM) -> float:
    """Waits `task["wait_s"]` (an I/O-bound tool call), then scores the task's own value."""
    await asyncio.sleep(float(task.get("wait_s", 0.2)))
    return float(task.get("value", 1.0))


@agent(name="llm-parity")
async def llm_parity_agent(task: dict[str, Any], llm: LLM) -> float:
    """One call to the policy through the gateway, a short tool wait, then reward 1 when the reply's
    length is even: random enough that GRPO groups get both outcomes."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=2)
    try:
        response = await client.chat.completions.create(
            model=llm.model,
            messages=[{"role": "user", "content": str(task["question"])}],
            temperature=1.0,
            max_tokens=6,
        )
    finally:
        await client.close()
    await asyncio.sleep(float(task.get("wait_s", 0.3)))
    return float(len(response.choices[0].message.content or "") % 2 == 0)
