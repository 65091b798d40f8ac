"""The scripted policy `reinforge sft` records `sql_smollm2.py`'s LangGraph writer -> run -> checker ->
rewriter loop against.

The agent runs unchanged on training tasks; each role's call (told apart by its system message) is
answered as that role would, on the request's last user turn (earlier ones are the demonstration).
The gateway records the exact token ids of every prompt and reply, so the warm start trains on what
the model will see.

The plan is a mix, as calc_x's and rag's warm starts' are: the writer mostly makes one systematic
mistake, the same decision on every question of a kind (a string value left unquoted, as the base
model does; else the question's flip: the other comparison, order, aggregate or `!=`; only a question
with neither gets one of its near misses) and otherwise writes the gold query; the checker judges what
its prompt shows, the rows: WRONG when the query failed or returned none, OK otherwise (it stays frozen
during RL, so the loop only works if it starts with a verdict it can read off its prompt); the
rewriter, after a WRONG, writes the gold query some of the time and otherwise hands the query back
unchanged, a small model's own failure. A mistake that is one decision across questions is what the
warm-started greedy model makes on held-out questions too, so RL has a decision to reverse there;
mistakes drawn from each question's several near misses left the greedy writer on gold (their tokens
disagree, gold's agree), and the first sql run's greedy gain was small (docs/experiments.md).
"""

from __future__ import annotations

import hashlib
import random
import re
from functools import lru_cache
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from sql_data import database_path, execution_match, train_tasks, val_tasks
from sql_smollm2 import CHECKER_SYSTEM, REWRITER_SYSTEM, WRITER_SYSTEM

from reinforge.inference import GenerationRequest
from reinforge.inference.scripted import turns_since_question

Role = Literal["writer", "checker", "rewriter"]
SYSTEMS: dict[str, Role] = {WRITER_SYSTEM: "writer", CHECKER_SYSTEM: "checker", REWRITER_SYSTEM: "rewriter"}


class PlanMix(BaseModel):
    """How often each role's turn is wrong."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    writer_wrong: float = Field(default=0.65, ge=0.0, le=1.0)
    """The writer's mistake. Above one half, so the warm start's greedy writer makes it and RL has that
    decision to reverse (calc_x's warm start computes left to right 60% of the time, rag's takes the
    trap 55%, for the same reason); a little higher here because the prompt's demonstration quotes its
    value."""
    rewriter_right: float = Field(default=0.3, ge=0.0, le=1.0)
    """A rewrite is the gold query; otherwise the rejected query comes back unchanged. Below one half,
    so the warm start's greedy rewriter repeats the mistake and RL has that decision to reverse too."""


MIX = PlanMix()

WriterKind = Literal["right", "unquoted", "flipped", "near_miss"]


