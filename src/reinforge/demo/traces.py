"""Synthetic conversations for the calc demo's supervised warm start.

The mix is designed so that RL has to teach the strategy, not only sharpen it: the right strategy is
present but the most likely choice at one decision token is wrong. After the first calculator result
the model sees "answer now" more often than "call the calculator again", so greedy decoding answers
too early while sampling still succeeds often enough (about a quarter of the time) for GRPO groups to
disagree. Every wrong strategy differs from the right one at a single, early token (call or guess;
continue or answer; which operand first), which is what a tiny model can learn to switch.
"""

from __future__ import annotations

import json
import random
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from reinforge.demo.tasks import CalcTask, apply, left_to_right_steps

Message = dict[str, Any]


class TraceMix(BaseModel):
    """How often each behaviour appears in the warm-start data. Probabilities are per decision."""

    model_config = ConfigDict(extra="forbid")

    guess: float = Field(default=0.2, ge=0.0, le=1.0)
    """Answer a made-up number without calling the calculator."""
    whole_expression: float = Field(default=0.05, ge=0.0, le=1.0)
    """Send the whole expression to the calculator (a tool error), then guess."""
    left_to_right: float = Field(default=0.1, ge=0.0, le=1.0)
    """On a precedence conflict, compute left to right."""
    answer_early: float = Field(default=0.6, ge=0.0, le=1.0)
    """After the first result, answer it instead of calling the calculator again."""

    @model_validator(mode="after")
    def _first_choice_fits(self) -> TraceMix:
        if self.guess + self.whole_expression > 1.0:
            raise ValueError("guess + whole_expression must be <= 1")
        return self


def tool_call_message(call_id: str, expression: str) -> Message:
    """An assistant turn that calls the calculator, shaped as the agent appends it to the history."""
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {
                    "name": "calculator",
                    # Compact JSON: the same text the chat template writes and the model generates.
                    "arguments": json.dumps({"expression": expression}, separators=(",", ":")),
                },
            }
        ],
    }


def tool_result_message(call_id: str, content: str) -> Message:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def answer_message(value: int) -> Message:
    return {"role": "assistant", "content": f"ANSWER: {value}"}


def user_message(task: CalcTask) -> Message:
    return {"role": "user", "content": task.question}


def _expr(step: tuple[int, str, int]) -> str:
    a, op, b = step
    return f"{a}{op}{b}"


def _wrong_guess(task: CalcTask, rng: random.Random) -> int:
    # A number of the right size that is never the answer, so guessing is never rewarded.
    spread = max(3, abs(task.answer) // 3)
    while True:
        guess = max(0, task.answer + rng.randint(-spread, spread))
        if guess != task.answer:
            return guess


def synthetic_trace(task: CalcTask, rng: random.Random, mix: TraceMix | None = None) -> list[Message]:
    """One conversation for `task`, drawn from the mix. The last message is the assistant's answer."""
    mix = mix or TraceMix()
    messages: list[Message] = [user_message(task)]
    first = rng.random()
    if first < mix.guess:
        return [*messages, answer_message(_wrong_guess(task, rng))]
    if first < mix.guess + mix.whole_expression:
        return [
            *messages,
            tool_call_message("call_0", task.question),
            tool_result_message("call_0", "error: calculator takes exactly 'a op b'"),
            answer_message(_wrong_guess(task, rng)),
        ]
    a, b, c = task.operands
    op1, op2 = task.operators
    steps = task.steps
    if task.conflict and rng.random() < mix.left_to_right:
        steps = left_to_right_steps(a, op1, b, op2, c)
    r1 = apply(*steps[0])
    messages += [tool_call_message("call_0", _expr(steps[0])), tool_result_message("call_0", str(r1))]
    if rng.random() < mix.answer_early:
        return [*messages, answer_message(r1)]
    second = steps[1]  # both strategies already carry the first result into the second call
    r2 = apply(*second)
    return [
        *messages,
        tool_call_message("call_1", _expr(second)),
        tool_result_message("call_1", str(r2)),
        answer_message(r2),
    ]


def synthetic_traces(
    tasks: list[CalcTask], seed: int = 0, mix: TraceMix | None = None
) -> list[list[Message]]:
    rng = random.Random(seed)
    return [synthetic_trace(task, rng, mix) for task in tasks]


def corpus_text(traces: list[list[Message]], tools: list[dict[str, Any]]) -> list[str]:
    """Plain text that covers what the tokenizer will see: questions, tool calls, results, answers."""
    lines = [json.dumps(tool) for tool in tools]
    for trace in traces:
        for message in trace:
            if message.get("content"):
                lines.append(str(message["content"]))
            for call in message.get("tool_calls") or []:
                fn = call["function"]
                lines.append(json.dumps({"name": fn["name"], "arguments": json.loads(fn["arguments"])}))
    return lines
