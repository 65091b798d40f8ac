"""Multi-hop questions over the world, MuSiQue-style: each hop is one search for a name.

A question names one entity; its document names the next entity of the chain, and so on; the last
document holds the answer. The first document also holds a trap: a wrong answer of the right type
(the company's own city when the founder's birthplace is asked), so answering after one search is a
natural mistake that the reward punishes. Training questions come from the world's train part, the
validation ones from its held-out part, so a validation question is about entities never trained on.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from pydantic import BaseModel, ConfigDict, Field

from .corpus import document_for
from .world import Split, WorldPart, default_world

TWO_HOP_SHARE = 0.6


class RagTask(BaseModel):
    """One question; `chain` is the names to search, in order, and `trap` the tempting wrong answer."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task_id: str
    question: str
    answer: str
    hops: int = Field(ge=2, le=3)
    chain: list[str] = Field(description="The entity names to search, in order; len(chain) == hops.")
    trap: str = Field(description="A wrong answer of the answer's type found in the first document.")
    split: Split
    template: str

    def as_task(self) -> dict[str, object]:
        """The JSON dict the store carries as the rollout's task."""
        return self.model_dump(mode="json")


Resolved = tuple[list[str], str, str]
"""(chain, answer, trap) of one question, or None where the start entity lacks a relation."""


@dataclass(frozen=True)
class Template:
    name: str
    hops: int
    question: str
    """A format string with one `{}`: the start entity."""
    starts: Callable[[WorldPart], Sequence[str]]
    resolve: Callable[[WorldPart, str], Resolved | None]


def _founder_born(w: WorldPart, c: str) -> Resolved | None:
    founder = w.companies[c].founder
    return [c, founder], w.people[founder].born_in, w.companies[c].based_in


def _author_born(w: WorldPart, b: str) -> Resolved | None:
    author = w.books[b].author
    return [b, author], w.people[author].born_in, w.books[b].set_in


def _teacher_company(w: WorldPart, p: str) -> Resolved | None:
    teacher = w.people[p].teacher
    return None if teacher is None else ([p, teacher], w.people[teacher].works_at, w.people[p].works_at)


def _founder_teacher(w: WorldPart, c: str) -> Resolved | None:
    founder = w.companies[c].founder
    teacher = w.people[founder].teacher
    return None if teacher is None else ([c, founder], teacher, founder)


def _founder_teacher_born(w: WorldPart, c: str) -> Resolved | None:
    founder = w.companies[c].founder
    teacher = w.people[founder].teacher
    if teacher is None:
        return None
    return [c, founder, teacher], w.people[teacher].born_in, w.companies[c].based_in


def _author_teacher_born(w: WorldPart, b: str) -> Resolved | None:
    author = w.books[b].author
    teacher = w.people[author].teacher
    return None if teacher is None else ([b, author, teacher], w.people[teacher].born_in, w.books[b].set_in)


def _teacher_company_city(w: WorldPart, p: str) -> Resolved | None:
    teacher = w.people[p].teacher
    if teacher is None:
        return None
    company = w.people[teacher].works_at
    return [p, teacher, company], w.companies[company].based_in, w.people[p].born_in


def _companies(w: WorldPart) -> Sequence[str]:
    return list(w.companies)


def _books(w: WorldPart) -> Sequence[str]:
    return list(w.books)


def _people(w: WorldPart) -> Sequence[str]:
    return list(w.people)


TEMPLATES: tuple[Template, ...] = (
    Template("founder_born", 2, "In which city was the founder of {} born?", _companies, _founder_born),
    Template("author_born", 2, "In which city was the author of {} born?", _books, _author_born),
    Template(
        "teacher_company", 2, "Which company does the teacher of {} work at?", _people, _teacher_company
    ),
    Template("founder_teacher", 2, "Who was the teacher of the founder of {}?", _companies, _founder_teacher),
    Template(
        "founder_teacher_born",
        3,
        "In which city was the teacher of the founder of {} born?",
        _companies,
        _founder_teacher_born,
    ),
    Template(
        "author_teacher_born",
        3,
        "In which city was the teacher of the author of {} born?",
        _books,
        _author_teacher_born,
    ),
    Template(
        "teacher_company_city",
        3,
        "In which city is the company of the teacher of {} based?",
        _people,
        _teacher_company_city,
    ),
)


