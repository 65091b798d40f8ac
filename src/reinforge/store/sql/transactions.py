"""The steps `SqlStore`'s transactions are made of: each a function of one connection and the
dialect's statements, so the store's methods read as what they do (check, run, raise, wake).

On SQLite the calls every rollout makes (lease, finish, the expiry probe, the waits' reads) run on the
raw sqlite3 cursor (`sqlite_ops`); everything else goes through SQLAlchemy Core.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, select

from reinforge.errors import NotFoundError, ReinforgeError, StaleAttemptError
from reinforge.store import rules
from reinforge.store.sql import sqlite_ops, sqlite_spans
from reinforge.store.sql.schema import rollout_from_row, span_from_row
from reinforge.store.sql.span_codec import SpanBodyCodec, span_dictionaries
from reinforge.store.sql.statements import Statements
from reinforge.types import (
    AttemptOutcome,
    LeasedRollout,
    Page,
    Rollout,
    RolloutMode,
    RolloutStatus,
    Span,
    SpanQuery,
)


@dataclass
class Effects:
    """What a transaction changed that waiters care about; fired after it commits."""

    queued: bool = False
    finalised: bool = False
    finalised_ids: set[str] | None = field(default_factory=set)
    """The rollouts it made final (None: some without a name), so a waiter can tell whether any of
    its own were among them without a query."""

    def finalise(self, rollout_id: str | None) -> None:
        self.finalised = True
        if rollout_id is None:
            self.finalised_ids = None
        elif self.finalised_ids is not None:
            self.finalised_ids.add(rollout_id)


def _stale(row: Any) -> StaleAttemptError:
    m = row._mapping
    return StaleAttemptError(
        f"attempt {m['attempt_id']!r} (try {m['attempt_no']} of rollout {m['rollout_id']!r}) is "
        f"{m['status']}, no longer the rollout's running attempt; its report was not counted"
    )


def _load_dictionary(conn: Connection, dict_id: int) -> bytes:
    row = conn.execute(select(span_dictionaries.c.body).where(span_dictionaries.c.dict_id == dict_id)).first()
    if row is None:
        raise ReinforgeError(f"span dictionary {dict_id} is missing from the store: its spans can't be read")
    return bytes(row[0])


def expire(conn: Connection, q: Statements, fx: Effects, now: float) -> None:
    """Time out running attempts whose lease passed; their rollouts retry or fail."""
    if not q.postgres:
        # Nearly always nothing is due: one probe of the status/deadline index answers that.
        with contextlib.closing(sqlite_ops.cursor(conn)) as cur:
            if cur.execute(sqlite_ops.ANY_DUE, (now,)).fetchone() is None:
                return
    due = conn.execute(q.expire_due, {"now": now}).scalars().all()
    if not due:
        return
    # Lock the rollouts first (the lock order everywhere); another store may be expiring them.
    locked = {row.seq: row for row in conn.execute(q.expire_lock, {"seqs": sorted(set(due))})}
    if not locked:
        return
    expired = conn.execute(q.expire_attempts, {"seqs": list(locked), "now": now}).all()
    if not expired:
        return
    attempt_rows, rollout_rows = [], []
    for a in expired:
        error = rules.expiry_error(a.attempt_no, a.runner_id)
        r = locked[a.rollout_seq]
        status = rules.after_expiry(r.attempt_count, r.max_attempts)
        attempt_rows.append({"b_id": a.attempt_id, "b_error": error})
        rollout_rows.append(
            {
                "b_seq": a.rollout_seq,
                "b_status": status.value,
                "b_error": error,
                "b_finished": now if status.is_final else None,
                "b_now": now,
            }
        )
        fx.queued |= status is RolloutStatus.queued
        if status.is_final:
            fx.finalise(None)  # the expiry reads rollouts by number, not by id
    conn.execute(q.set_attempt_error, attempt_rows)
    conn.execute(q.expire_rollouts, rollout_rows)


def next_deadline(conn: Connection, q: Statements) -> float | None:
    if q.postgres:
        deadline: float | None = conn.execute(q.next_deadline).scalar()
        return deadline
    with contextlib.closing(sqlite_ops.cursor(conn)) as cur:
        row = cur.execute(sqlite_ops.NEXT_DEADLINE).fetchone()
    return None if row is None else row[0]


def final_by_id(conn: Connection, q: Statements, ids: Sequence[str]) -> list[Rollout]:
    """The rollouts among `ids` that are final."""
    if q.postgres:
        return [rollout_from_row(r) for r in conn.execute(q.final_by_id, {"ids": q.ids(ids)})]
    with contextlib.closing(sqlite_ops.cursor(conn)) as cur:
        rows = cur.execute(sqlite_ops.FINAL_BY_ID, (q.ids(ids),)).fetchall()
    return [sqlite_ops.rollout_from_values(row)[1] for row in rows]


def missing_rollouts(conn: Connection, q: Statements, ids: Sequence[str]) -> NotFoundError | None:
    if q.postgres:
        found = {r.rollout_id for r in conn.execute(q.rollouts_by_id, {"ids": q.ids(ids)})}
    else:
        with contextlib.closing(sqlite_ops.cursor(conn)) as cur:
            found = {r[0] for r in cur.execute(sqlite_ops.EXISTING_IDS, (q.ids(ids),))}
    missing = [i for i in ids if i not in found]
    if missing:
        return NotFoundError(f"rollouts not found: {', '.join(map(repr, missing[:10]))}")
    return None


def lease(
    conn: Connection,
    q: Statements,
    fx: Effects,
    runner_id: str,
    max_rollouts: int,
    lease_seconds: float,
    mode: RolloutMode | None,
) -> tuple[list[LeasedRollout], float | None]:
    now = time.time()
    expire(conn, q, fx, now)
    if not q.postgres:
        leased = _lease_sqlite(conn, runner_id, max_rollouts, now + lease_seconds, mode, now)
        return leased, None if leased else next_deadline(conn, q)
    if mode is None:
        rows = conn.execute(q.lease_any, {"n": max_rollouts}).all()
    else:
        rows = conn.execute(q.lease_mode, {"n": max_rollouts, "mode": mode.value}).all()
    if not rows:
        return [], next_deadline(conn, q)
    deadline = now + lease_seconds
    out: list[LeasedRollout] = []
    attempt_rows, rollout_rows = [], []
    for row in rows:
        rollout = rollout_from_row(row)
        attempt = rules.start_attempt(rollout, runner_id, now, deadline)
        attempt_rows.append({**attempt.model_dump(mode="json"), "rollout_seq": row.seq})
        rollout_rows.append(
            {
                "b_seq": row.seq,
                "b_count": rollout.attempt_count,
                "b_aid": attempt.attempt_id,
                "b_now": now,
            }
        )
        out.append(LeasedRollout(rollout=rollout, attempt=attempt))
    conn.execute(q.insert_attempts, attempt_rows)
    conn.execute(q.lease_rollouts, rollout_rows)
    return out, None


def _lease_sqlite(
    conn: Connection,
    runner_id: str,
    max_rollouts: int,
    deadline: float,
    mode: RolloutMode | None,
    now: float,
) -> list[LeasedRollout]:
    """`lease` on the raw cursor (see `sqlite_ops`)."""
    with contextlib.closing(sqlite_ops.cursor(conn)) as cur:
        if mode is None:
            rows = cur.execute(sqlite_ops.LEASE_ANY, (max_rollouts,)).fetchall()
        else:
            rows = cur.execute(sqlite_ops.LEASE_MODE, (mode.value, max_rollouts)).fetchall()
        out: list[LeasedRollout] = []
        attempt_rows, rollout_rows = [], []
        for row in rows:
            seq, rollout = sqlite_ops.rollout_from_values(row)
            attempt = rules.start_attempt(rollout, runner_id, now, deadline)
            aid, number = attempt.attempt_id, attempt.attempt_no
            attempt_rows.append((aid, seq, rollout.rollout_id, number, runner_id, now, deadline, now))
            rollout_rows.append((number, aid, now, seq))
            out.append(LeasedRollout(rollout=rollout, attempt=attempt))
        if out:
            cur.executemany(sqlite_ops.INSERT_ATTEMPT, attempt_rows)
            cur.executemany(sqlite_ops.LEASE_ROLLOUT, rollout_rows)
        return out


def attempt_problem(conn: Connection, q: Statements, attempt_id: str) -> Exception:
    row = conn.execute(q.get_attempt, {"aid": attempt_id}).first()
    return NotFoundError(f"attempt {attempt_id!r} not found") if row is None else _stale(row)


def finish_find(conn: Connection, q: Statements, attempt_id: str) -> tuple[int, Rollout] | None:
    """(seq, rollout) of the attempt's rollout, locked on PostgreSQL."""
    if q.postgres:
        row = conn.execute(q.finish_rollout, {"aid": attempt_id}).first()
        return None if row is None else (row.seq, rollout_from_row(row))
    with contextlib.closing(sqlite_ops.cursor(conn)) as cur:
        found = cur.execute(sqlite_ops.FINISH_ROLLOUT, (attempt_id,)).fetchone()
    return None if found is None else sqlite_ops.rollout_from_values(found)


