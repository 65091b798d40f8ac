"""The calc agent in AutoGen AgentChat: an `AssistantAgent` with a calculator tool.

Written as AutoGen's docs write it: an `OpenAIChatCompletionClient` (given the `model_info` a model
AutoGen does not know needs) and a plain Python function as the tool. AutoGen traces through
OpenTelemetry; the runner routes its `execute_tool` spans into the attempt, so a failed calculator
call is a signal for credit assignment with no change here.

    .venv/bin/python examples/frameworks/autogen_calc.py [--minutes 5]
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

MAX_TURNS = 4

MODEL_INFO = {
    "vision": False,
    "function_calling": True,
    "json_output": False,
    "family": "unknown",
    "structured_output": False,
    "multiple_system_messages": False,
}


def calculator(expression: str) -> str:
    """Compute a op b"""
    return str(call_calculator(json.dumps({"expression": expression})))


@agent
async def calc_agent(task: dict[str, Any], llm: LLM) -> float:
    """Solve `task["question"]` with an AutoGen AssistantAgent; 1.0 for the exact answer."""
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
        "calc", model_client=client, tools=[calculator], max_tool_iterations=MAX_TURNS, system_message=None
    )
    try:
        result = await assistant.run(task=str(task["question"]))
    finally:
        await client.close()
    last = result.messages[-1]
    text = last.content if isinstance(last, TextMessage) else ""
    return 1.0 if parse_answer(str(text)) == int(task["answer"]) else 0.0


def main() -> None:
    from train_calc import train_calc  # beside this script (run as a script, its folder is on sys.path)

    train_calc(calc_agent, "autogen_calc")


if __name__ == "__main__":
    main()
