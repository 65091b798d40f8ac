"""The dashboard's queries on SQLite and PostgreSQL: keyset pages over the rollouts' primary key.

A page is read newest first in windows of the primary key (`seq < cursor AND seq >= cursor - window`),
so every statement is a bounded range scan of the table (or of `ix_rollouts_status_seq` for a status
filter), never an OFFSET walk or a full scan: the first screen of a 100k-rollout store costs what
the first screen of a 100-rollout store costs. A filter that matches little widens the window each
round (more rows per statement, fewer statements) until the page is full, the table is exhausted, or
the time budget is spent; the answer then carries the cursor it reached.

The agent filter is answered from the spans' bodies, which SQL cannot look inside (SQLite keeps them
compressed, sql/span_codec.py): only the rollouts that pass every other filter are checked, a window
at a time, and a finished rollout's agents are remembered, so a second search over the same
rollouts costs no span reads.
"""

from __future__ import annotations

import json
import time
from functools import partial
from typing import Any

from sqlalchemy import ColumnElement, Connection, Integer, and_, func, literal_column, select

from reinforge.errors import StoreUnavailableError
from reinforge.semconv import ATTR_AGENT_NAME
from reinforge.store.dashboard_queries import (
    SCAN_BUDGET_S,
    PolicyVersions,
    RolloutFilter,
    RolloutListPage,
    RolloutRow,
    RunnerRow,
    RunnersView,
    RunningAttempt,
    row_of,
)
from reinforge.store.sql import sqlite_spans
from reinforge.store.sql.schema import (
    attempts,
    resources,
    resources_from_row,
    rollout_from_row,
    rollouts,
    spans,
)
from reinforge.store.sql.span_codec import SpanBodyCodec, span_dictionaries
from reinforge.store.sql.store import SqlStore
from reinforge.types import MAX_PAGE_SIZE, AttemptStatus, Rollout, RolloutStatus

_FIRST_WINDOW = 2_000
_MAX_WINDOW = 50_000
_AGENT_WINDOW = 4_000
"""With the agent filter a window's spans are read too: smaller windows keep each read short."""
_MAX_RUNNING = 500
_MAX_RUNNERS = 500
_MAX_REMEMBERED = 2_000_000
"""Finished rollouts whose agent names are kept in memory (a few dozen bytes each)."""
_AGENT_KEY = json.dumps(ATTR_AGENT_NAME) + ":"
_JSON = json.JSONDecoder()


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


