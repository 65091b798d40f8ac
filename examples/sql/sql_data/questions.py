"""Question templates with gold SQL and near-miss wrong SQL, in five difficulty levels.

The text is written for a tiny model that must copy rather than paraphrase: a question names its table
and columns verbatim, a string value is single-quoted in the question exactly as in the SQL, a number
is written the same in both, and each question form maps to one query form in one canonical style
(uppercase keywords, single spaces, `T1`/`T2` aliases in joins, no semicolon). The wrong queries differ
from gold at the one or two tokens that the question's wording decides ("largest" DESC vs "smallest"
ASC, "greater than" > vs "less than" <, MAX vs MIN, a column, a filter), so a policy that mixes them
into its warm-start traces leaves RL a real choice to teach.
"""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .reward import Row, has_top_level_order_by, results_match
from .schemas import Column, Domain, Table, domain_of

LEVELS: tuple[int, ...] = (1, 2, 3, 4, 5)
MIN_WRONG = 2
MAX_WRONG = 4

_CMP_WORDS = {">": "greater than", "<": "less than"}
_FLIP = {">": "<", "<": ">"}
_DIRECTION = {"largest": "DESC", "smallest": "ASC"}
_FLIP_DIRECTION = {"DESC": "ASC", "ASC": "DESC"}
_AGG_WORDS = {"average": "AVG", "largest": "MAX", "smallest": "MIN", "total": "SUM"}
_AGG_NEAREST = {
    "AVG": ("SUM", "MAX", "MIN"),
    "SUM": ("AVG", "MAX", "MIN"),
    "MAX": ("MIN", "AVG", "SUM"),
    "MIN": ("MAX", "AVG", "SUM"),
}
"""Each aggregate's near misses, the likeliest confusion first (wrong lists are cut to MAX_WRONG)."""


@dataclass(frozen=True)
class Question:
    """One instantiated template, checked on its database."""

    level: int
    template: str
    question: str
    gold_sql: str
    wrong_sql: tuple[str, ...]


@dataclass(frozen=True)
class Draft:
    question: str
    gold_sql: str
    wrong_sql: list[str]


class DbView:
    """A read-only connection to one database plus the lookups the templates need."""

    def __init__(self, db_id: str, path: Path) -> None:
        self.db_id = db_id
        self.domain: Domain = domain_of(db_id)
        self.conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        self._distinct: dict[tuple[str, str], list[object]] = {}

    def rows(self, sql: str) -> list[Row] | None:
        """The query's rows, or None if it fails (a template's wrong query must run, or it is dropped)."""
        try:
            return [tuple(r) for r in self.conn.execute(sql).fetchall()]
        except sqlite3.Error:
            return None

    def distinct(self, table: Table, column: Column) -> list[object]:
        """The column's values present in this database, sorted: what a filter may name."""
        key = (table.name, column.name)
        if key not in self._distinct:
            rows = self.rows(f"SELECT DISTINCT {column.name} FROM {table.name} ORDER BY {column.name}") or []
            self._distinct[key] = [r[0] for r in rows]
        return self._distinct[key]

    def close(self) -> None:
        self.conn.close()


Template = Callable[[random.Random, DbView], Draft | None]


def lit(value: object) -> str:
    """A value as both the question and the SQL write it: strings single-quoted, numbers bare."""
    if isinstance(value, str):
        assert "'" not in value, value
        return f"'{value}'"
    return str(value)


def _a(word: str) -> str:
    return f"an {word}" if word[0] in "aeiou" else f"a {word}"


def _join(child: Table, fk: Column) -> str:
    return f"FROM {child.name} AS T1 JOIN {fk.ref} AS T2 ON T1.{fk.name} = T2.{fk.name}"


def _output(rng: random.Random, table: Table, exclude: set[str]) -> Column | None:
    """A column to ask for: the table's label column more often than not (the natural answer)."""
    label = table.label
    if label is not None and label.name not in exclude and rng.random() < 0.6:
        return label
    options = [c for c in table.values if c.name not in exclude]
    return rng.choice(options) if options else None


def _others(table: Table, exclude: set[str], *, same_as: Column | None = None) -> list[Column]:
    """Value columns other than `exclude`, of the same kind (text or number) as `same_as` first."""
    rest = [c for c in table.values if c.name not in exclude]
    if same_as is None:
        return rest
    same = [c for c in rest if c.is_text == same_as.is_text]
    return same + [c for c in rest if c.is_text != same_as.is_text]


