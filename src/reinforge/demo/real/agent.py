"""The real-model demo's agent: the OpenAI SDK's tool-calling loop, as its docs show it.

Nothing here knows about training: a plain `AsyncOpenAI` client, `tools=[calculator]`, the loop that
runs each tool call and sends the result back until the model answers. The few-shot prompt is what
a person would write for a small model: earlier user / assistant / tool turns that show two
calculator calls (a product and a sum), their results and the answers (`DEMONSTRATION`).

What RL has to fix: in the gateway's default tool form the results come back inside
`<tool_response>` tags, and SmolLM2 mostly opens its reply with `<tool_response>` (the tag it saw
last) and makes up a number, instead of `<tool_call>`: one token decides the episode. Greedy, it
mostly fails; sampled, it calls the calculator often enough for GRPO groups to disagree
(docs/demo.md).
"""

from __future__ import annotations

from typing import Any

from openai import AsyncOpenAI

from reinforge.demo.agent import parse_answer, sampling_from
from reinforge.demo.calculator import CALCULATOR_TOOL, CalculatorError, call_calculator
from reinforge.runner import LLM, agent

MAX_TURNS = 3
SYSTEM_PROMPT = (
    "You are a careful assistant. Use the calculator for arithmetic. "
    "Finish with ANSWER: followed by the number."
)


def _call(call_id: str, expression: str) -> dict[str, Any]:
    arguments = f'{{"expression": "{expression}"}}'
    function = {"name": "calculator", "arguments": arguments}
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": call_id, "type": "function", "function": function}],
    }


DEMONSTRATION: list[dict[str, Any]] = [
    {"role": "system", "content": SYSTEM_PROMPT},
    {"role": "user", "content": "What is 417 * 23?"},
    _call("call_demo_1", "417 * 23"),
    {"role": "tool", "tool_call_id": "call_demo_1", "content": "9591"},
    {"role": "assistant", "content": "ANSWER: 9591"},
    {"role": "user", "content": "What is 45 + 38?"},
    _call("call_demo_2", "45 + 38"),
    {"role": "tool", "tool_call_id": "call_demo_2", "content": "83"},
    {"role": "assistant", "content": "ANSWER: 83"},
]
"""The few-shot dialogue every episode starts from (the question is appended as the next user turn)."""


def run_calculator(arguments: str) -> str:
    """The tool: the result as text, or the error a tool framework would hand back."""
    try:
        return str(call_calculator(arguments))
    except CalculatorError as exc:
        return f"error: {exc}"


@agent(name="real_calc")
async def real_calc_agent(task: dict[str, Any], llm: LLM) -> float:
    """Answer `task["question"]` with the calculator; reward 1.0 for the exact `task["answer"]`."""
    sampling = sampling_from(llm)
    # The SDK's defaults (600 s timeout): a call may wait at the gateway while the trainer updates, and
    # a client that timed out and retried would send the same call twice.
    async with AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key) as client:
        messages: list[Any] = [*DEMONSTRATION, {"role": "user", "content": str(task["question"])}]
        for _ in range(MAX_TURNS):
            response = await client.chat.completions.create(
                model=llm.model,
                messages=messages,
                tools=[CALCULATOR_TOOL],  # type: ignore[list-item]
                temperature=float(sampling.get("temperature", 1.0)),
                max_tokens=int(sampling.get("max_tokens", 48)),
            )
            message = response.choices[0].message
            if not message.tool_calls:
                return 1.0 if parse_answer(message.content) == int(task["answer"]) else 0.0
            messages.append(message)
            for call in message.tool_calls:
                if call.type != "function":
                    continue
                result = (
                    run_calculator(call.function.arguments)
                    if call.function.name == "calculator"
                    else f"error: unknown tool {call.function.name!r}"
                )
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return 0.0