class SqlDashboardQueries:
    """`DashboardQueries` for a `SqlStore`."""

    def __init__(self, store: SqlStore) -> None:
        self._store = store
        self._db = store.database
        self._postgres = store.dialect == "postgresql"
        self._versions = PolicyVersions()
        self._codec = SpanBodyCodec()
        self._agents: dict[str, frozenset[str]] = {}

    def _conditions(self, where: RolloutFilter) -> list[ColumnElement[bool]]:
        c = rollouts.c
        conds: list[ColumnElement[bool]] = []
        if where.statuses is not None:
            conds.append(c.status.in_([s.value for s in where.statuses]))
        if where.mode is not None:
            conds.append(c.mode == where.mode.value)
        if where.reward_min is not None:
            conds.append(c.reward >= where.reward_min)
        if where.reward_max is not None:
            conds.append(c.reward <= where.reward_max)
        if where.task_text is not None:
            pattern = f"%{_escape_like(where.task_text)}%"
            # SQLite's LIKE ignores ASCII case already; PostgreSQL's needs ILIKE for the same answer.
            like = c.task.ilike if self._postgres else c.task.like
            conds.append(like(pattern, escape="\\"))
        if where.policy_version is not None:
            conds.append(c.resources_version.in_(self._versions.resources_for(where.policy_version)))
        return conds

    async def _refresh_versions(self) -> None:
        known = max(self._versions.by_resources, default=-1)

        def tx(conn: Connection) -> list[Any]:
            query = select(resources).where(resources.c.version > known).order_by(resources.c.version)
            return [resources_from_row(r) for r in conn.execute(query)]

        self._versions.update(await self._db.read(tx))

    async def rollouts(self, where: RolloutFilter, before: int | None, limit: int) -> RolloutListPage:
        if not 1 <= limit <= MAX_PAGE_SIZE:
            raise ValueError(f"limit must be within 1..{MAX_PAGE_SIZE}")
        await self._refresh_versions()
        conds = self._conditions(where)
        seq = rollouts.c.seq
        started = time.monotonic()
        if before is None:
            top = await self._db.read(lambda conn: conn.execute(select(func.max(seq))).scalar())
            before = (top or 0) + 1
        window = _FIRST_WINDOW
        found: list[RolloutRow] = []
        while True:
            low = max(before - window, 1)
            bounds = and_(seq < before, seq >= low, *conds)
            need = limit + 1 - len(found)  # one more than the page tells whether anything is left
            if where.agent is None:
                statement = select(rollouts).where(bounds).order_by(seq.desc()).limit(need)
                raw = await self._db.read(partial(_rollouts, statement=statement))
                window_read = len(raw) < need  # else resume inside the window, after the last row
            else:
                # The agent filter runs after SQL on the window's candidates (ids only); only the
                # rollouts it keeps are read whole. The whole window is examined at once.
                light = (
                    select(seq, rollouts.c.rollout_id, rollouts.c.status).where(bounds).order_by(seq.desc())
                )
                candidates = await self._db.read(partial(_candidates, statement=light))
                kept = (await self._by_agent(candidates, where.agent))[:need]
                whole = select(rollouts).where(seq.in_(kept)).order_by(seq.desc())
                raw = await self._db.read(partial(_rollouts, statement=whole)) if kept else []
                window_read = True
            found.extend(row_of(s, r, self._versions) for s, r in raw)
            if len(found) > limit:
                page = found[:limit]
                return RolloutListPage(items=page, next_cursor=page[-1].seq, complete=True)
            if not window_read:
                before = raw[-1][0]
            elif low <= 1:
                return RolloutListPage(items=found, next_cursor=None, complete=True)
            else:
                before = low
                window = min(window * 4, _MAX_WINDOW if where.agent is None else _AGENT_WINDOW)
            if time.monotonic() - started > SCAN_BUDGET_S:
                return RolloutListPage(items=found, next_cursor=before, complete=False)

    async def _by_agent(self, candidates: list[tuple[int, str, str]], agent: str) -> list[int]:
        """The seqs of the candidates (seq, rollout id, status) whose rollout has a span by `agent`.

        A span body is read as text (decompressed by the store's own codec where SQLite keeps it
        compressed) and searched for the attribute as the store writes it, without parsing it. A
        finished rollout's agents are remembered: its spans no longer change.
        """
        unknown = [rid for _, rid, _ in candidates if rid not in self._agents]
        fresh: dict[str, frozenset[str]] = {}
        if unknown:
            read = await self._db.read(lambda conn: self._agents_of(conn, unknown))
            final = {rid for _, rid, status in candidates if RolloutStatus(status).is_final}
            for rid in unknown:
                names = read.get(rid, frozenset())
                if rid in final and len(self._agents) < _MAX_REMEMBERED:
                    self._agents[rid] = names
                else:
                    fresh[rid] = names
        return [s for s, rid, _ in candidates if agent in self._agents.get(rid, fresh.get(rid, ()))]

    def _agents_of(self, conn: Connection, rollout_ids: list[str]) -> dict[str, frozenset[str]]:
        """rollout id -> the agent names its spans carry."""

        def load_dictionary(dict_id: int) -> bytes:
            row = conn.execute(
                select(span_dictionaries.c.body).where(span_dictionaries.c.dict_id == dict_id)
            ).first()
            if row is None:
                raise StoreUnavailableError(f"span dictionary {dict_id} is missing: its spans can't be read")
            return bytes(row[0])

        names: dict[str, set[str]] = {}
        if self._postgres:
            statement = select(spans.c.rollout_id, spans.c.body).where(spans.c.rollout_id.in_(rollout_ids))
            rows: Any = conn.execute(statement)
        else:  # the raw cursor: SQLAlchemy's row processing costs more than the search itself
            rows = sqlite_spans.bodies_of_rollouts(conn, rollout_ids)
        for rollout_id, body in rows:
            # The attributes are never in the head a keyed body leaves out (`span_codec`).
            text = self._codec.decode_without_head(body, load_dictionary)
            at = text.find(_AGENT_KEY)
            while at >= 0:
                value, end = _JSON.raw_decode(text, at + len(_AGENT_KEY))
                if isinstance(value, str):
                    names.setdefault(rollout_id, set()).add(value)
                at = text.find(_AGENT_KEY, end)
        return {k: frozenset(v) for k, v in names.items()}

    async def runners(self) -> RunnersView:
        a = attempts.c
        running = AttemptStatus.running.value
        failed = [AttemptStatus.failed.value, AttemptStatus.timeout.value]

        def tx(conn: Connection) -> RunnersView:
            by_runner = (
                select(
                    a.runner_id,
                    func.count().label("attempts"),
                    func.sum((a.status == running).cast(Integer())).label("running"),
                    func.sum(a.status.in_(failed).cast(Integer())).label("failed"),
                    func.max(a.last_heartbeat).label("last_heartbeat"),
                    func.max(a.started_at).label("last_started"),
                )
                .group_by(a.runner_id)
                .order_by(func.max(a.last_heartbeat).desc())
                .limit(_MAX_RUNNERS)
            )
            runners = [
                RunnerRow(
                    runner_id=r.runner_id,
                    attempts=int(r.attempts),
                    running=int(r.running or 0),
                    failed=int(r.failed or 0),
                    last_heartbeat=float(r.last_heartbeat),
                    last_started=float(r.last_started),
                )
                for r in conn.execute(by_runner)
            ]
            current = (
                select(
                    a.attempt_id,
                    a.rollout_id,
                    a.runner_id,
                    a.attempt_no,
                    a.started_at,
                    a.last_heartbeat,
                    a.lease_deadline,
                )
                .where(a.status == literal_column(f"'{running}'"))  # SQLite's partial index (schema.py)
                .order_by(a.lease_deadline)
                .limit(_MAX_RUNNING)
            )
            attempts_now = [RunningAttempt(**dict(r._mapping)) for r in conn.execute(current)]
            return RunnersView(runners=runners, running=sorted(attempts_now, key=lambda x: x.started_at))

        return await self._db.read(tx)


def _rollouts(conn: Connection, statement: Any) -> list[tuple[int, Rollout]]:
    return [(r._mapping["seq"], rollout_from_row(r)) for r in conn.execute(statement)]


def _candidates(conn: Connection, statement: Any) -> list[tuple[int, str, str]]:
    """(seq, rollout id, status) rows."""
    return [(int(r[0]), str(r[1]), str(r[2])) for r in conn.execute(statement)]