def _same_kind(table: Table, column: Column) -> list[Column]:
    """Other category columns of a category, other number columns of a number: the confusable ones."""
    return [c for c in table.columns if c.kind == column.kind and c.name != column.name]


def _interior(values: list[object]) -> list[object]:
    """Thresholds strictly between the smallest and largest value, so both > and < select rows."""
    return values[1:-1] if len(values) >= 3 else []


def _untied(view: DbView, sql: str) -> bool:
    """Whether a top-2 query's first two values differ: ORDER BY ... LIMIT 1 then has one answer."""
    rows = view.rows(sql)
    return rows is not None and (len(rows) == 1 or (len(rows) == 2 and rows[0][0] != rows[1][0]))


def _numeric(view: DbView, table: Table) -> list[Column]:
    return [c for c in table.nums if len(view.distinct(table, c)) >= 3]


def _few_valued(view: DbView, table: Table) -> list[Column]:
    """Columns whose values repeat: an equality filter on them selects several rows."""
    return [c for c in table.cats + table.nums if 2 <= len(view.distinct(table, c)) <= 12]


# Level 1: counting and selecting with one equality filter.


def count_eq(rng: random.Random, view: DbView) -> Draft | None:
    t = rng.choice(view.domain.tables)
    cols = _few_valued(view, t)
    if not cols:
        return None
    c = rng.choice(cols)
    v = lit(rng.choice(view.distinct(t, c)))
    base = f"SELECT COUNT(*) FROM {t.name}"
    wrong = [f"{base} WHERE {c.name} != {v}", base]
    wrong += [f"{base} WHERE {o.name} = {v}" for o in _same_kind(t, c)[:1]]
    return Draft(f"How many {t.name} rows have {c.name} {v}?", f"{base} WHERE {c.name} = {v}", wrong)


def list_eq(rng: random.Random, view: DbView) -> Draft | None:
    t = rng.choice(view.domain.tables)
    cols = [c for c in _few_valued(view, t) if c.is_text]
    if not cols:
        return None
    c = rng.choice(cols)
    o = _output(rng, t, {c.name})
    if o is None:
        return None
    v = lit(rng.choice(view.distinct(t, c)))
    gold = f"SELECT {o.name} FROM {t.name} WHERE {c.name} = {v}"
    wrong = [f"SELECT {o.name} FROM {t.name} WHERE {c.name} != {v}", f"SELECT {o.name} FROM {t.name}"]
    wrong += [
        f"SELECT {x.name} FROM {t.name} WHERE {c.name} = {v}"
        for x in _others(t, {c.name, o.name}, same_as=o)[:1]
    ]
    return Draft(f"List the {o.name} of each {t.name} whose {c.name} is {v}.", gold, wrong)


def lookup(rng: random.Random, view: DbView) -> Draft | None:
    t = rng.choice(view.domain.tables)
    label = t.label
    if label is None:
        return None
    o = _output(rng, t, {label.name})
    if o is None:
        return None
    v = lit(rng.choice(view.distinct(t, label)))
    gold = f"SELECT {o.name} FROM {t.name} WHERE {label.name} = {v}"
    wrong = [
        f"SELECT {x.name} FROM {t.name} WHERE {label.name} = {v}"
        for x in _others(t, {label.name, o.name}, same_as=o)[:2]
    ]
    wrong.append(f"SELECT {o.name} FROM {t.name}")
    return Draft(f"What is the {o.name} of the {t.name} with {label.name} {v}?", gold, wrong)


# Level 2: comparisons and superlatives.


def count_cmp(rng: random.Random, view: DbView) -> Draft | None:
    t = rng.choice(view.domain.tables)
    nums = _numeric(view, t)
    if not nums:
        return None
    n = rng.choice(nums)
    v = rng.choice(_interior(view.distinct(t, n)))
    op = rng.choice([">", "<"])
    base = f"SELECT COUNT(*) FROM {t.name}"
    wrong = [f"{base} WHERE {n.name} {_FLIP[op]} {v}", f"{base} WHERE {n.name} {op}= {v}", base]
    return Draft(
        f"How many {t.name} rows have {n.name} {_CMP_WORDS[op]} {v}?",
        f"{base} WHERE {n.name} {op} {v}",
        wrong,
    )


