"""The calc agent in the OpenAI Agents SDK: an `Agent` with a `function_tool`, run by `Runner`.

Both of the SDK's model classes work unchanged: `OpenAIChatCompletionsModel` (chat completions) and
`OpenAIResponsesModel` (the Responses API, streamed or not). reinforge hands the agent a base URL and
a key; the runner installs a trace processor of its own (and none that uploads), so the SDK's
function spans mark failed tool calls for credit assignment.

    .venv/bin/python examples/frameworks/openai_agents_calc.py [--variant chat|responses] [--minutes 5]
"""

from __future__ import annotations

import json
from typing import Any

from agents import (
    Agent,
    MaxTurnsExceeded,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
)
from openai import AsyncOpenAI

from reinforge import LLM, agent
from reinforge.demo.agent import TOOL_ERROR_TEXT, parse_answer, sampling_from
from reinforge.demo.calculator import call_calculator

MAX_TURNS = 4


@function_tool(failure_error_function=lambda _context, _error: TOOL_ERROR_TEXT)
def calculator(expression: str) -> str:
    """Compute a op b"""
    return str(call_calculator(json.dumps({"expression": expression})))


async def solve(task: dict[str, Any], llm: LLM, api: str) -> float:
    sampling = sampling_from(llm)
    client = AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=1, timeout=120)
    model_class = OpenAIResponsesModel if api == "responses" else OpenAIChatCompletionsModel
    calc = Agent(
        name="calc",
        tools=[calculator],
        model=model_class(model=llm.model, openai_client=client),
        model_settings=ModelSettings(
            temperature=float(sampling.get("temperature", 1.0)),
            max_tokens=int(sampling.get("max_tokens", 64)),
        ),
    )
    try:
        result = await Runner.run(calc, str(task["question"]), max_turns=MAX_TURNS)
    except MaxTurnsExceeded:
        return 0.0
    return 1.0 if parse_answer(str(result.final_output)) == int(task["answer"]) else 0.0


@agent
async def chat_agent(task: dict[str, Any], llm: LLM) -> float:
    """Through `OpenAIChatCompletionsModel`."""
    return await solve(task, llm, "chat")


@agent
async def responses_agent(task: dict[str, Any], llm: LLM) -> float:
    """Through `OpenAIResponsesModel`."""
    return await solve(task, llm, "responses")


def main() -> None:
    from train_calc import train_calc  # beside this script (run as a script, its folder is on sys.path)

    train_calc({"chat": chat_agent, "responses": responses_agent}, "openai_agents_calc")


if __name__ == "__main__":
    main()
