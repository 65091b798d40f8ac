"""The Calc-X agent in AutoGen AgentChat: an `AssistantAgent` with a calculator tool.

Written as AutoGen's docs write it; reinforge only hands it a base URL and a key. AutoGen traces
through OpenTelemetry, so a failed calculator call reaches credit assignment as a tool-error signal
without a line here.
"""

from __future__ import annotations

import json
from typing import Any

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.messages import TextMessage
from autogen_ext.models.openai import OpenAIChatCompletionClient

from reinforge import LLM, agent
from reinforge.demo.agent import parse_answer, sampling_from
from reinforge.demo.calculator import call_calculator

MAX_TOOL_ITERATIONS = 4

MODEL_INFO = {
    "vision": False,
    "function_calling": True,
    "json_output": False,
    "family": "unknown",
    "structured_output": False,
    "multiple_system_messages": False,
}
"""What AutoGen must be told about a model it does not know."""


def calculator(expression: str) -> str:
    """Compute a op b"""
    return str(call_calculator(json.dumps({"expression": expression})))


@agent
async def calc_x_agent(task: dict[str, Any], llm: LLM) -> float:
    """1.0 when the assistant's final message states the exact answer."""
    sampling = sampling_from(llm)
    client = OpenAIChatCompletionClient(
        model=llm.model,
        base_url=llm.base_url,
        api_key=llm.api_key,
        model_info=MODEL_INFO,  # type: ignore[arg-type]
        temperature=float(sampling.get("temperature", 1.0)),
        max_tokens=int(sampling.get("max_tokens", 64)),
    )
    assistant = AssistantAgent(
        "calc",
        model_client=client,
        tools=[calculator],
        max_tool_iterations=MAX_TOOL_ITERATIONS,
        system_message=None,
    )
    try:
        result = await assistant.run(task=str(task["question"]))
    finally:
        await client.close()
    last = result.messages[-1]
    text = last.content if isinstance(last, TextMessage) else ""
    return 1.0 if parse_answer(str(text)) == int(task["answer"]) else 0.0