def finish_attempt_row(
    conn: Connection, q: Statements, attempt_id: str, outcome: AttemptOutcome, now: float
) -> bool:
    """Record the outcome on the attempt if it is still running; False if it is not."""
    values = (outcome.status.value, now, outcome.reward, outcome.error, attempt_id)
    if q.postgres:
        keys = ("b_status", "now", "b_reward", "b_error", "aid")
        return conn.execute(q.finish_attempt, dict(zip(keys, values, strict=True))).first() is not None
    with contextlib.closing(sqlite_ops.cursor(conn)) as cur:
        return cur.execute(sqlite_ops.FINISH_ATTEMPT, values).fetchone() is not None


def finish_rollout_row(conn: Connection, q: Statements, seq: int, rollout: Rollout, now: float) -> None:
    values = (rollout.status.value, now, rollout.error, rollout.finished_at, rollout.reward, seq)
    if q.postgres:
        keys = ("b_status", "now", "b_error", "b_finished", "b_reward", "b_seq")
        conn.execute(q.finish_update_rollout, dict(zip(keys, values, strict=True)))
        return
    with contextlib.closing(sqlite_ops.cursor(conn)) as cur:
        cur.execute(sqlite_ops.FINISH_UPDATE_ROLLOUT, values)


def span_page_sqlite(conn: Connection, q: Statements, codec: SpanBodyCodec, query: SpanQuery) -> Page[Span]:
    """`query_spans` on SQLite's keyed span layout (`sqlite_spans`)."""
    where = sqlite_spans.SpanFilter(
        rollout_id=query.rollout_id,
        rollout_ids=query.rollout_ids,
        attempt_id=query.attempt_id,
        trace_id=query.trace_id,
        name=query.name,
    )
    rows = sqlite_spans.read_page(
        conn, where, query.limit, query.offset, codec, lambda d: _load_dictionary(conn, d)
    )
    if len(rows) < query.limit and (rows or query.offset == 0):
        total = query.offset + len(rows)  # a short page is the last one (as on PostgreSQL)
    elif where != sqlite_spans.SpanFilter():
        total = sqlite_spans.count(conn, where)
    else:
        total = count_spans(conn, q)
    return rules.make_page([span_from_row(seq, body) for seq, body in rows], total, query.offset)


def count_spans(conn: Connection, q: Statements) -> int:
    if q.postgres:
        return int(conn.execute(q.count_spans).scalar_one())
    # SQLite numbers a new row max(rowid) + 1, skipped inserts take no number, and spans are
    # never deleted: the count is the last sequence, read from the index end instead of a scan.
    return int(conn.execute(q.last_span_sequence).scalar() or 0)
