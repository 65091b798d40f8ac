"""The scale bench's agent (imported by name by `reinforge runner` processes and Ray actors): one
LLM call through the gateway (the model asks for the tool), a tool that waits 50 ms (I/O-bound, like
a web search or a sandbox), then reward 1."""

from __future__ import annotations

import asyncio
from typing import Any

from openai import AsyncOpenAI

from reinforge.net.openai_client import gateway_http_client
from reinforge.runner import LLM, agent

TOOL_WAIT_S = 0.05


@agent(name="tool-user")
async def tool_agent(task: dict[str, Any], llm: LLM) -> float:
    client = AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, http_client=gateway_http_client())
    messages: list[Any] = [{"role": "user", "content": f"look up item {task['i']}"}]
    first = await client.chat.completions.create(model=llm.model, messages=messages, max_tokens=16)
    await asyncio.sleep(float(task.get("tool_wait_s", TOOL_WAIT_S)))  # the tool call
    return 1.0 if first.choices[0].message.content else 0.0
