"""The scripted policy the warm start records the Agents SDK researcher against.

A conversation is planned from its question: search the chain's entities in order, then answer. The
plan's mix makes the wrong choice the likely one at a single decision token: after the first search
the researcher often answers at once with the trap the first page offers (a city or person of the
right kind), and sometimes it answers without searching at all. RL has to teach it to keep searching.
"""

from __future__ import annotations

import hashlib
import random
from functools import cache
from typing import Any

from rag_data import RagTask, generate_tasks

from reinforge.inference import GenerationRequest
from reinforge.inference.scripted import ScriptedReply, ScriptedToolCall

GUESS = 0.15
"""Answer without searching (a made-up name of the right kind: never right)."""
ANSWER_EARLY = 0.55
"""After the first search, answer the trap instead of searching on."""


@cache
def _tasks_by_question() -> dict[str, RagTask]:
    return {t.question: t for t in generate_tasks("train", 12000, seed=0)}


def _plan(task: RagTask) -> list[ScriptedReply]:
    seed = int.from_bytes(hashlib.sha256(task.question.encode()).digest()[:8], "big")
    rng = random.Random(seed)
    first = rng.random()
    if first < GUESS:
        others = [t.answer for t in _tasks_by_question().values() if t.answer != task.answer]
        return [ScriptedReply(text=f"ANSWER: {rng.choice(others)}")]
    searches = [
        ScriptedReply(tool_calls=[ScriptedToolCall(name="search", arguments={"query": e})])
        for e in task.chain
    ]
    if rng.random() < ANSWER_EARLY:
        return [searches[0], ScriptedReply(text=f"ANSWER: {task.trap}")]
    return [*searches, ScriptedReply(text=f"ANSWER: {task.answer}")]


def reply(request: GenerationRequest) -> ScriptedReply:
    """The plan's next turn for this conversation (the question is its user message)."""
    messages: list[dict[str, Any]] = request.messages or []
    question = next(str(m.get("content")) for m in messages if m.get("role") == "user").strip()
    plan = _plan(_tasks_by_question()[question])
    done = sum(1 for m in messages if m.get("role") == "assistant")
    return plan[min(done, len(plan) - 1)]