class Plan(BaseModel):
    """One question's queries: what the writer writes, and every mistake planned for it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gold: str
    writer: str
    kind: WriterKind
    mistakes: list[str]
    """Every planned wrong query; each returns something else than gold on every training database
    the question is asked of."""


class HeldOutQuestionError(ValueError):
    """The question is not a training question: the warm start must never see a held-out one."""


@lru_cache(maxsize=1)
def _training_tasks() -> dict[str, list[dict[str, Any]]]:
    """Every training task (the config's `[data] train`), by question: instances of a domain share
    questions, so one question may be asked of several databases."""
    found: dict[str, list[dict[str, Any]]] = {}
    for task in train_tasks():
        found.setdefault(str(task["question"]), []).append(task)
    return found


def training_tasks(question: str, schema: str | None = None) -> list[dict[str, Any]]:
    """The training tasks asking `question` (of `schema` when given); a held-out or unknown question
    is refused."""
    found = [
        t
        for t in _training_tasks().get(question.strip(), [])
        if schema is None or t["schema"] == schema.strip()
    ]
    if not found:
        held_out = any(t["question"] == question.strip() for t in val_tasks())
        raise HeldOutQuestionError(
            f"{'a held-out' if held_out else 'not a training'} question: {question!r} "
            "(the warm start records training tasks only)"
        )
    return found


def _rng(*parts: str) -> random.Random:
    return random.Random(int.from_bytes(hashlib.sha256("\x1f".join(parts).encode()).digest()[:8], "big"))


_STRING_VALUE = re.compile(r"'([^']*)'")


def unquoted(sql: str) -> str | None:
    """The query with its string values' quotes dropped (`country = Italy`), or None without one."""
    bare = _STRING_VALUE.sub(lambda m: m.group(1), sql)
    return None if bare == sql else bare


def _wrong_everywhere(sql: str, tasks: list[dict[str, Any]]) -> bool:
    return all(not execution_match(database_path(str(t["db_id"])), sql, str(t["gold_sql"])) for t in tasks)


_FLIPS: tuple[tuple[str, str], ...] = (
    (" > ", " < "),
    (" < ", " > "),
    (" DESC ", " ASC "),
    (" ASC ", " DESC "),
    ("MAX(", "MIN("),
    ("MIN(", "MAX("),
    (" NOT IN ", " IN "),
    (" = ", " != "),
)
"""The decisive tokens a question's flip reverses: the other comparison, order, aggregate or test."""


def flipped(gold: str, near: list[str]) -> str | None:
    """The near miss that is gold with one decisive token reversed (`<` for `>`, `ASC` for `DESC`,
    `MIN` for `MAX`, `!=` for `=`), or None when the question has none."""
    for ours, theirs in _FLIPS:
        at = gold.find(ours)
        while at >= 0:
            candidate = gold[:at] + theirs + gold[at + len(ours) :]
            if candidate in near:
                return candidate
            at = gold.find(ours, at + 1)
    return None


@lru_cache(maxsize=8192)
def plan(schema: str, question: str, mix: PlanMix = MIX) -> Plan:
    """The question's queries, drawn once per question (seeded by its text)."""
    tasks = training_tasks(question, schema)
    gold = str(tasks[0]["gold_sql"])
    bare = unquoted(gold)
    near = list(dict.fromkeys(str(w) for t in tasks for w in t["wrong_sql"]))
    near = [w for w in near if w != gold and _wrong_everywhere(w, tasks)]
    bare = bare if bare is not None and _wrong_everywhere(bare, tasks) else None
    flip = None if bare is not None else flipped(gold, near)
    mistakes = ([bare] if bare is not None else []) + near
    rng = _rng(question.strip())
    if not mistakes or rng.random() >= mix.writer_wrong:
        return Plan(gold=gold, writer=gold, kind="right", mistakes=mistakes)
    if bare is not None:
        return Plan(gold=gold, writer=bare, kind="unquoted", mistakes=mistakes)
    if flip is not None:
        return Plan(gold=gold, writer=flip, kind="flipped", mistakes=mistakes)
    return Plan(gold=gold, writer=rng.choice(near), kind="near_miss", mistakes=mistakes)


def rewrite(schema: str, question: str, previous: str, mix: PlanMix = MIX) -> str:
    """The rewriter's query after `previous` was rejected: gold some of the time, else `previous` back
    unchanged (drawn once per question and rejected query)."""
    drawn = plan(schema, question, mix)
    rng = _rng(question.strip(), previous)
    return drawn.gold if rng.random() < mix.rewriter_right else previous


def verdict(question: str, sql: str, rows: str) -> str:
    """WRONG when the rows are an error or none, else OK: what the checker can read off its prompt.

    The checker sees the question, the query and its first rows, never the schema or the gold query,
    so whether plausible rows are the right ones is not in its prompt. Trained on verdicts by
    execution instead, the frozen checker learned the majority answer, WRONG, and sent right queries
    to the rewriter (docs/experiments.md, "sql's warm start"). The question must be a training one."""
    training_tasks(question)
    shown = rows.strip()
    return "WRONG" if shown == "none" or shown.startswith("error:") else "OK"


def _fields(text: str) -> dict[str, str]:
    """`Schema: ...\\nQuestion: ...\\nSQL: ...\\nRows: ...` as its labelled lines."""
    fields: dict[str, str] = {}
    for line in text.split("\n"):
        label, sep, value = line.partition(": ")
        if sep and label in ("Schema", "Question", "SQL", "Rows"):
            fields[label] = value
    return fields


def role_of(request: GenerationRequest) -> Role:
    """Which of sql_smollm2.py's roles made the call, by its system message."""
    messages = request.messages or []
    system = str(messages[0].get("content") or "") if messages and messages[0].get("role") == "system" else ""
    if system not in SYSTEMS:
        raise ValueError(f"not a call of sql_smollm2.py's roles (system message {system[:60]!r})")
    return SYSTEMS[system]


def reply(request: GenerationRequest) -> str:
    """The role's turn for this conversation."""
    role = role_of(request)
    fields = _fields(turns_since_question(request)[0])
    if role == "checker":
        return verdict(fields["Question"], fields["SQL"], fields.get("Rows", ""))
    if role == "writer":
        return plan(fields["Schema"], fields["Question"]).writer
    return rewrite(fields["Schema"], fields["Question"], fields["SQL"])