def list_cmp(rng: random.Random, view: DbView) -> Draft | None:
    t = rng.choice(view.domain.tables)
    nums = _numeric(view, t)
    if not nums:
        return None
    n = rng.choice(nums)
    o = _output(rng, t, {n.name})
    if o is None:
        return None
    v = rng.choice(_interior(view.distinct(t, n)))
    op = rng.choice([">", "<"])
    select = f"SELECT {o.name} FROM {t.name}"
    wrong = [f"{select} WHERE {n.name} {_FLIP[op]} {v}", f"{select} WHERE {n.name} {op}= {v}"]
    wrong += [f"{select} WHERE {m.name} {op} {v}" for m in t.nums if m.name not in (n.name, o.name)][:1]
    question = f"List the {o.name} of each {t.name} with {n.name} {_CMP_WORDS[op]} {v}."
    return Draft(question, f"{select} WHERE {n.name} {op} {v}", wrong)


def superlative(rng: random.Random, view: DbView) -> Draft | None:
    t = rng.choice(view.domain.tables)
    nums = _numeric(view, t)
    if not nums:
        return None
    n = rng.choice(nums)
    o = _output(rng, t, {n.name})
    if o is None:
        return None
    word = rng.choice(list(_DIRECTION))
    d = _DIRECTION[word]
    if not _untied(view, f"SELECT {n.name} FROM {t.name} ORDER BY {n.name} {d} LIMIT 2"):
        return None
    gold = f"SELECT {o.name} FROM {t.name} ORDER BY {n.name} {d} LIMIT 1"
    wrong = [f"SELECT {o.name} FROM {t.name} ORDER BY {n.name} {_FLIP_DIRECTION[d]} LIMIT 1"]
    wrong += [
        f"SELECT {o.name} FROM {t.name} ORDER BY {m.name} {d} LIMIT 1"
        for m in t.nums
        if m.name not in (n.name, o.name)
    ]
    wrong += [
        f"SELECT {x.name} FROM {t.name} ORDER BY {n.name} {d} LIMIT 1"
        for x in _others(t, {n.name, o.name}, same_as=o)[:1]
    ]
    return Draft(f"What is the {o.name} of the {t.name} with the {word} {n.name}?", gold, wrong)


def extreme(rng: random.Random, view: DbView) -> Draft | None:
    t = rng.choice(view.domain.tables)
    nums = _numeric(view, t)
    if not nums:
        return None
    n = rng.choice(nums)
    word = rng.choice(list(_DIRECTION))
    agg = "MAX" if word == "largest" else "MIN"
    gold = f"SELECT {agg}({n.name}) FROM {t.name}"
    wrong = [
        f"SELECT {'MIN' if agg == 'MAX' else 'MAX'}({n.name}) FROM {t.name}",
        f"SELECT AVG({n.name}) FROM {t.name}",
    ]
    wrong += [f"SELECT {agg}({m.name}) FROM {t.name}" for m in t.nums if m.name != n.name][:1]
    return Draft(f"What is the {word} {n.name} of any {t.name}?", gold, wrong)


# Level 3: grouping.


def _grouping(rng: random.Random, view: DbView) -> tuple[Table, Column] | None:
    options = [(t, c) for t in view.domain.tables for c in t.cats if len(view.distinct(t, c)) >= 2]
    return rng.choice(options) if options else None


def count_by_group(rng: random.Random, view: DbView) -> Draft | None:
    picked = _grouping(rng, view)
    if picked is None:
        return None
    t, c = picked
    gold = f"SELECT {c.name}, COUNT(*) FROM {t.name} GROUP BY {c.name}"
    wrong = [f"SELECT {x.name}, COUNT(*) FROM {t.name} GROUP BY {x.name}" for x in _same_kind(t, c)[:1]]
    wrong += [f"SELECT {c.name}, COUNT(*) FROM {t.name}", f"SELECT COUNT(*) FROM {t.name}"]
    return Draft(f"How many {t.name} rows are there for each {c.name}?", gold, wrong)


