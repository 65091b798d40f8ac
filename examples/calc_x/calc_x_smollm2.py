"""The Calc-X agent for a real instruct model (SmolLM2-135M-Instruct): AutoGen with a calculator.

An `AssistantAgent` as AutoGen's docs write one: a typed Python function as the tool
(`calculator(a, op, b)`), a system message, and four demonstration dialogues as earlier turns of the
model context (`initial_messages`), each solving a three-operand problem with two calls.

Why not `calc_x_agent.py`'s string tool: given `{"expression": ...}`, SmolLM2 mostly copies the whole
question (`"19+13*6"`) into one call, the calculator refuses it, and the episode is lost (issue 39).
With typed `a, op, b` it cannot; it makes the calls, and what is left to learn is which pair first.
The final message must be exactly `ANSWER: <number>` (`ANSWER: 19-17+17` is not read as 19). The
demonstrations' operands are above 20, so they are never a training or held-out task
(`reinforge.demo.tasks`).
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.messages import TextMessage
from autogen_core import FunctionCall
from autogen_core.model_context import UnboundedChatCompletionContext
from autogen_core.models import (
    AssistantMessage,
    FunctionExecutionResult,
    FunctionExecutionResultMessage,
    LLMMessage,
    UserMessage,
)
from autogen_ext.models.openai import OpenAIChatCompletionClient
from calc_x_agent import MODEL_INFO

from reinforge import LLM, agent
from reinforge.demo.agent import sampling_from
from reinforge.demo.tasks import apply

MAX_TOOL_ITERATIONS = 4
SYSTEM_PROMPT = (
    "You are a careful assistant. The calculator computes one operation 'a op b' at a time. "
    "Do multiplication before addition and subtraction. Finish with ANSWER: followed by the number."
)


_FINAL = re.compile(r"^\s*ANSWER:\s*(-?\d+)\s*\.?\s*$")


def calculator(a: int, op: Literal["+", "-", "*"], b: int) -> str:
    """Compute a op b"""
    return str(apply(a, op, b))


def parse_final(text: str) -> int | None:
    """The number of a final message that is exactly `ANSWER: <number>` (not `ANSWER: 19-17+17`)."""
    match = _FINAL.match(text)
    return int(match.group(1)) if match else None


def question_text(question: str) -> str:
    """The user turn for a task's expression (`3+4*5` -> `What is 3+4*5?`)."""
    return f"What is {question}?"


def _solved(question: str, calls: list[tuple[int, str, int]], tag: str) -> list[LLMMessage]:
    """One demonstration: the question, one calculator call per `(a, op, b)`, then the last result."""
    turns: list[LLMMessage] = [UserMessage(content=question_text(question), source="user")]
    result = ""
    for i, (a, op, b) in enumerate(calls):
        call_id = f"call_{tag}_{i}"
        arguments = json.dumps({"a": a, "op": op, "b": b}, separators=(",", ":"))
        result = calculator(a, op, b)  # type: ignore[arg-type]
        turns.append(
            AssistantMessage(
                content=[FunctionCall(id=call_id, name="calculator", arguments=arguments)], source="calc"
            )
        )
        turns.append(
            FunctionExecutionResultMessage(
                content=[FunctionExecutionResult(content=result, name="calculator", call_id=call_id)]
            )
        )
    turns.append(AssistantMessage(content=f"ANSWER: {result}", source="calc"))
    return turns


def demonstration() -> list[LLMMessage]:
    """Four solved problems: the second operator binding tighter (twice) and left to right (twice)."""
    return [
        *_solved("25+13*4", [(13, "*", 4), (25, "+", 52)], "demo_a"),
        *_solved("32*3-41", [(32, "*", 3), (96, "-", 41)], "demo_b"),
        *_solved("47-12*3", [(12, "*", 3), (47, "-", 36)], "demo_c"),
        *_solved("21+34+29", [(21, "+", 34), (55, "+", 29)], "demo_d"),
    ]


@agent(name="calc_x")
async def calc_x_smollm2_agent(task: dict[str, Any], llm: LLM) -> float:
    """1.0 when the assistant's final message states the exact answer."""
    sampling = sampling_from(llm)
    client = OpenAIChatCompletionClient(
        model=llm.model,
        base_url=llm.base_url,
        api_key=llm.api_key,
        model_info=MODEL_INFO,  # type: ignore[arg-type]
        temperature=float(sampling.get("temperature", 1.0)),
        max_tokens=int(sampling.get("max_tokens", 48)),
    )
    assistant = AssistantAgent(
        "calc",
        model_client=client,
        tools=[calculator],
        max_tool_iterations=MAX_TOOL_ITERATIONS,
        system_message=SYSTEM_PROMPT,
        model_context=UnboundedChatCompletionContext(initial_messages=demonstration()),
    )
    try:
        result = await assistant.run(task=question_text(str(task["question"])))
    finally:
        await client.close()
    last = result.messages[-1]
    text = last.content if isinstance(last, TextMessage) else ""
    return 1.0 if parse_final(str(text)) == int(task["answer"]) else 0.0
