"""The calc agent on the Anthropic SDK: a Messages API tool loop, as Anthropic's docs write it.

reinforge serves the Messages API (`/v1/messages`, `tool_use`/`tool_result` blocks, streaming) next to
OpenAI's, so the agent only needs the gateway's address and the attempt's key. The SDK appends
`/v1/messages` to its base URL, hence `llm.base_url` without its `/v1`.

    .venv/bin/python examples/frameworks/anthropic_calc.py [--minutes 5]
"""

from __future__ import annotations

import json
from typing import Any

import anthropic

from reinforge import LLM, agent
from reinforge.demo.agent import TOOL_ERROR_TEXT, parse_answer, sampling_from
from reinforge.demo.calculator import CalculatorError, call_calculator

MAX_TURNS = 4

TOOLS: list[dict[str, Any]] = [
    {
        "name": "calculator",
        "description": "Compute a op b",
        "input_schema": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    }
]


def run_tool(block: Any) -> dict[str, Any]:
    try:
        return {
            "type": "tool_result",
            "tool_use_id": block.id,
            "content": str(call_calculator(json.dumps(block.input))),
        }
    except CalculatorError:
        return {"type": "tool_result", "tool_use_id": block.id, "content": TOOL_ERROR_TEXT, "is_error": True}


@agent
async def calc_agent(task: dict[str, Any], llm: LLM) -> float:
    """Solve `task["question"]` with Claude-style tool use; 1.0 for the exact answer."""
    sampling = sampling_from(llm)
    client = anthropic.AsyncAnthropic(
        base_url=llm.base_url.removesuffix("/v1"), api_key=llm.api_key, max_retries=1
    )
    messages: list[dict[str, Any]] = [{"role": "user", "content": str(task["question"])}]
    for _ in range(MAX_TURNS):
        response = await client.messages.create(
            model=llm.model,
            max_tokens=int(sampling.get("max_tokens", 64)),
            # This SDK has no sampling arguments; the trainer's temperature (0 when it validates
            # greedily) goes in the body, where the Messages API reads it.
            extra_body={"temperature": float(sampling.get("temperature", 1.0))},
            messages=messages,  # type: ignore[arg-type]
            tools=TOOLS,  # type: ignore[arg-type]
        )
        messages.append({"role": "assistant", "content": response.content})
        uses = [block for block in response.content if block.type == "tool_use"]
        if not uses:
            text = "".join(block.text for block in response.content if block.type == "text")
            return 1.0 if parse_answer(text) == int(task["answer"]) else 0.0
        messages.append({"role": "user", "content": [run_tool(block) for block in uses]})
    return 0.0


def main() -> None:
    from train_calc import train_calc  # beside this script (run as a script, its folder is on sys.path)

    train_calc(calc_agent, "anthropic_calc")


if __name__ == "__main__":
    main()
