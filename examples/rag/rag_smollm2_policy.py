"""The scripted policy `reinforge sft` records `rag_smollm2.py`'s Agents SDK researcher against.

The agent runs unchanged on training tasks; each model call is answered with the next assistant turn
of a plan drawn once per question, in the form the demonstration in the prompt shows (a `search`
call `{"query":<name>}` per name of the chain, in order, then `ANSWER: <answer>`). The gateway
records the exact token ids of every prompt and reply, so the warm start trains on what the model
will see.

The plan is a mix, as calc_x's warm start's (`examples/calc_x/calc_x_smollm2_policy.py`): mostly the
whole chain, but some of the time the answer right after the first search (the task's trap, the
wrong answer of the right type its first page holds), and on 3-hop questions some of the time one
hop short (the city on the second page). The warm-started model then solves part of the tasks, with
the decision RL has to teach (search every hop before answering) left open, instead of a prompt-only
model that never searches and gives GRPO no signal (docs/experiments.md).
"""

from __future__ import annotations

import hashlib
import json
import random
from functools import lru_cache
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from rag_data import RagTask, default_world, task_pool

from reinforge.inference import GenerationRequest
from reinforge.inference.scripted import ScriptedReply, ScriptedToolCall, turns_since_question


class PlanMix(BaseModel):
    """How often a planned conversation takes each wrong turn."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    trap: float = Field(default=0.55, ge=0.0, le=1.0)
    """Answer with the task's trap right after the first search. Above one half, so the warm start's
    most likely turn after the first page is the trap: its greedy replies take it, and RL has that
    decision to reverse (calc_x's warm start computes left to right 60% of the time for the same
    reason)."""
    one_short: float = Field(default=0.6, ge=0.0, le=1.0)
    """On a 3-hop question that did not take the trap: stop after two searches, answering the city
    the second page names (where its person was born)."""


MIX = PlanMix()

PlanKind = Literal["right", "trap", "one_short"]


class Plan(BaseModel):
    """One conversation's assistant turns: a search per name, then the answer."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    searches: list[str]
    answer: str
    kind: PlanKind


class HeldOutQuestionError(ValueError):
    """The question is not a training question: the warm start must never see a held-out one."""


@lru_cache(maxsize=1)
def _training_tasks() -> dict[str, RagTask]:
    """Every training question of the world (`rag_data`'s train split), by its text."""
    return {t.question: t for t in task_pool("train")}


def training_task(question: str) -> RagTask:
    """The training task asked by `question`; a held-out or unknown question is refused."""
    found = _training_tasks().get(question.strip())
    if found is None:
        held_out = any(t.question == question.strip() for t in task_pool("val"))
        raise HeldOutQuestionError(
            f"{'a held-out' if held_out else 'not a training'} question: {question!r} "
            "(the warm start records training tasks only)"
        )
    return found


def _one_short_answer(task: RagTask) -> str:
    """The city the 3-hop chain's second page names: where its person (founder, author, teacher)
    was born, the right type of answer from one page too early."""
    return default_world().part("train").people[task.chain[1]].born_in


def plan(question: str, mix: PlanMix = MIX) -> Plan:
    """The conversation's turns, drawn once per question (seeded by its text)."""
    task = training_task(question)
    rng = random.Random(int.from_bytes(hashlib.sha256(task.question.encode()).digest()[:8], "big"))
    if rng.random() < mix.trap:
        return Plan(searches=task.chain[:1], answer=task.trap, kind="trap")
    if task.hops == 3 and rng.random() < mix.one_short:
        return Plan(searches=task.chain[:2], answer=_one_short_answer(task), kind="one_short")
    return Plan(searches=list(task.chain), answer=task.answer, kind="right")


def reply(request: GenerationRequest) -> ScriptedReply:
    """The plan's next turn for this conversation."""
    question, done = turns_since_question(request)
    turns = plan(question)
    if done >= len(turns.searches):
        return ScriptedReply(text=f"ANSWER: {turns.answer}")
    arguments = json.dumps({"query": turns.searches[done]}, separators=(",", ":"))  # as the demonstration
    return ScriptedReply(tool_calls=[ScriptedToolCall(name="search", arguments=arguments)])