def _well_posed(chain: list[str], answer: str, trap: str) -> bool:
    """The trap is in the first document, and no document before the last gives the answer away."""
    if trap == answer or trap not in document_for(chain[0]).text:
        return False
    return answer in document_for(chain[-1]).text and not any(
        answer in document_for(n).text for n in chain[:-1]
    )


@lru_cache(maxsize=2)
def task_pool(split: Split) -> tuple[RagTask, ...]:
    """Every well-posed question of a split, in a fixed order: what `train_tasks`, `val_tasks` draw from."""
    part = default_world().part(split)
    pool: list[RagTask] = []
    for t in TEMPLATES:
        for start in t.starts(part):
            resolved = t.resolve(part, start)
            if resolved is None or not _well_posed(*resolved):
                continue
            chain, answer, trap = resolved
            pool.append(
                RagTask(
                    task_id=f"{split}:{t.name}:{start}",
                    question=t.question.format(start),
                    answer=answer,
                    hops=t.hops,
                    chain=chain,
                    trap=trap,
                    split=split,
                    template=t.name,
                )
            )
    return tuple(pool)


def _balanced(rng: random.Random, tasks: Sequence[RagTask], n: int) -> list[RagTask]:
    """`n` random tasks spread evenly over the templates (as far as each has questions).

    People outnumber companies and books, so a uniform draw would be mostly "teacher of a person"
    questions; a tiny model learns every template better from an even mix.
    """
    by_template: dict[str, list[RagTask]] = {}
    for t in tasks:
        by_template.setdefault(t.template, []).append(t)
    queues = [rng.sample(group, len(group)) for _, group in sorted(by_template.items())]
    mixed = [q[i] for i in range(max(map(len, queues), default=0)) for q in queues if i < len(q)]
    return mixed[:n]


@lru_cache(maxsize=32)
def generate_tasks(split: Split, n: int, seed: int) -> tuple[RagTask, ...]:
    """`n` distinct questions of the split, round(60%) of them 2-hop, templates evenly mixed, shuffled.

    Deterministic per (split, n, seed); cached, so repeated calls are cheap.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    pool = task_pool(split)
    two = [t for t in pool if t.hops == 2]
    three = [t for t in pool if t.hops == 3]
    n_two = round(n * TWO_HOP_SHARE)
    n_three = n - n_two
    if n_two > len(two) or n_three > len(three):
        raise ValueError(
            f"the {split} split has {len(two)} 2-hop and {len(three)} 3-hop questions; "
            f"n={n} needs {n_two} and {n_three}"
        )
    rng = random.Random(f"rag-tasks:{split}:{seed}")
    tasks = _balanced(rng, two, n_two) + _balanced(rng, three, n_three)
    rng.shuffle(tasks)
    return tuple(tasks)


def train_tasks(n: int = 12000, seed: int = 0) -> list[dict[str, object]]:
    """Training questions (about the world's train entities), as task dicts; cached per (n, seed)."""
    return [t.as_task() for t in generate_tasks("train", n, seed)]


def val_tasks(n: int = 256, seed: int = 1) -> list[dict[str, object]]:
    """Held-out questions (about entities no training question or document names); cached per (n, seed)."""
    return [t.as_task() for t in generate_tasks("val", n, seed)]


def corpus_text(tasks: Sequence[RagTask | dict[str, object]]) -> str:
    """Text to train a BPE tokenizer on: the questions, answers and the documents their chains retrieve.

    Each chain entity's own document is what the search ranks first for its name; each document is
    written once however many tasks retrieve it.
    """
    lines: list[str] = []
    seen: set[str] = set()
    for raw in tasks:
        task = raw if isinstance(raw, RagTask) else RagTask.model_validate(raw)
        lines += [task.question, task.answer]
        for name in task.chain:
            if name not in seen:
                seen.add(name)
                lines.append(document_for(name).text)
    return "\n".join(lines) + "\n"
