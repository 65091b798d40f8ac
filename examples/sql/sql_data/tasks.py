"""Train and held-out task splits: the training domains and the held-out ones never share a database,
a table name or a question, so validation measures transfer to unseen schemas."""

from __future__ import annotations

import functools
import hashlib
import random
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .databases import database_path
from .questions import LEVELS, DbView, make_question
from .schemas import DOMAINS, HELD_OUT_DOMAIN_NAMES, db_ids, schema_text

Split = Literal["train", "val"]

HELD_OUT_DOMAINS: tuple[str, ...] = HELD_OUT_DOMAIN_NAMES
TRAIN_DOMAINS: tuple[str, ...] = tuple(d for d in DOMAINS if d not in HELD_OUT_DOMAINS)

_MAX_ATTEMPTS = 400
"""Draws per task before giving up: far more than any level needs unless the split is exhausted."""


class SqlTask(BaseModel):
    """One question on one database; `wrong_sql` are near misses that run but return something else."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    task_id: str
    db_id: str
    db_schema: str = Field(alias="schema", description="schema_text(db_id), what the prompt shows.")
    question: str
    gold_sql: str
    difficulty: int = Field(ge=1, le=5)
    wrong_sql: list[str]

    def as_task(self) -> dict[str, object]:
        """The JSON dict the store carries as the rollout's task (the schema under the key `schema`)."""
        return self.model_dump(mode="json", by_alias=True)


def _domains(split: Split) -> tuple[str, ...]:
    if split == "train":
        return TRAIN_DOMAINS
    if split == "val":
        return HELD_OUT_DOMAINS
    raise ValueError(f"split must be 'train' or 'val', got {split!r}")


def _task_id(db_id: str, question: str) -> str:
    return f"{db_id}:{hashlib.sha256(question.encode()).hexdigest()[:10]}"


@functools.lru_cache(maxsize=16)
def generate_tasks(split: Split, n: int, seed: int = 0) -> tuple[SqlTask, ...]:
    """`n` distinct tasks of the split, a fifth of each level, deterministic for a seed (and cached)."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = random.Random(f"sql:{split}:{seed}")
    dbs = [db for domain in _domains(split) for db in db_ids(domain)]
    views: dict[str, DbView] = {}
    seen: set[tuple[str, str]] = set()
    tasks: list[SqlTask] = []
    try:
        for i in range(n):
            level = LEVELS[i % len(LEVELS)]
            for _ in range(_MAX_ATTEMPTS):
                db_id = rng.choice(dbs)
                if db_id not in views:
                    views[db_id] = DbView(db_id, database_path(db_id))
                q = make_question(rng, views[db_id], level)
                if q is None or (db_id, q.question) in seen:
                    continue
                seen.add((db_id, q.question))
                tasks.append(
                    SqlTask(
                        task_id=_task_id(db_id, q.question),
                        db_id=db_id,
                        schema=schema_text(db_id),
                        question=q.question,
                        gold_sql=q.gold_sql,
                        difficulty=level,
                        wrong_sql=list(q.wrong_sql),
                    )
                )
                break
            else:
                raise ValueError(f"the {split} split has too few distinct level-{level} tasks for n={n}")
    finally:
        for view in views.values():
            view.close()
    rng.shuffle(tasks)
    return tuple(tasks)


def train_tasks(n: int = 4000, seed: int = 0) -> list[dict[str, object]]:
    """The training split as JSON dicts (what `[data] train = "sql_data.tasks:train_tasks"` loads)."""
    return [t.as_task() for t in generate_tasks("train", n, seed)]


def val_tasks(n: int = 256, seed: int = 1) -> list[dict[str, object]]:
    """The held-out split: only databases of `HELD_OUT_DOMAINS`, never drawn for training."""
    return [t.as_task() for t in generate_tasks("val", n, seed)]


def _difficulty(task: SqlTask | Mapping[str, object]) -> int:
    value = task.difficulty if isinstance(task, SqlTask) else task["difficulty"]
    return int(str(value))


def level_counts(tasks: Iterable[SqlTask | Mapping[str, object]]) -> dict[int, int]:
    """Tasks per difficulty level, every level present as a key (0 when missing)."""
    counts = Counter(_difficulty(t) for t in tasks)
    return {level: counts.get(level, 0) for level in LEVELS}


def corpus_text(tasks: Iterable[SqlTask | Mapping[str, object]]) -> str:
    """Every distinct schema, then each question with its gold and wrong SQL, one per line: the text a
    BPE tokenizer should learn merges from (table and column names, keywords, values)."""
    dicts = [t.as_task() if isinstance(t, SqlTask) else t for t in tasks]
    schemas = dict.fromkeys(str(t["schema"]) for t in dicts)
    lines = list(schemas)
    for t in dicts:
        wrong = t["wrong_sql"]
        lines.append(str(t["question"]))
        lines.append(str(t["gold_sql"]))
        if isinstance(wrong, list):
            lines.extend(str(w) for w in wrong)
    return "\n".join(lines) + "\n"
