"""The scripted policy the warm start records the AutoGen agent against.

Each conversation is planned once from its question (the demo's trace mix: guess, answer after the
first result, or do both calculator calls), and every call of that conversation replies with the next
assistant turn of the plan. The mix makes the wrong choice the likely one at a single decision token,
so RL has a decision to teach, as in the calc demo.
"""

from __future__ import annotations

import hashlib
import random
from functools import cache
from typing import Any

from reinforge.demo.tasks import CalcTask, generate_tasks, make_task
from reinforge.demo.traces import TraceMix, synthetic_trace
from reinforge.inference import GenerationRequest
from reinforge.inference.scripted import ScriptedReply, ScriptedToolCall

MIX = TraceMix(guess=0.15, whole_expression=0.0, left_to_right=0.0, answer_early=0.5)


@cache
def _tasks_by_question() -> dict[str, CalcTask]:
    return {t.question: t for t in generate_tasks("train", 20000, seed=0)}


def _task(question: str) -> CalcTask:
    found = _tasks_by_question().get(question)
    if found is not None:
        return found
    a, op1, b, op2, c = _parse(question)
    return make_task(a, op1, b, op2, c)


def _parse(question: str) -> tuple[int, str, int, str, int]:
    ops = [i for i, ch in enumerate(question) if ch in "+-*" and i > 0]
    if len(ops) != 2:
        raise ValueError(f"not a calc question: {question!r}")
    i, j = ops
    return int(question[:i]), question[i], int(question[i + 1 : j]), question[j], int(question[j + 1 :])


def _plan(question: str) -> list[dict[str, Any]]:
    seed = int.from_bytes(hashlib.sha256(question.encode()).digest()[:8], "big")
    trace = synthetic_trace(_task(question), random.Random(seed), MIX)
    return [m for m in trace if m["role"] == "assistant"]


def reply(request: GenerationRequest) -> ScriptedReply:
    """The plan's next assistant turn for this conversation."""
    messages = request.messages or []
    question = next(str(m.get("content")) for m in messages if m.get("role") == "user")
    done = sum(1 for m in messages if m.get("role") == "assistant")
    plan = _plan(question.strip())
    turn = plan[min(done, len(plan) - 1)]
    calls = [
        ScriptedToolCall(name=c["function"]["name"], arguments=c["function"]["arguments"])
        for c in turn.get("tool_calls") or []
    ]
    return ScriptedReply(text=str(turn.get("content") or ""), tool_calls=calls)