def agg_by_group(rng: random.Random, view: DbView) -> Draft | None:
    picked = _grouping(rng, view)
    if picked is None or not picked[0].nums:
        return None
    t, c = picked
    n = rng.choice(t.nums)
    word = rng.choice(list(_AGG_WORDS))
    agg = _AGG_WORDS[word]
    gold = f"SELECT {c.name}, {agg}({n.name}) FROM {t.name} GROUP BY {c.name}"
    wrong = [f"SELECT {c.name}, {a}({n.name}) FROM {t.name} GROUP BY {c.name}" for a in _AGG_NEAREST[agg]]
    wrong += [
        f"SELECT {c.name}, {agg}({m.name}) FROM {t.name} GROUP BY {c.name}"
        for m in t.nums
        if m.name != n.name
    ][:1]
    return Draft(f"What is the {word} {n.name} of {t.name} rows for each {c.name}?", gold, wrong)


def most_group(rng: random.Random, view: DbView) -> Draft | None:
    picked = _grouping(rng, view)
    if picked is None:
        return None
    t, c = picked
    word, d = rng.choice([("most", "DESC"), ("fewest", "ASC")])
    top2 = f"SELECT COUNT(*) FROM {t.name} GROUP BY {c.name} ORDER BY COUNT(*) {d} LIMIT 2"
    if not _untied(view, top2):
        return None
    group = f"FROM {t.name} GROUP BY {c.name}"
    gold = f"SELECT {c.name} {group} ORDER BY COUNT(*) {d} LIMIT 1"
    wrong = [f"SELECT {c.name} {group} ORDER BY COUNT(*) {_FLIP_DIRECTION[d]} LIMIT 1"]
    wrong += [
        f"SELECT {x.name} FROM {t.name} GROUP BY {x.name} ORDER BY COUNT(*) {d} LIMIT 1"
        for x in t.cats
        if x.name != c.name
    ][:1]
    wrong.append(f"SELECT {c.name} {group} ORDER BY {c.name} {d} LIMIT 1")
    return Draft(f"Which {c.name} has the {word} {t.name} rows?", gold, wrong)


def having(rng: random.Random, view: DbView) -> Draft | None:
    picked = _grouping(rng, view)
    if picked is None:
        return None
    t, c = picked
    counts = sorted(
        {int(str(r[0])) for r in view.rows(f"SELECT COUNT(*) FROM {t.name} GROUP BY {c.name}") or []}
    )
    if len(counts) < 2:
        return None
    op = rng.choice([">", "<"])
    k = rng.randint(counts[0], counts[-1] - 1) if op == ">" else rng.randint(counts[0] + 1, counts[-1])
    group = f"SELECT {c.name} FROM {t.name} GROUP BY {c.name}"
    wrong = [f"{group} HAVING COUNT(*) {_FLIP[op]} {k}", f"{group} HAVING COUNT(*) {op}= {k}", group]
    words = "more than" if op == ">" else "fewer than"
    return Draft(
        f"List each {c.name} with {words} {k} {t.name} rows.", f"{group} HAVING COUNT(*) {op} {k}", wrong
    )


# Level 4: joins across a foreign key.


def _edge(rng: random.Random, view: DbView) -> tuple[Table, Column, Table] | None:
    edges = view.domain.edges()
    return rng.choice(edges) if edges else None


def join_filter(rng: random.Random, view: DbView) -> Draft | None:
    edge = _edge(rng, view)
    if edge is None:
        return None
    child, fk, parent = edge
    filters = [c for c in parent.cats if len(view.distinct(parent, c)) >= 2] or (
        [parent.label] if parent.label else []
    )
    o = _output(rng, child, set())
    if not filters or o is None:
        return None
    pc = rng.choice(filters)
    join = _join(child, fk)
    present = view.rows(f"SELECT DISTINCT T2.{pc.name} {join} ORDER BY T2.{pc.name}") or []
    if not present:
        return None
    v = lit(rng.choice(present)[0])
    select = f"SELECT T1.{o.name} {join}"
    wrong = [select, f"{select} WHERE T2.{pc.name} != {v}"]
    wrong += [
        f"SELECT T1.{x.name} {join} WHERE T2.{pc.name} = {v}" for x in _others(child, {o.name}, same_as=o)[:1]
    ]
    question = f"List the {o.name} of each {child.name} whose {parent.name} has {pc.name} {v}."
    return Draft(question, f"{select} WHERE T2.{pc.name} = {v}", wrong)


