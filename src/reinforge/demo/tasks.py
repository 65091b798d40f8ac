"""Calc-X-style problems: three integer operands, two operators, half with a precedence conflict.

A problem is held out or not by a hash of its text, so the train and held-out splits are disjoint by
construction, whatever seed or size a caller asks for: a held-out question can never be drawn for
training.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from typing import Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from reinforge.errors import InvalidRequestError

Split = Literal["train", "val"]

OPERAND_MIN = 1
OPERAND_MAX = 20
HELD_OUT_MODULUS = 5
"""One problem in five (by hash) belongs to the held-out split."""

_LOW = ("+", "-")
_ALL = ("+", "-", "*")


class CalcTask(BaseModel):
    """One problem; `conflict` is true when left-to-right evaluation gives the wrong answer."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task_id: str
    question: str
    answer: int
    operands: tuple[int, int, int]
    operators: tuple[str, str]
    conflict: bool
    steps: list[tuple[int, str, int]] = Field(description="The two calculator calls, in the right order.")

    def as_task(self) -> dict[str, object]:
        """The JSON dict the store carries as the rollout's task."""
        return self.model_dump(mode="json")


def apply(a: int, op: str, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    raise InvalidRequestError(f"unknown operator {op!r}; expected one of + - *")


def solve_steps(a: int, op1: str, b: int, op2: str, c: int) -> list[tuple[int, str, int]]:
    """The calculator calls that respect precedence: b op2 c first when op2 binds tighter."""
    if op2 == "*" and op1 in _LOW:
        first = apply(b, op2, c)
        return [(b, op2, c), (a, op1, first)]
    first = apply(a, op1, b)
    return [(a, op1, b), (first, op2, c)]


def left_to_right_steps(a: int, op1: str, b: int, op2: str, c: int) -> list[tuple[int, str, int]]:
    """The plausible wrong strategy: ignore precedence."""
    first = apply(a, op1, b)
    return [(a, op1, b), (first, op2, c)]


def is_held_out(question: str) -> bool:
    digest = hashlib.sha256(question.encode()).digest()
    return int.from_bytes(digest[:8], "big") % HELD_OUT_MODULUS == 0


def make_task(a: int, op1: str, b: int, op2: str, c: int) -> CalcTask:
    question = f"{a}{op1}{b}{op2}{c}"
    steps = solve_steps(a, op1, b, op2, c)
    x, op, y = steps[1]
    return CalcTask(
        task_id=question,
        question=question,
        answer=apply(x, op, y),
        operands=(a, b, c),
        operators=(op1, op2),
        conflict=op2 == "*" and op1 in _LOW,
        steps=steps,
    )


def _nonnegative(task: CalcTask) -> bool:
    # Negative intermediates make the model copy signs too; the demo keeps to what it must learn.
    first = apply(*task.steps[0])
    return first >= 0 and task.answer >= 0


def sample_task(rng: random.Random, split: Split) -> CalcTask:
    """One random problem of the split; half of them have a precedence conflict."""
    while True:
        conflict = rng.random() < 0.5
        if conflict:
            op1, op2 = rng.choice(_LOW), "*"
        else:
            op1, op2 = rng.choice([(o1, o2) for o1 in _ALL for o2 in _ALL if not (o2 == "*" and o1 in _LOW)])
        a, b, c = (rng.randint(OPERAND_MIN, OPERAND_MAX) for _ in range(3))
        task = make_task(a, op1, b, op2, c)
        if _nonnegative(task) and is_held_out(task.question) == (split == "val"):
            return task


class _Question(Protocol):
    @property
    def question(self) -> str: ...


Q = TypeVar("Q", bound=_Question)


def draw_tasks(
    sample: Callable[[random.Random, Split], Q],
    split: Split,
    n: int,
    rng: random.Random,
    *,
    unique: bool = True,
) -> list[Q]:
    """`n` tasks of the split drawn by `sample` (every demo's task set draws this way); unique
    questions unless asked otherwise."""
    if n < 0:
        raise InvalidRequestError(f"n must be >= 0, got {n}")
    if split not in ("train", "val"):
        raise InvalidRequestError(f"split must be 'train' or 'val', got {split!r}")
    tasks: list[Q] = []
    seen: set[str] = set()
    while len(tasks) < n:
        task = sample(rng, split)
        if unique and task.question in seen:
            continue
        seen.add(task.question)
        tasks.append(task)
    return tasks


def generate_tasks(split: Split, n: int, seed: int = 0, *, unique: bool = True) -> list[CalcTask]:
    """`n` problems of the split, deterministic for a seed; unique questions unless asked otherwise."""
    return draw_tasks(sample_task, split, n, random.Random(f"{split}:{seed}"), unique=unique)


def task_dataset(split: Split, n: int, seed: int = 0) -> list[dict[str, object]]:
    """The split as the list of JSON dicts a Trainer takes as a dataset."""
    return [t.as_task() for t in generate_tasks(split, n, seed)]


def train_tasks(n: int = 4000, seed: int = 0) -> list[dict[str, object]]:
    """The demo's training split (what `[data] train = "reinforge.demo.tasks:train_tasks"` loads)."""
    return task_dataset("train", n, seed)


def val_tasks(n: int = 200, seed: int = 1) -> list[dict[str, object]]:
    """The demo's held-out split: never drawn for training (see `is_held_out`)."""
    return task_dataset("val", n, seed)
