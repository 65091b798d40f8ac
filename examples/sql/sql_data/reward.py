"""Execution-match reward: a predicted query scores 1 when it returns what the gold query returns.

A policy's SQL is untrusted, so it runs on a read-only connection whose authorizer admits only reads,
with a progress handler that aborts it past a time budget: a reward call can neither change a database
nor hang a rollout worker.
"""

from __future__ import annotations

import os
import re
import sqlite3
import threading
import time
from collections import Counter, OrderedDict
from pathlib import Path

DEFAULT_TIMEOUT_S = 0.5
MAX_ROWS = 10_000
"""Results longer than this count as failures: no gold query here returns more than a few dozen rows."""

_ALLOWED_ACTIONS = frozenset(
    {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
)
_PROGRESS_STEPS = 1000
_SELECT_START = re.compile(r"^\s*(SELECT|WITH)\b", re.IGNORECASE)
_FENCE = re.compile(r"```[ \t]*(?:sql|sqlite)?[ \t]*\n?(.*?)(?:```|\Z)", re.IGNORECASE | re.DOTALL)
_LABEL = re.compile(r"^\s*(?:sql|query|answer)\s*:\s*", re.IGNORECASE)

Row = tuple[object, ...]


class QueryError(Exception):
    """The query was refused, failed, ran too long or returned too much."""


def _authorize(
    action: int, _arg1: str | None, _arg2: str | None, _db: str | None, _trigger: str | None
) -> int:
    return sqlite3.SQLITE_OK if action in _ALLOWED_ACTIONS else sqlite3.SQLITE_DENY


def _strip_statement(sql: str) -> str:
    text = sql.strip()
    while text.endswith(";"):
        text = text[:-1].rstrip()
    return text


def _connect(db_path: str | Path) -> sqlite3.Connection:
    """A read-only connection that refuses everything but reads (no writes, PRAGMA or ATTACH)."""
    uri = f"{Path(os.path.abspath(db_path)).as_uri()}?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
    except sqlite3.Error as exc:
        raise QueryError(f"cannot open {db_path}: {exc}") from exc
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 1_000_000)
    conn.set_authorizer(_authorize)
    return conn


class _Connections(threading.local):
    """Each thread's open read-only connections, most recent last: a reward call then skips opening the
    file and parsing its schema, which cost more than the tiny queries themselves."""

    def __init__(self) -> None:
        self.open: OrderedDict[tuple[str, int, int], sqlite3.Connection] = OrderedDict()


_CONNECTIONS = _Connections()
_MAX_OPEN = 64


def _cached_connection(db_path: str | Path) -> sqlite3.Connection:
    """A reused connection to the file; keyed by inode and mtime too, so a rebuilt file is reopened."""
    path = os.path.abspath(db_path)
    try:
        stat = os.stat(path)
    except OSError as exc:
        raise QueryError(f"cannot open {db_path}: {exc}") from exc
    key = (path, stat.st_ino, stat.st_mtime_ns)
    cache = _CONNECTIONS.open
    conn = cache.get(key)
    if conn is None:
        conn = cache[key] = _connect(path)
        while len(cache) > _MAX_OPEN:
            cache.popitem(last=False)[1].close()
    cache.move_to_end(key)
    return conn


def _execute(conn: sqlite3.Connection, sql: str, timeout_s: float) -> list[Row]:
    statement = _strip_statement(sql)
    if not _SELECT_START.match(statement):
        raise QueryError("only a single SELECT statement is allowed")
    deadline = time.monotonic() + timeout_s
    conn.set_progress_handler(lambda: int(time.monotonic() > deadline), _PROGRESS_STEPS)
    try:
        rows = conn.execute(statement).fetchmany(MAX_ROWS + 1)
    except (sqlite3.Error, sqlite3.Warning, ValueError, OverflowError) as exc:
        raise QueryError(str(exc)) from exc
    if len(rows) > MAX_ROWS:
        raise QueryError(f"more than {MAX_ROWS} rows")
    return [tuple(r) for r in rows]


def run_query(db_path: str | Path, sql: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[Row]:
    """The rows of one read-only SELECT (or WITH ... SELECT); raises QueryError for anything else."""
    return _execute(_cached_connection(db_path), sql, timeout_s)


def _normal(row: Row) -> Row:
    # AVG and friends may differ in the last bits between equivalent queries; 1 and 1.0 already compare equal.
    return tuple(round(v, 6) if isinstance(v, float) else v for v in row)


def has_top_level_order_by(sql: str) -> bool:
    """Whether the outermost query sorts (an ORDER BY inside a subquery does not fix the result's order)."""
    if "ORDER" not in sql.upper():
        return False
    depth = 0
    quote: str | None = None
    outer = []
    for ch in sql:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif depth == 0:
            outer.append(ch)
    return re.search(r"\bORDER\s+BY\b", "".join(outer), re.IGNORECASE) is not None


def results_match(predicted: list[Row], gold: list[Row], *, ordered: bool) -> bool:
    """Equal as lists when the gold query fixes an order, else equal as multisets of rows."""
    p, g = [_normal(r) for r in predicted], [_normal(r) for r in gold]
    return p == g if ordered else Counter(p) == Counter(g)


def execution_match(
    db_path: str | Path, predicted_sql: str, gold_sql: str, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> float:
    """1.0 when the predicted query returns gold's result on the database, else 0.0 (errors included)."""
    try:
        conn = _cached_connection(db_path)
        gold = _execute(conn, gold_sql, max(timeout_s, DEFAULT_TIMEOUT_S))
        predicted = _execute(conn, predicted_sql, timeout_s)
    except QueryError:
        return 0.0
    return 1.0 if results_match(predicted, gold, ordered=has_top_level_order_by(gold_sql)) else 0.0


def _first_statement(text: str) -> str:
    """Text up to the first `;` (or blank line) outside a string literal."""
    quote: str | None = None
    for i, ch in enumerate(text):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == ";" or text.startswith("\n\n", i):
            return text[:i]
    return text


def extract_sql(text: str) -> str:
    """The SQL in a model's reply: inside the first code fence if any, without a leading `SQL:` label,
    first statement only, no trailing semicolon."""
    fence = _FENCE.search(text)
    body = fence.group(1) if fence else text
    body = _LABEL.sub("", body.strip(), count=1)
    return _first_statement(body).strip()
