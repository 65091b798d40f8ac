"""Arithmetic a 135M model cannot do in its head: two-digit sums and three-by-two-digit products.

Half the questions are sums, half products, so that the operator written into the calculator call
has to come from the question. A question is held out by a hash of its text: the training and
held-out splits are disjoint by construction, whatever seed or size a caller asks for.
"""

from __future__ import annotations

import random
from typing import Literal

from pydantic import BaseModel, ConfigDict

from reinforge.demo.tasks import Split, draw_tasks, is_held_out

Kind = Literal["sum", "product"]


class ArithmeticTask(BaseModel):
    """One question and its exact answer."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task_id: str
    question: str
    answer: int
    kind: Kind

    def as_task(self) -> dict[str, object]:
        """The JSON dict a Trainer dataset holds (what the agent receives)."""
        return {"task_id": self.task_id, "question": self.question, "answer": self.answer, "kind": self.kind}


def question_text(a: int, op: str, b: int) -> str:
    return f"What is {a} {op} {b}?"


def make_task(a: int, op: Literal["+", "*"], b: int) -> ArithmeticTask:
    question = question_text(a, op, b)
    kind: Kind = "sum" if op == "+" else "product"
    return ArithmeticTask(
        task_id=question, question=question, answer=a + b if op == "+" else a * b, kind=kind
    )


def sample_task(rng: random.Random, split: Split) -> ArithmeticTask:
    """One random question of the split: a two-digit sum or a three-by-two-digit product."""
    while True:
        if rng.random() < 0.5:
            task = make_task(rng.randint(10, 99), "+", rng.randint(10, 99))
        else:
            task = make_task(rng.randint(100, 999), "*", rng.randint(10, 99))
        if is_held_out(task.question) == (split == "val"):
            return task


def generate_tasks(split: Split, n: int, seed: int = 0) -> list[ArithmeticTask]:
    """`n` distinct questions of the split, deterministic for a seed (held out as the calc demo's are)."""
    return draw_tasks(sample_task, split, n, random.Random(f"real:{split}:{seed}"))


def train_tasks(n: int = 4000, seed: int = 0) -> list[dict[str, object]]:
    """The training split as a Trainer dataset."""
    return [t.as_task() for t in generate_tasks("train", n, seed)]


def val_tasks(n: int = 200, seed: int = 1) -> list[dict[str, object]]:
    """The held-out split: never drawn for training (see `is_held_out`)."""
    return [t.as_task() for t in generate_tasks("val", n, seed)]
