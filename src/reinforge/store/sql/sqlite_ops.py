"""The SQL store's per-rollout statements on SQLite, run on the raw sqlite3 cursor.

A lease or a finish is a handful of one-row statements. Through SQLAlchemy Core their parameter and
result processing was a large share of each operation's CPU (docs/benchmarks-spine.md), on the
event loop that every other request waits for.
On the raw cursor, inside the same transaction, they are the statements `sql_statements` builds for
SQLite, written out. PostgreSQL keeps the SQLAlchemy path (row locks; it runs in a thread pool).
"""

from __future__ import annotations

import sqlite3
from typing import Any

from sqlalchemy import Connection

from reinforge.store.sql.schema import rollout_from_mapping
from reinforge.types import Rollout, RolloutStatus

_ROLLOUT_COLUMNS = (
    "seq",
    "rollout_id",
    "status",
    "mode",
    "task_id",
    "group_id",
    "resources_version",
    "max_attempts",
    "attempt_count",
    "reward",
    "error",
    "created_at",
    "updated_at",
    "finished_at",
    "task",
    "metadata",
)
_SELECT_ROLLOUTS = "SELECT " + ", ".join(f"rollouts.{c}" for c in _ROLLOUT_COLUMNS) + " FROM rollouts"

ANY_DUE = "SELECT 1 FROM attempts WHERE status = 'running' AND lease_deadline < ? LIMIT 1"
LEASE_ANY = _SELECT_ROLLOUTS + " WHERE rollouts.status = 'queued' ORDER BY rollouts.seq LIMIT ?"
LEASE_MODE = (
    _SELECT_ROLLOUTS + " WHERE rollouts.status = 'queued' AND rollouts.mode = ? ORDER BY rollouts.seq LIMIT ?"
)
INSERT_ATTEMPT = (
    "INSERT INTO attempts (attempt_id, rollout_seq, rollout_id, attempt_no, runner_id, status, "
    "started_at, lease_deadline, last_heartbeat, finished_at, reward, error) "
    "VALUES (?, ?, ?, ?, ?, 'running', ?, ?, ?, NULL, NULL, NULL)"
)
LEASE_ROLLOUT = (
    "UPDATE rollouts SET status = 'running', attempt_count = ?, current_attempt_id = ?, updated_at = ? "
    "WHERE seq = ?"
)
FINISH_ROLLOUT = (
    _SELECT_ROLLOUTS + " JOIN attempts ON attempts.rollout_seq = rollouts.seq WHERE attempts.attempt_id = ?"
)
FINISH_ATTEMPT = (
    "UPDATE attempts SET status = ?, finished_at = ?, reward = ?, error = ? "
    "WHERE attempt_id = ? AND status = 'running' RETURNING attempt_id"
)
FINISH_UPDATE_ROLLOUT = (
    "UPDATE rollouts SET status = ?, updated_at = ?, error = ?, finished_at = ?, reward = ?, "
    "current_attempt_id = NULL WHERE seq = ?"
)

# A wait's look at its pending rollouts. `status || ''` hides the status index, so SQLite looks the
# few ids up instead of walking every final rollout ever stored (as `Statements.final_by_id`).
_IDS = "SELECT value FROM json_each(?)"
EXISTING_IDS = f"SELECT rollout_id FROM rollouts WHERE rollout_id IN ({_IDS})"
FINAL_BY_ID = (
    _SELECT_ROLLOUTS
    + f" WHERE rollouts.rollout_id IN ({_IDS}) AND (rollouts.status || '') IN "
    + "("
    + ", ".join(f"'{s.value}'" for s in RolloutStatus if s.is_final)
    + ")"
)
NEXT_DEADLINE = "SELECT min(lease_deadline) FROM attempts WHERE status = 'running'"


def cursor(conn: Connection) -> sqlite3.Cursor:
    """A cursor on the SQLAlchemy connection's own sqlite3 connection (so: in its transaction)."""
    driver = conn.connection.driver_connection
    assert isinstance(driver, sqlite3.Connection)
    return driver.cursor()


def rollout_from_values(row: tuple[Any, ...]) -> tuple[int, Rollout]:
    """(seq, rollout) from a row of `_SELECT_ROLLOUTS`."""
    return row[0], rollout_from_mapping(dict(zip(_ROLLOUT_COLUMNS, row, strict=True)))