def join_count_cmp(rng: random.Random, view: DbView) -> Draft | None:
    edge = _edge(rng, view)
    if edge is None:
        return None
    child, fk, parent = edge
    nums = _numeric(view, parent)
    if not nums:
        return None
    pn = rng.choice(nums)
    join = _join(child, fk)
    present = [r[0] for r in view.rows(f"SELECT DISTINCT T2.{pn.name} {join} ORDER BY T2.{pn.name}") or []]
    if not _interior(present):
        return None
    v = rng.choice(_interior(present))
    op = rng.choice([">", "<"])
    base = f"SELECT COUNT(*) {join}"
    wrong = [f"{base} WHERE T2.{pn.name} {_FLIP[op]} {v}", f"{base} WHERE T2.{pn.name} {op}= {v}", base]
    question = f"How many {child.name} rows have {_a(parent.name)} with {pn.name} {_CMP_WORDS[op]} {v}?"
    return Draft(question, f"{base} WHERE T2.{pn.name} {op} {v}", wrong)


def join_superlative(rng: random.Random, view: DbView) -> Draft | None:
    edge = _edge(rng, view)
    if edge is None:
        return None
    child, fk, parent = edge
    nums = _numeric(view, child)
    o = _output(rng, parent, set())
    if not nums or o is None:
        return None
    n = rng.choice(nums)
    word = rng.choice(list(_DIRECTION))
    d = _DIRECTION[word]
    if not _untied(view, f"SELECT {n.name} FROM {child.name} ORDER BY {n.name} {d} LIMIT 2"):
        return None
    join = _join(child, fk)
    gold = f"SELECT T2.{o.name} {join} ORDER BY T1.{n.name} {d} LIMIT 1"
    wrong = [f"SELECT T2.{o.name} {join} ORDER BY T1.{n.name} {_FLIP_DIRECTION[d]} LIMIT 1"]
    wrong += [
        f"SELECT T2.{o.name} {join} ORDER BY T1.{m.name} {d} LIMIT 1" for m in child.nums if m.name != n.name
    ][:1]
    wrong += [
        f"SELECT T2.{x.name} {join} ORDER BY T1.{n.name} {d} LIMIT 1"
        for x in _others(parent, {o.name}, same_as=o)[:1]
    ]
    question = f"What is the {o.name} of the {parent.name} of the {child.name} with the {word} {n.name}?"
    return Draft(question, gold, wrong)


def join_group_count(rng: random.Random, view: DbView) -> Draft | None:
    edge = _edge(rng, view)
    if edge is None or edge[2].label is None:
        return None
    child, fk, parent = edge
    label = parent.label
    assert label is not None
    join = _join(child, fk)
    gold = f"SELECT T2.{label.name}, COUNT(*) {join} GROUP BY T2.{label.name}"
    wrong = [f"SELECT T2.{label.name}, COUNT(*) {join}"]
    wrong += [f"SELECT T2.{c.name}, COUNT(*) {join} GROUP BY T2.{c.name}" for c in parent.cats][:1]
    wrong += [
        f"SELECT T2.{label.name}, SUM(T1.{n.name}) {join} GROUP BY T2.{label.name}" for n in child.nums
    ][:1]
    return Draft(f"For each {parent.name} {label.name}, how many {child.name} rows are there?", gold, wrong)


# Level 5: nested queries.


def above_average(rng: random.Random, view: DbView) -> Draft | None:
    t = rng.choice(view.domain.tables)
    nums = _numeric(view, t)
    if not nums:
        return None
    n = rng.choice(nums)
    o = _output(rng, t, {n.name})
    if o is None:
        return None
    word, op = rng.choice([("above", ">"), ("below", "<")])
    select = f"SELECT {o.name} FROM {t.name}"
    gold = f"{select} WHERE {n.name} {op} (SELECT AVG({n.name}) FROM {t.name})"
    bound = "MIN" if op == ">" else "MAX"
    wrong = [
        f"{select} WHERE {n.name} {_FLIP[op]} (SELECT AVG({n.name}) FROM {t.name})",
        f"{select} WHERE {n.name} {op} (SELECT {bound}({n.name}) FROM {t.name})",
    ]
    wrong += [
        f"{select} WHERE {m.name} {op} (SELECT AVG({m.name}) FROM {t.name})"
        for m in t.nums
        if m.name not in (n.name, o.name)
    ][:1]
    return Draft(f"List the {o.name} of each {t.name} with {n.name} {word} the average.", gold, wrong)


