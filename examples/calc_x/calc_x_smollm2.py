"""The Calc-X agent for a real instruct model (SmolLM2-135M-Instruct): AutoGen with a calculator.

The same `AssistantAgent` as `calc_x_agent.py`, with the prompt a person writes for a small instruct
model: a system instruction and two demonstration dialogues as earlier turns of the model context
(AutoGen's `initial_messages`), each solving a three-operand problem with two calculator calls in
precedence order. The base model almost never calls a tool zero-shot; shown two calls, sampled
episodes call it often enough for GRPO's groups to disagree (docs/demo.md). The demonstrations'
operands are above 20, so they are never a training or held-out task (`reinforge.demo.tasks`).
"""

from __future__ import annotations

import json
from typing import Any

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
from calc_x_agent import MODEL_INFO, calculator

from reinforge import LLM, agent
from reinforge.demo.agent import parse_answer, sampling_from

MAX_TOOL_ITERATIONS = 4
SYSTEM_PROMPT = (
    "You are a careful assistant. The calculator computes one operation 'a op b' at a time. "
    "Do multiplication before addition and subtraction. Finish with ANSWER: followed by the number."
)


def question_text(question: str) -> str:
    """The user turn for a task's expression (`3+4*5` -> `What is 3+4*5?`)."""
    return f"What is {question}?"


def _solved(question: str, calls: list[tuple[str, str]], answer: str, tag: str) -> list[LLMMessage]:
    """One demonstration: the question, one call per `(expression, result)`, then the answer."""
    turns: list[LLMMessage] = [UserMessage(content=question_text(question), source="user")]
    for i, (expression, result) in enumerate(calls):
        call_id = f"call_{tag}_{i}"
        arguments = json.dumps({"expression": expression}, separators=(",", ":"))
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
    turns.append(AssistantMessage(content=f"ANSWER: {answer}", source="calc"))
    return turns


def demonstration() -> list[LLMMessage]:
    """Two solved problems: one where the second operator binds tighter, one left to right."""
    return [
        *_solved("25+13*4", [("13*4", "52"), ("25+52", "77")], "77", "demo_a"),
        *_solved("32*3-41", [("32*3", "96"), ("96-41", "55")], "55", "demo_b"),
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
    return 1.0 if parse_answer(str(text)) == int(task["answer"]) else 0.0
