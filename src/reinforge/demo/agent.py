"""The calc agent: plain OpenAI-client code with a calculator tool, looping until it answers.

Nothing in it is specific to training: it talks to whatever OpenAI-compatible endpoint `llm` names,
runs the tool calls the model makes, and returns 1.0 when the final `ANSWER: n` is exact. The tool
runs inside `reinforge.span(..., kind="tool")`, so a refused calculator call is recorded with error
status: an Automatic Intermediate Reward signal for the LLM call that asked for it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from openai import AsyncOpenAI

from reinforge.demo.calculator import CALCULATOR_TOOL, CalculatorError, call_calculator
from reinforge.demo.traces import tool_result_message
from reinforge.runner import LLM, agent, gateway_http_client
from reinforge.tracing import span

MAX_TURNS = 4
TOOL_ERROR_TEXT = "error: calculator takes exactly 'a op b'"
"""What the model sees after a refused call: the same text as in its warm-start data."""
_ANSWER = re.compile(r"ANSWER:\s*(-?\d+)")


def sampling_from(llm: LLM) -> dict[str, Any]:
    """Sampling settings the trainer publishes as resources (temperature 0 for greedy validation)."""
    sampling = llm.resources.get("sampling")
    return sampling if isinstance(sampling, dict) else {}


def parse_answer(text: str | None) -> int | None:
    match = _ANSWER.search(text or "")
    return int(match.group(1)) if match else None


def compact(arguments: str) -> str:
    """Arguments as compact JSON, the way the model writes them: the history re-rendered into the next
    prompt then holds the tokens the model generated, so the calls merge into one training sample."""
    try:
        return json.dumps(json.loads(arguments), separators=(",", ":"))
    except json.JSONDecodeError:
        return arguments


def run_tool(name: str, arguments: str) -> str:
    """Run one tool call; errors come back to the model as text, like any tool framework does."""
    try:
        with span("calculator", kind="tool", arguments=arguments[:200]):
            if name != "calculator":
                raise CalculatorError(f"unknown tool {name!r}")
            return str(call_calculator(arguments))
    except CalculatorError:
        return TOOL_ERROR_TEXT


@agent(name="calc")
async def calc_agent(task: dict[str, Any], llm: LLM) -> float:
    """Solve `task["question"]` with the calculator; reward 1.0 for the exact `task["answer"]`."""
    sampling = sampling_from(llm)
    # The client is cheap on the shared gateway HTTP client (reinforge's keep-alive transport: a
    # fraction of the SDK's default HTTP cost per call), and is not closed: that would close the pool.
    client = AsyncOpenAI(
        base_url=llm.base_url,
        api_key=llm.api_key,
        max_retries=1,
        timeout=120.0,
        http_client=gateway_http_client(),
    )
    messages: list[dict[str, Any]] = [{"role": "user", "content": str(task["question"])}]
    for _ in range(MAX_TURNS):
        response = await client.chat.completions.create(
            model=llm.model,
            messages=messages,  # type: ignore[arg-type]
            tools=[CALCULATOR_TOOL],  # type: ignore[list-item]
            temperature=float(sampling.get("temperature", 1.0)),
            max_tokens=int(sampling.get("max_tokens", 64)),
        )
        message = response.choices[0].message
        calls = [c for c in message.tool_calls or [] if c.type == "function"]
        if not calls:
            return 1.0 if parse_answer(message.content) == int(task["answer"]) else 0.0
        messages.append(
            {
                "role": "assistant",
                "content": message.content,
                "tool_calls": [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.function.name, "arguments": compact(c.function.arguments)},
                    }
                    for c in calls
                ],
            }
        )
        for c in calls:
            messages.append(tool_result_message(c.id, run_tool(c.function.name, c.function.arguments)))
    return 0.0
