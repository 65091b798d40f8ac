"""The SQL store: SQLite (the embedded default, one file in the run folder) or PostgreSQL by URL.

Each operation is one transaction run by the `Database`, made of the steps in `transactions`; the
async methods only check arguments, run the transaction, raise what it reports and fire the
in-process wake-ups (waits sleep as `waiting` says). On SQLite the calls every rollout makes (lease,
finish, the expiry probe, span inserts) run on the raw sqlite3 cursor (`sqlite_ops`, `sqlite_spans`);
everything else goes through SQLAlchemy Core.
Rows are locked in one order everywhere (rollout before attempt) so concurrent PostgreSQL stores
can't deadlock, and leases take queued rows with `FOR UPDATE SKIP LOCKED`, so two stores never
lease the same rollout.

Expiry is lazy but complete: every operation that reads or changes rollout state first times out
the running attempts whose lease has passed (one indexed query when there are none), and waits
sleep no later than the next lease deadline.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from pydantic_core import PydanticSerializationError, to_json
from sqlalchemy import (
    ColumnElement,
    Connection,
    Select,
    and_,
    func,
    select,
    update,
)

from reinforge.errors import (
    ConflictError,
    InvalidRequestError,
    NotFoundError,
)
from reinforge.store import rules
from reinforge.store.notify import Signal
from reinforge.store.span_records import SpanRecord
from reinforge.store.sql import sqlite_spans, transactions, waiting
from reinforge.store.sql.database import Database, PostgresDatabase, Synchronous, open_database
from reinforge.store.sql.schema import (
    attempt_from_row,
    attempts,
    resources,
    resources_from_row,
    rollout_from_row,
    rollouts,
    span_from_row,
    spans,
)
from reinforge.store.sql.span_codec import SpanBodyCodec
from reinforge.store.sql.statements import Statements
from reinforge.store.sql.transactions import Effects
from reinforge.types import (
    Attempt,
    AttemptOutcome,
    AttemptQuery,
    AttemptStatus,
    LeasedRollout,
    Page,
    ResourcesVersion,
    Rollout,
    RolloutMode,
    RolloutQuery,
    RolloutSpec,
    RolloutStatus,
    Span,
    SpanQuery,
    StoreCounters,
    new_ordered_id,
)

R = TypeVar("R")

_FINAL = [s.value for s in RolloutStatus if s.is_final]
_INSERT_CHUNK = 500  # rows per multi-row INSERT: far below SQLite's and PostgreSQL's parameter limits
_QUEUED = "queued"
_FINALISED = "final"


class _Raise:
    """A transaction's verdict that must reach the caller as an error *after* the commit (an
    expiry the same transaction applied must stay applied)."""

    def __init__(self, error: Exception) -> None:
        self.error = error


def _json(value: Any, what: str) -> str:
    try:
        return to_json(value).decode()
    except PydanticSerializationError as e:
        raise InvalidRequestError(f"{what} holds a value that is not JSON: {e}") from e


class SqlStore:
    """The store on SQLite or PostgreSQL. Open it with `await SqlStore.open(url)`."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._s = Statements(postgres=isinstance(db, PostgresDatabase))
        # SQLite bodies are compressed (`span_codec`) in its keyed span layout (`sqlite_spans`);
        # PostgreSQL compresses large values itself (TOAST) and keeps plain JSON text.
        self._codec = SpanBodyCodec()
        self._queued = Signal()
        self._finalised = Signal()
        db.on_notify(self._on_notify)

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        schema: str | None = None,
        synchronous: Synchronous = "NORMAL",
        workers: int = 8,
    ) -> SqlStore:
        """Open (creating tables if needed) the store at `url`.

        `sqlite:///run/store.db` (WAL; `synchronous` NORMAL survives a killed process, FULL also a
        power cut, at one fsync per commit) or `postgresql://user@host:5432/db` (optionally in
        `schema`, also given as `?schema=name`; `workers` connections).
        """
        db = open_database(url, schema=schema, synchronous=synchronous, workers=workers)
        await db.start()
        return cls(db)

    @property
    def dialect(self) -> str:
        return self._db.dialect

    @property
    def database(self) -> Database:
        """Where the transactions run; the dashboard's read queries (sql/dashboard_queries.py) use it."""
        return self._db

    def _on_notify(self, payload: str) -> None:
        if payload in (_QUEUED, "*"):
            self._queued.fire()
        if payload in (_FINALISED, "*"):
            self._finalised.fire()

    async def _write(self, fn: Callable[[Connection, Effects], R | _Raise]) -> R:
        fx = Effects()

        def tx(conn: Connection) -> R | _Raise:
            result = fn(conn, fx)
            if fx.queued:
                self._db.notify(conn, _QUEUED)
            if fx.finalised:
                self._db.notify(conn, _FINALISED)
            return result

        result = await self._db.write(tx)
        if fx.queued:
            self._queued.fire()
        if fx.finalised:
            self._finalised.fire(fx.finalised_ids)
        if isinstance(result, _Raise):
            raise result.error
        return result

    # -- rollouts ---------------------------------------------------------------------------------

    async def enqueue_rollouts(self, specs: Sequence[RolloutSpec]) -> list[Rollout]:
        for spec in specs:
            rules.check_spec(spec)
        now = time.time()
        wanted: list[str] = []
        rows: dict[str, dict[str, Any]] = {}
        for spec in specs:
            rid = spec.rollout_id or new_ordered_id()
            wanted.append(rid)
            if rid in rows:
                continue
            rows[rid] = {
                "rollout_id": rid,
                "status": RolloutStatus.queued.value,
                "mode": RolloutMode(spec.mode).value,
                "task_id": spec.task_id,
                "group_id": spec.group_id,
                "resources_version": spec.resources_version,
                "max_attempts": spec.max_attempts,
                "attempt_count": 0,
                "created_at": now,
                "updated_at": now,
                "task": _json(spec.task, "task"),
                "metadata": _json(spec.metadata, "metadata"),
            }
        if not wanted:
            return []
        new_rows = list(rows.values())

        def tx(conn: Connection, fx: Effects) -> list[Rollout]:
            q = self._s
            found: dict[str, Rollout] = {}
            for i in range(0, len(new_rows), _INSERT_CHUNK):
                chunk = new_rows[i : i + _INSERT_CHUNK]
                fx.queued |= bool(conn.execute(q.insert_rollouts, chunk).all())
                ids = q.ids([x["rollout_id"] for x in chunk])
                found.update(
                    (r.rollout_id, r)
                    for r in map(rollout_from_row, conn.execute(q.rollouts_by_id, {"ids": ids}))
                )
            return [found[rid] for rid in wanted]

        return await self._write(tx)

    async def lease_rollouts(
        self,
        runner_id: str,
        max_rollouts: int = 1,
        lease_seconds: float = 60.0,
        wait_seconds: float = 0.0,
        mode: RolloutMode | None = None,
    ) -> list[LeasedRollout]:
        mode = rules.check_lease_args(runner_id, max_rollouts, lease_seconds, wait_seconds, mode)
        deadline = time.monotonic() + wait_seconds
        with self._queued.watch() as watch:
            while True:
                leased, next_deadline = await self._write(
                    lambda conn, fx: transactions.lease(
                        conn, self._s, fx, runner_id, max_rollouts, lease_seconds, mode
                    )
                )
                remaining = deadline - time.monotonic()
                if leased or remaining <= 0:
                    return leased
                await watch.wait(waiting.sleep_for(remaining, next_deadline))

    async def heartbeat(self, attempt_id: str, lease_seconds: float = 60.0) -> Attempt:
        rules.check_lease_seconds(lease_seconds)

        def tx(conn: Connection, fx: Effects) -> Attempt | _Raise:
            now = time.time()
            transactions.expire(conn, self._s, fx, now)
            params = {"aid": attempt_id, "deadline": now + lease_seconds, "now": now}
            row = conn.execute(self._s.heartbeat, params).first()
            if row is not None:
                return attempt_from_row(row)
            return _Raise(transactions.attempt_problem(conn, self._s, attempt_id))

        return await self._write(tx)

    async def finish_attempt(self, attempt_id: str, outcome: AttemptOutcome) -> Rollout:
        outcome = rules.check_outcome(outcome)

        def tx(conn: Connection, fx: Effects) -> Rollout | _Raise:
            now = time.time()
            transactions.expire(conn, self._s, fx, now)
            found = transactions.finish_find(conn, self._s, attempt_id)
            if found is None:
                return _Raise(NotFoundError(f"attempt {attempt_id!r} not found"))
            seq, rollout = found
            if not transactions.finish_attempt_row(conn, self._s, attempt_id, outcome, now):
                return _Raise(transactions.attempt_problem(conn, self._s, attempt_id))
            status = rules.after_finish(outcome, rollout.attempt_count, rollout.max_attempts)
            rollout.status = status
            rollout.updated_at = now
            rollout.error = outcome.error
            if status.is_final:
                rollout.finished_at = now
                rollout.reward = outcome.reward
            transactions.finish_rollout_row(conn, self._s, seq, rollout, now)
            fx.queued |= status is RolloutStatus.queued
            if status.is_final:
                fx.finalise(rollout.rollout_id)
            return rollout

        return await self._write(tx)

    async def cancel_rollouts(self, rollout_ids: Sequence[str]) -> list[Rollout]:
        ids = rules.check_ids(rollout_ids, "rollout_ids")

        def tx(conn: Connection, fx: Effects) -> list[Rollout] | _Raise:
            now = time.time()
            transactions.expire(conn, self._s, fx, now)
            rows = conn.execute(
                self._s.lock(self._s.rollouts_by_id.order_by(rollouts.c.seq)), {"ids": self._s.ids(ids)}
            ).all()
            found = {r.rollout_id: r for r in rows}
            missing = [i for i in ids if i not in found]
            if missing:
                return _Raise(NotFoundError(f"rollouts not found: {', '.join(map(repr, missing[:10]))}"))
            live = [r for r in rows if r.status not in _FINAL]
            if live:
                seqs = [r.seq for r in live]
                conn.execute(
                    update(attempts)
                    .where(attempts.c.rollout_seq.in_(seqs), attempts.c.status == AttemptStatus.running.value)
                    .values(status=AttemptStatus.cancelled.value, finished_at=now)
                )
                conn.execute(
                    update(rollouts)
                    .where(rollouts.c.seq.in_(seqs))
                    .values(
                        status=RolloutStatus.cancelled.value,
                        finished_at=now,
                        updated_at=now,
                        current_attempt_id=None,
                    )
                )
                for r in live:
                    fx.finalise(r.rollout_id)
            out = {}
            for r in rows:
                rollout = rollout_from_row(r)
                if r.status not in _FINAL:
                    rollout.status = RolloutStatus.cancelled
                    rollout.finished_at = rollout.updated_at = now
                out[rollout.rollout_id] = rollout
            return [out[i] for i in ids]

        return await self._write(tx)

    # -- spans ------------------------------------------------------------------------------------

    async def add_spans(self, new_spans: Sequence[Span]) -> int:
        records = []
        for s in new_spans:
            rules.check_span(s)
            try:
                records.append(SpanRecord.from_span(s))
            except PydanticSerializationError as e:
                raise InvalidRequestError(f"span {s.span_id} holds a value that is not JSON: {e}") from e
        return await self.add_span_records(records)

    async def add_span_records(self, records: Sequence[SpanRecord]) -> int:
        """`add_spans` for spans already validated and serialised (the store server's fast path)."""
        rows: dict[str, tuple[str, str, str, str, str, str]] = {}
        for r in records:
            if r.span_id not in rows:  # the first of a repeated id wins, as across batches
                rows[r.span_id] = (r.span_id, r.trace_id, r.rollout_id, r.attempt_id, r.name, r.body)
        if not rows:
            return 0
        batch = list(rows.values())
        if not self._s.postgres:
            return await self._db.write_bulk(lambda conn: sqlite_spans.insert_spans(conn, batch, self._codec))

        def tx(conn: Connection, fx: Effects) -> int:
            keys = ("span_id", "trace_id", "rollout_id", "attempt_id", "name", "body")
            added = 0
            for i in range(0, len(batch), _INSERT_CHUNK):
                params = [dict(zip(keys, row, strict=True)) for row in batch[i : i + _INSERT_CHUNK]]
                added += len(conn.execute(self._s.insert_spans, params).all())
            return added

        return await self._write(tx)

    # -- reads ------------------------------------------------------------------------------------

    async def get_rollout(self, rollout_id: str) -> Rollout:
        return await self._get_one(self._s.get_rollout, "rid", rollout_id, rollout_from_row, "rollout")

    async def get_attempt(self, attempt_id: str) -> Attempt:
        return await self._get_one(self._s.get_attempt, "aid", attempt_id, attempt_from_row, "attempt")

    def _get_one(
        self, statement: Select[Any], key: str, value: str, from_row: Callable[[Any], R], what: str
    ) -> Awaitable[R]:
        """The row `statement` selects by its id parameter `key`, after expiry; NotFoundError naming
        `what` when there is none. It hands back `_write`'s awaitable: a read adds no coroutine."""

        def tx(conn: Connection, fx: Effects) -> R | _Raise:
            transactions.expire(conn, self._s, fx, time.time())
            row = conn.execute(statement, {key: value}).first()
            if row is None:
                return _Raise(NotFoundError(f"{what} {value!r} not found"))
            return from_row(row)

        return self._write(tx)

    async def query_rollouts(self, query: RolloutQuery) -> Page[Rollout]:
        where: list[ColumnElement[bool]] = []
        params: dict[str, Any] = {}
        if query.rollout_ids is not None:
            where.append(self._s.in_ids(rollouts.c.rollout_id))
            params["ids"] = self._s.ids(list(dict.fromkeys(query.rollout_ids)))
        if query.statuses is not None:
            where.append(rollouts.c.status.in_([s.value for s in query.statuses]))
        if query.mode is not None:
            where.append(rollouts.c.mode == query.mode.value)
        if query.group_id is not None:
            where.append(rollouts.c.group_id == query.group_id)
        if query.task_id is not None:
            where.append(rollouts.c.task_id == query.task_id)

        def tx(conn: Connection, fx: Effects) -> Page[Rollout]:
            transactions.expire(conn, self._s, fx, time.time())
            cond = and_(True, *where)
            total = conn.execute(select(func.count()).select_from(rollouts).where(cond), params).scalar_one()
            rows = conn.execute(
                select(rollouts).where(cond).order_by(rollouts.c.seq).limit(query.limit).offset(query.offset),
                params,
            )
            return rules.make_page([rollout_from_row(r) for r in rows], total, query.offset)

        return await self._write(tx)

    async def query_attempts(self, query: AttemptQuery) -> Page[Attempt]:
        where: list[ColumnElement[bool]] = []
        if query.rollout_id is not None:
            where.append(attempts.c.rollout_id == query.rollout_id)
        if query.runner_id is not None:
            where.append(attempts.c.runner_id == query.runner_id)
        if query.statuses is not None:
            where.append(attempts.c.status.in_([s.value for s in query.statuses]))

        def tx(conn: Connection, fx: Effects) -> Page[Attempt]:
            transactions.expire(conn, self._s, fx, time.time())
            cond = and_(True, *where)
            total = conn.execute(select(func.count()).select_from(attempts).where(cond)).scalar_one()
            rows = conn.execute(
                select(attempts)
                .where(cond)
                .order_by(attempts.c.rollout_seq, attempts.c.attempt_no)
                .limit(query.limit)
                .offset(query.offset)
            )
            return rules.make_page([attempt_from_row(r) for r in rows], total, query.offset)

        return await self._write(tx)

    async def query_spans(self, query: SpanQuery) -> Page[Span]:
        if not self._s.postgres:
            return await self._db.read(
                lambda conn: transactions.span_page_sqlite(conn, self._s, self._codec, query)
            )
        where: list[ColumnElement[bool]] = []
        params: dict[str, Any] = {}
        if query.rollout_id is not None:
            where.append(spans.c.rollout_id == query.rollout_id)
        if query.rollout_ids is not None:
            where.append(self._s.in_ids(spans.c.rollout_id))
            params["ids"] = self._s.ids(list(dict.fromkeys(query.rollout_ids)))
        if query.attempt_id is not None:
            where.append(spans.c.attempt_id == query.attempt_id)
        if query.name is not None:
            where.append(spans.c.name == query.name)
        if query.trace_id is not None:
            where.append(spans.c.trace_id == query.trace_id)

        def tx(conn: Connection) -> Page[Span]:
            cond = and_(True, *where)
            statement = (
                select(spans.c.sequence, spans.c.body)
                .where(cond)
                .order_by(spans.c.sequence)
                .limit(query.limit)
                .offset(query.offset)
            )
            rows = [(r[0], r[1]) for r in conn.execute(statement, params)]
            if len(rows) < query.limit and (rows or query.offset == 0):
                # A short page is the last one: its end is the total, no count needed (the trainer
                # reads every step's spans, in pages that are nearly always short).
                total = query.offset + len(rows)
            elif where:
                total = conn.execute(select(func.count()).select_from(spans).where(cond), params).scalar_one()
            else:
                total = transactions.count_spans(conn, self._s)
            return rules.make_page([span_from_row(seq, body) for seq, body in rows], total, query.offset)

        return await self._db.read(tx)

    async def wait_for_rollouts(self, rollout_ids: Sequence[str], timeout_seconds: float) -> list[Rollout]:
        ids = rules.check_ids(rollout_ids, "rollout_ids")
        rules.check_wait_seconds(timeout_seconds, "timeout_seconds")
        deadline = time.monotonic() + timeout_seconds
        done: dict[str, Rollout] = {}
        first = True

        def tx(conn: Connection, fx: Effects) -> tuple[list[Rollout], float | None] | _Raise:
            transactions.expire(conn, self._s, fx, time.time())
            pending = [i for i in ids if i not in done]
            if first:
                missing = transactions.missing_rollouts(conn, self._s, pending)
                if missing is not None:
                    return _Raise(missing)
            return transactions.final_by_id(conn, self._s, pending), transactions.next_deadline(conn, self._s)

        with self._finalised.watch() as watch:
            while True:
                finished, next_deadline = await self._write(tx)
                first = False
                done.update((r.rollout_id, r) for r in finished)
                if len(done) == len(ids) or deadline - time.monotonic() <= 0:
                    return [done[i] for i in ids if i in done]
                await waiting.until_all_reported(watch, ids, done, deadline, next_deadline)

    # -- resources --------------------------------------------------------------------------------

    async def put_resources(
        self, resources_: dict[str, object], version: int | None = None
    ) -> ResourcesVersion:
        rules.check_version(version, "version")
        if not isinstance(resources_, dict):
            raise InvalidRequestError("resources must be a JSON object")
        body = _json(resources_, "resources")
        content = json.loads(body)

        def tx(conn: Connection, fx: Effects) -> ResourcesVersion | _Raise:
            q = self._s
            while True:
                v = version
                if v is None:
                    latest = conn.execute(q.latest_version).scalar()
                    try:
                        v = rules.next_version(latest)
                    except ConflictError as exc:
                        return _Raise(exc)
                created = time.time()
                # ON CONFLICT DO NOTHING: a concurrent put of the same number (another store
                # auto-numbering at the same moment) makes this insert a no-op instead of an error.
                added = conn.execute(
                    q.insert_resources, {"version": v, "body": body, "created_at": created}
                ).first()
                if added is not None:
                    return ResourcesVersion(version=v, resources=content, created_at=created)
                if version is None:
                    continue  # someone took that number: take the next one
                existing = resources_from_row(conn.execute(q.get_resources, {"version": v}).one())
                if existing.resources != content:
                    return _Raise(
                        ConflictError(
                            f"resources version {v} already exists with other content; put the new "
                            "content under a new version (or omit version to get the next one)"
                        )
                    )
                return existing

        return await self._write(tx)

    async def get_resources(self, version: int | None = None) -> ResourcesVersion:
        rules.check_version(version, "version")

        def tx(conn: Connection) -> ResourcesVersion | _Raise:
            if version is None:
                row = conn.execute(self._s.latest_resources).first()
                if row is None:
                    return _Raise(NotFoundError("no resources have been put yet"))
            else:
                row = conn.execute(self._s.get_resources, {"version": version}).first()
                if row is None:
                    return _Raise(NotFoundError(f"resources version {version} not found"))
            return resources_from_row(row)

        result = await self._db.read(tx)
        if isinstance(result, _Raise):
            raise result.error
        return result

    async def counters(self) -> StoreCounters:
        def tx(conn: Connection, fx: Effects) -> StoreCounters:
            transactions.expire(conn, self._s, fx, time.time())
            by_rollout = conn.execute(
                select(rollouts.c.status, func.count()).group_by(rollouts.c.status)
            ).all()
            by_attempt = conn.execute(
                select(attempts.c.status, func.count()).group_by(attempts.c.status)
            ).all()
            n_spans = transactions.count_spans(conn, self._s)
            n_res, latest = conn.execute(select(func.count(), func.max(resources.c.version))).one()
            return StoreCounters(
                rollouts_by_status={RolloutStatus(s): n for s, n in by_rollout},
                attempts_by_status={AttemptStatus(s): n for s, n in by_attempt},
                spans=n_spans,
                resources_versions=n_res,
                latest_resources_version=latest,
            )

        return await self._write(tx)

    async def close(self) -> None:
        await self._db.close()
        # Wake every waiter so it notices the store is closed instead of sleeping out its timeout.
        self._queued.fire()
        self._finalised.fire()
