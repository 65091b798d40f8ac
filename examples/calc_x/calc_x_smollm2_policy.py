"""The scripted policy `reinforge sft` records `calc_x_smollm2.py`'s AutoGen agent against.

The agent runs unchanged on training tasks; each model call is answered with the next assistant turn
of a plan drawn once per question, in the form the demonstrations in the prompt show (a typed
`calculator` call `{"a":..,"op":..,"b":..}`, then `ANSWER: <number>`). The gateway records the
exact token ids of every prompt and reply, so the warm start trains on what the model will see.

The plan is a mix, as the toy calc_x warm start's (`calc_x_policy.py`): mostly the right two calls,
but on a precedence conflict (`3+4*5`) left to right some of the time, and some of the time the
answer right after the first result. The warm-started model then solves part of the tasks, with
the decision RL has to teach (which pair first; both calls before answering) left open, instead of
a prompt-only model that never reaches the answer and gives GRPO no signal (docs/experiments.md).
"""

from __future__ import annotations

import hashlib
import json
import random

from pydantic import BaseModel, ConfigDict, Field

from reinforge.demo.tasks import apply, left_to_right_steps, make_task
from reinforge.inference import GenerationRequest
from reinforge.inference.scripted import ScriptedReply, ScriptedToolCall, turns_since_question


class PlanMix(BaseModel):
    """How often a planned conversation takes each wrong turn."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    left_to_right: float = Field(default=0.6, ge=0.0, le=1.0)
    """On a precedence conflict: compute left to right (`(3+4)*5`), a wrong answer."""
    answer_early: float = Field(default=0.3, ge=0.0, le=1.0)
    """Answer with the first call's result instead of making the second call."""


MIX = PlanMix()

Turn = tuple[int, str, int] | int
"""A planned assistant turn: a calculator call `(a, op, b)`, or the final answer."""


def parse_question(text: str) -> tuple[int, str, int, str, int]:
    """`What is 3+4*5?` (or the bare `3+4*5`) as its operands and operators."""
    expression = text.strip().removeprefix("What is").strip().removesuffix("?").strip()
    ops = [i for i, ch in enumerate(expression) if ch in "+-*" and i > 0]
    if len(ops) != 2:
        raise ValueError(f"not a calc question: {text!r}")
    i, j = ops
    return (
        int(expression[:i]),
        expression[i],
        int(expression[i + 1 : j]),
        expression[j],
        int(expression[j + 1 :]),
    )


def plan(question: str, mix: PlanMix = MIX) -> list[Turn]:
    """The conversation's assistant turns, drawn once per question (seeded by its text)."""
    a, op1, b, op2, c = parse_question(question)
    task = make_task(a, op1, b, op2, c)
    rng = random.Random(int.from_bytes(hashlib.sha256(task.question.encode()).digest()[:8], "big"))
    steps = task.steps
    if task.conflict and rng.random() < mix.left_to_right:
        steps = left_to_right_steps(a, op1, b, op2, c)
    first = apply(*steps[0])
    if rng.random() < mix.answer_early:
        return [steps[0], first]
    return [steps[0], steps[1], apply(*steps[1])]


def reply(request: GenerationRequest) -> ScriptedReply:
    """The plan's next turn for this conversation."""
    question, done = turns_since_question(request)
    turns = plan(question)
    turn = turns[min(done, len(turns) - 1)]
    if isinstance(turn, int):
        return ScriptedReply(text=f"ANSWER: {turn}")
    a, op, b = turn
    arguments = json.dumps({"a": a, "op": op, "b": b}, separators=(",", ":"))  # as the demonstrations
    return ScriptedReply(tool_calls=[ScriptedToolCall(name="calculator", arguments=arguments)])
