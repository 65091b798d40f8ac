"""The SQL tables of the store and the conversions between their rows and the pydantic models.

Columns exist for what queries filter or order on; everything else (a task, span attributes and
events) is one JSON text column, written once with pydantic's serializer and read back the same way.
A span is stored as JSON, so reading a page of spans is one parse per span.

Spans have two layouts. PostgreSQL keeps `spans` with its ids as text columns. SQLite keeps
`keyed_spans` (also named `spans` in the file): each id and name is a small integer key into
`span_keys`, where each distinct string is stored once, so the row and its four indexes hold a few
bytes per id instead of 32 characters, and the body leaves out what those columns hold
(`span_codec`, format 0x03). A store file written with the text layout is moved over when it is
opened (`sqlite_spans.upgrade`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
)

from reinforge.types import (
    Attempt,
    AttemptStatus,
    ResourcesVersion,
    Rollout,
    RolloutMode,
    RolloutStatus,
    Span,
)

# SQLite only auto-numbers a column declared exactly INTEGER PRIMARY KEY, and only such a column is
# the row's own number rather than a key kept again in an index of its own.
_Serial = BigInteger().with_variant(Integer(), "sqlite")

metadata = MetaData()

rollouts = Table(
    "rollouts",
    metadata,
    Column("seq", _Serial, primary_key=True, autoincrement=True),
    Column("rollout_id", String(128), nullable=False, unique=True),
    Column("status", String(16), nullable=False),
    Column("mode", String(8), nullable=False),
    Column("task_id", String(128)),
    Column("group_id", String(128)),
    Column("resources_version", BigInteger),
    Column("max_attempts", Integer, nullable=False),
    Column("attempt_count", Integer, nullable=False),
    Column("current_attempt_id", String(64)),
    Column("reward", Float),
    Column("error", Text),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    Column("finished_at", Float),
    Column("task", Text, nullable=False),
    Column("metadata", Text, nullable=False),
    # The lease scans queued rollouts oldest first; the others serve the query filters.
    Index("ix_rollouts_status_seq", "status", "seq"),
    Index("ix_rollouts_group", "group_id"),
    Index("ix_rollouts_task", "task_id"),
)

attempts = Table(
    "attempts",
    metadata,
    Column("attempt_id", String(64), primary_key=True),
    Column("rollout_seq", BigInteger, nullable=False),
    Column("rollout_id", String(128), nullable=False),
    Column("attempt_no", Integer, nullable=False),
    Column("runner_id", String(256), nullable=False),
    Column("status", String(16), nullable=False),
    Column("started_at", Float, nullable=False),
    Column("lease_deadline", Float, nullable=False),
    Column("last_heartbeat", Float, nullable=False),
    Column("finished_at", Float),
    Column("reward", Float),
    Column("error", Text),
    # Queries list attempts by rollout.
    Index("ix_attempts_rollout", "rollout_seq", "attempt_no"),
    Index("ix_attempts_runner", "runner_id"),
)
# Expiry looks for running attempts past their deadline. On SQLite only running attempts are in
# the index (its statements name the status as a literal, which a partial index needs), so it stays
# a page or two however many attempts have finished.
Index(
    "ix_attempts_status_deadline",
    attempts.c.status,
    attempts.c.lease_deadline,
    sqlite_where=attempts.c.status == "running",
)

text_spans_metadata = MetaData()
"""The text-id span layout (PostgreSQL's), apart from `metadata` so SQLite never creates it."""

spans = Table(
    "spans",
    text_spans_metadata,
    Column("sequence", _Serial, primary_key=True, autoincrement=True),
    Column("span_id", String(16), nullable=False, unique=True),
    Column("trace_id", String(32), nullable=False),
    Column("rollout_id", String(128), nullable=False),
    Column("attempt_id", String(128), nullable=False),
    Column("name", String(512), nullable=False),
    Column("body", Text, nullable=False),
    Index("ix_spans_rollout", "rollout_id", "sequence"),
    Index("ix_spans_attempt", "attempt_id", "sequence"),
    Index("ix_spans_trace", "trace_id", "sequence"),
    Index("ix_spans_name", "name", "sequence"),
)

keyed_spans_metadata = MetaData()
"""SQLite's span layout: ids and names as keys into `span_keys` (or `rollouts`)."""

span_keys = Table(
    "span_keys",
    keyed_spans_metadata,
    Column("key", Integer, primary_key=True),
    Column("value", Text, nullable=False, unique=True),
)

keyed_spans = Table(
    "spans",
    keyed_spans_metadata,
    Column("sequence", Integer, primary_key=True, autoincrement=True),
    # The 16 hex digits as 8 bytes (`sqlite_spans.span_id_key`).
    Column("span_id", LargeBinary, nullable=False, unique=True),
    # The rollout's `rollouts.seq`, or minus its `span_keys` key for a rollout the store doesn't hold.
    Column("rollout_key", Integer, nullable=False),
    Column("attempt_key", Integer, nullable=False),
    # NULL: the same as the attempt id (as every span the gateway records), so the trace index
    # holds only the spans whose trace is something else.
    Column("trace_key", Integer),
    Column("name_key", Integer, nullable=False),
    Column("body", LargeBinary, nullable=False),
    Index("ix_spans_rollout", "rollout_key", "sequence"),
    Index("ix_spans_attempt", "attempt_key", "sequence"),
    # No index on the name: the names are few, and the one query by name (the gateway's final
    # reward) also names the attempt.
)
Index(
    "ix_spans_trace",
    keyed_spans.c.trace_key,
    keyed_spans.c.sequence,
    sqlite_where=keyed_spans.c.trace_key.is_not(None),
)

resources = Table(
    "resources",
    metadata,
    # On SQLite the row's own number (no second copy of the key in an index of its own).
    Column("version", _Serial, primary_key=True, autoincrement=False),
    Column("body", Text, nullable=False),
    Column("created_at", Float, nullable=False),
)


def rollout_from_row(row: Any) -> Rollout:
    return rollout_from_mapping(row._mapping)


def rollout_from_mapping(m: Mapping[str, Any]) -> Rollout:
    """A Rollout from a `rollouts` row's columns by name (SQLAlchemy's row mapping, or a dict)."""
    return Rollout(
        rollout_id=m["rollout_id"],
        task=json.loads(m["task"]),
        task_id=m["task_id"],
        mode=RolloutMode(m["mode"]),
        group_id=m["group_id"],
        resources_version=m["resources_version"],
        status=RolloutStatus(m["status"]),
        max_attempts=m["max_attempts"],
        attempt_count=m["attempt_count"],
        reward=m["reward"],
        error=m["error"],
        created_at=m["created_at"],
        updated_at=m["updated_at"],
        finished_at=m["finished_at"],
        metadata=json.loads(m["metadata"]),
    )


def attempt_from_row(row: Any) -> Attempt:
    m = row._mapping
    return Attempt(
        attempt_id=m["attempt_id"],
        rollout_id=m["rollout_id"],
        attempt_no=m["attempt_no"],
        runner_id=m["runner_id"],
        status=AttemptStatus(m["status"]),
        started_at=m["started_at"],
        lease_deadline=m["lease_deadline"],
        last_heartbeat=m["last_heartbeat"],
        finished_at=m["finished_at"],
        reward=m["reward"],
        error=m["error"],
    )


def span_from_row(sequence: int, body: str) -> Span:
    """A span from its row's `sequence` and `body` columns."""
    span = Span.model_validate_json(body)
    span.sequence = sequence
    return span


def resources_from_row(row: Any) -> ResourcesVersion:
    m = row._mapping
    return ResourcesVersion(version=m["version"], resources=json.loads(m["body"]), created_at=m["created_at"])
