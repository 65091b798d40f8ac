"""The scripted policy the warm start records the LangGraph SQL agent against.

Each role is recognised by its prompt (sql_agent.py writes them). The writer and the rewriter write the
gold query only sometimes and otherwise one of the task's near misses (the other order direction,
comparison, aggregate or column), so the warm-started model knows every query form but has not learnt
which one the question's wording asks for: that choice is what RL teaches. The checker tells the
truth (OK for the gold form), as a careful reviewer would.
"""

from __future__ import annotations

import hashlib
import random
from functools import cache
from typing import Any

from sql_data import train_tasks

from reinforge.inference import GenerationRequest

GOLD_RATE = 0.08
"""How often a writer or rewriter turn is the gold query."""


@cache
def _tasks() -> dict[tuple[str, str], dict[str, Any]]:
    return {(str(t["schema"]), str(t["question"])): t for t in train_tasks()}


def _rng(*parts: str) -> random.Random:
    return random.Random(int.from_bytes(hashlib.sha256("\x1f".join(parts).encode()).digest()[:8], "big"))


def _draft(task: dict[str, Any], avoid: str, salt: str) -> str:
    rng = _rng(str(task["question"]), str(task["db_id"]), salt)
    if rng.random() < GOLD_RATE:
        return str(task["gold_sql"])
    wrong = [w for w in task["wrong_sql"] if w != avoid] or list(task["wrong_sql"])
    return str(rng.choice(wrong))


def reply(request: GenerationRequest) -> str:
    prompt = str((request.messages or [{}])[-1].get("content") or "")
    lines = prompt.split("\n")
    if lines[0].startswith("Q: "):  # the checker: question, query, rows
        question, sql = lines[0][3:], lines[1][5:]
        gold = next(str(t["gold_sql"]) for (_, q), t in _tasks().items() if q == question)
        return "OK" if sql == gold else "WRONG"
    schema, question = lines[0], lines[1][3:]
    task = _tasks()[(schema, question)]
    if lines[-1] == "Fix:":  # the rewriter: keep a right query, else draft again
        previous = lines[2][5:]
        return previous if previous == task["gold_sql"] else _draft(task, previous, previous)
    return _draft(task, "", "writer")