def count_above_average(rng: random.Random, view: DbView) -> Draft | None:
    t = rng.choice(view.domain.tables)
    nums = _numeric(view, t)
    if not nums:
        return None
    n = rng.choice(nums)
    word, op = rng.choice([("above", ">"), ("below", "<")])
    base = f"SELECT COUNT(*) FROM {t.name}"
    bound = "MIN" if op == ">" else "MAX"
    gold = f"{base} WHERE {n.name} {op} (SELECT AVG({n.name}) FROM {t.name})"
    wrong = [
        f"{base} WHERE {n.name} {_FLIP[op]} (SELECT AVG({n.name}) FROM {t.name})",
        f"{base} WHERE {n.name} {op} (SELECT {bound}({n.name}) FROM {t.name})",
        base,
    ]
    return Draft(f"How many {t.name} rows have {n.name} {word} the average?", gold, wrong)


def not_in(rng: random.Random, view: DbView) -> Draft | None:
    edge = _edge(rng, view)
    if edge is None:
        return None
    child, fk, parent = edge
    o = _output(rng, parent, set())
    if o is None:
        return None
    select = f"SELECT {o.name} FROM {parent.name}"
    inner = f"(SELECT {fk.name} FROM {child.name})"
    gold = f"{select} WHERE {fk.name} NOT IN {inner}"
    wrong = [f"{select} WHERE {fk.name} IN {inner}", select]
    wrong += [
        f"SELECT {x.name} FROM {parent.name} WHERE {fk.name} NOT IN {inner}"
        for x in _others(parent, {o.name}, same_as=o)[:1]
    ]
    return Draft(f"List the {o.name} of each {parent.name} that has no {child.name} rows.", gold, wrong)


def in_filter(rng: random.Random, view: DbView) -> Draft | None:
    edge = _edge(rng, view)
    if edge is None:
        return None
    child, fk, parent = edge
    filters = [c for c in child.cats if len(view.distinct(child, c)) >= 2]
    o = _output(rng, parent, set())
    if not filters or o is None:
        return None
    cc = rng.choice(filters)
    v = lit(rng.choice(view.distinct(child, cc)))
    select = f"SELECT {o.name} FROM {parent.name}"
    gold = f"{select} WHERE {fk.name} IN (SELECT {fk.name} FROM {child.name} WHERE {cc.name} = {v})"
    wrong = [
        f"{select} WHERE {fk.name} NOT IN (SELECT {fk.name} FROM {child.name} WHERE {cc.name} = {v})",
        f"{select} WHERE {fk.name} IN (SELECT {fk.name} FROM {child.name})",
        f"{select} WHERE {fk.name} IN (SELECT {fk.name} FROM {child.name} WHERE {cc.name} != {v})",
    ]
    question = f"List the {o.name} of each {parent.name} that has {_a(child.name)} with {cc.name} {v}."
    return Draft(question, gold, wrong)


TEMPLATES: dict[int, tuple[Template, ...]] = {
    1: (count_eq, list_eq, lookup),
    2: (count_cmp, list_cmp, superlative, extreme),
    3: (count_by_group, agg_by_group, most_group, having),
    4: (join_filter, join_count_cmp, join_superlative, join_group_count),
    5: (above_average, count_above_average, not_in, in_filter),
}


def _meaningful(rows: list[Row]) -> bool:
    """A gold result worth asking for: some rows, not all NULL, and a count above zero."""
    if not rows or all(v is None for r in rows for v in r):
        return False
    return not (len(rows) == 1 and len(rows[0]) == 1 and rows[0][0] == 0)


def make_question(rng: random.Random, view: DbView, level: int) -> Question | None:
    """One question of the level on the database, or None when the drawn template does not fit it.

    The gold result must be non-empty, and only wrong queries that run and give a different result
    (as `execution_match` compares them) are kept; a question with fewer than two is dropped.
    """
    template = rng.choice(TEMPLATES[level])
    draft = template(rng, view)
    if draft is None:
        return None
    gold = view.rows(draft.gold_sql)
    if gold is None or not _meaningful(gold):
        return None
    ordered = has_top_level_order_by(draft.gold_sql)
    wrong: list[str] = []
    for sql in draft.wrong_sql:
        if sql == draft.gold_sql or sql in wrong:
            continue
        rows = view.rows(sql)
        if rows is not None and not results_match(rows, gold, ordered=ordered):
            wrong.append(sql)
    if len(wrong) < MIN_WRONG:
        return None
    return Question(level, template.__name__, draft.question, draft.gold_sql, tuple(wrong[:MAX_WRONG]))
