"""The SQL store's statements, built once per dialect.

Building a SQLAlchemy statement costs several times more than executing a prebuilt one whose compiled
form is cached (docs/store.md). The store runs a handful per operation, so building them once is most of
what makes the SQLite store fast. Every value is a bound parameter (never baked into the SQL), so
each statement compiles once.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Select,
    String,
    any_,
    bindparam,
    func,
    literal_column,
    select,
    update,
)
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.dialects import sqlite

from reinforge.store.sql.schema import attempts, resources, rollouts, spans
from reinforge.types import AttemptStatus, RolloutStatus

RUNNING = AttemptStatus.running.value


class Statements:
    """Prebuilt statements; PostgreSQL variants lock rows (`FOR UPDATE [SKIP LOCKED]`)."""

    def __init__(self, postgres: bool) -> None:
        self.postgres = postgres
        dialect_insert = pg.insert if postgres else sqlite.insert
        a, r = attempts.c, rollouts.c
        # A literal, not a parameter: SQLite uses its partial index of running attempts only then.
        running = a.status == literal_column(f"'{RUNNING}'")

        # Expiry: find, lock (rollout first), time out, then record each attempt's error.
        self.expire_due = select(a.rollout_seq).where(running, a.lease_deadline < bindparam("now"))
        self.expire_lock = self._lock(
            select(r.seq, r.attempt_count, r.max_attempts)
            .where(r.seq.in_(bindparam("seqs", expanding=True)))
            .order_by(r.seq),
            skip_locked=True,
        )
        self.expire_attempts = (
            update(attempts)
            .where(
                a.rollout_seq.in_(bindparam("seqs", expanding=True)),
                running,
                a.lease_deadline < bindparam("now"),
            )
            .values(status=AttemptStatus.timeout.value, finished_at=bindparam("now"))
            .returning(a.attempt_id, a.rollout_seq, a.attempt_no, a.runner_id)
        )
        self.set_attempt_error = (
            update(attempts).where(a.attempt_id == bindparam("b_id")).values(error=bindparam("b_error"))
        )
        self.expire_rollouts = (
            update(rollouts)
            .where(r.seq == bindparam("b_seq"))
            .values(
                status=bindparam("b_status"),
                error=bindparam("b_error"),
                finished_at=bindparam("b_finished"),
                current_attempt_id=None,
                updated_at=bindparam("b_now"),
            )
        )
        self.next_deadline = select(func.min(a.lease_deadline)).where(running)

        # Lease.
        queued = select(rollouts).where(r.status == RolloutStatus.queued.value).order_by(r.seq)
        self.lease_any = self._lock(queued.limit(bindparam("n")), skip_locked=True)
        self.lease_mode = self._lock(
            queued.where(r.mode == bindparam("mode")).limit(bindparam("n")), skip_locked=True
        )
        self.insert_attempts = attempts.insert()
        self.lease_rollouts = (
            update(rollouts)
            .where(r.seq == bindparam("b_seq"))
            .values(
                status=RolloutStatus.running.value,
                attempt_count=bindparam("b_count"),
                current_attempt_id=bindparam("b_aid"),
                updated_at=bindparam("b_now"),
            )
        )

        # Heartbeat and finish.
        self.heartbeat = (
            update(attempts)
            .where(a.attempt_id == bindparam("aid"), running)
            .values(lease_deadline=bindparam("deadline"), last_heartbeat=bindparam("now"))
            .returning(*attempts.c)
        )
        self.get_attempt = select(attempts).where(a.attempt_id == bindparam("aid"))
        finish_rollout = (
            select(rollouts).join(attempts, a.rollout_seq == r.seq).where(a.attempt_id == bindparam("aid"))
        )
        self.finish_rollout = finish_rollout.with_for_update(of=rollouts) if postgres else finish_rollout
        self.finish_attempt = (
            update(attempts)
            .where(a.attempt_id == bindparam("aid"), running)
            .values(
                status=bindparam("b_status"),
                finished_at=bindparam("now"),
                reward=bindparam("b_reward"),
                error=bindparam("b_error"),
            )
            .returning(a.attempt_id)
        )
        self.finish_update_rollout = (
            update(rollouts)
            .where(r.seq == bindparam("b_seq"))
            .values(
                status=bindparam("b_status"),
                updated_at=bindparam("now"),
                error=bindparam("b_error"),
                finished_at=bindparam("b_finished"),
                reward=bindparam("b_reward"),
                current_attempt_id=None,
            )
        )

        # Enqueue and spans: executemany with RETURNING yields only the rows actually inserted.
        self.insert_rollouts = (
            dialect_insert(rollouts).on_conflict_do_nothing(index_elements=["rollout_id"]).returning(r.seq)
        )
        self.rollouts_by_id = select(rollouts).where(self.in_ids(r.rollout_id))
        # A wait checks its few pending ids; SQLite would rather walk the status index over every
        # final rollout ever stored. `status || ''` hides that index, so it looks the ids up instead.
        final_status = r.status if postgres else r.status.concat("")
        self.final_by_id = select(rollouts).where(
            self.in_ids(r.rollout_id), final_status.in_([s.value for s in RolloutStatus if s.is_final])
        )
        self.insert_spans = (
            dialect_insert(spans)
            .on_conflict_do_nothing(index_elements=["span_id"])
            .returning(spans.c.sequence)
        )
        self.get_rollout = select(rollouts).where(r.rollout_id == bindparam("rid"))
        self.count_spans = select(func.count()).select_from(spans)
        self.last_span_sequence = select(func.max(spans.c.sequence))

        # Resources.
        self.insert_resources = (
            dialect_insert(resources)
            .on_conflict_do_nothing(index_elements=["version"])
            .returning(resources.c.version)
        )
        self.latest_version = select(func.max(resources.c.version))
        self.get_resources = select(resources).where(resources.c.version == bindparam("version"))
        self.latest_resources = select(resources).order_by(resources.c.version.desc()).limit(1)

    def _lock(self, stmt: Select[Any], *, skip_locked: bool = False) -> Select[Any]:
        return stmt.with_for_update(skip_locked=skip_locked) if self.postgres else stmt

    def lock(self, stmt: Select[Any]) -> Select[Any]:
        return self._lock(stmt)

    def in_ids(self, column: Any) -> ColumnElement[bool]:
        """`column IN :ids` as one bound parameter (see `ids`), so any number of ids fits."""
        if self.postgres:
            return column == any_(bindparam("ids", type_=pg.ARRAY(String())))
        return column.in_(select(literal_column("value")).select_from(func.json_each(bindparam("ids"))))

    def ids(self, ids: Sequence[str]) -> list[str] | str:
        """The value for the `:ids` parameter of `in_ids`."""
        return list(ids) if self.postgres else json.dumps(list(ids))
