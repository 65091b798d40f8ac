"""The dashboard's read queries: rollout lists with filters and keyset paging, and the runners seen.

These are not part of the `Store` protocol: they exist for one reader (the dashboard), and only the SQL
store can answer them without reading everything. This module holds what every implementation shares
and `ProtocolScanQueries`, which reads through the protocol and filters in Python, for any store that is
not SQL (the memory store, an HTTP client): right for the small stores those hold, and as correct, only
not indexed. The SQL implementation (store/sql/dashboard_queries.py) builds on this module, and
store/dashboard_backend.py picks one for a store, so the imports point one way.

Paging is by cursor (`before`: the rollout's insertion number, newest first), never by offset: a page
deep in a long run costs what the first page costs. A filter the database cannot answer from an index
(task text, reward range, agent name) may have to examine many rollouts to fill a page; a request
stops after a time budget and returns what it found with the cursor it reached (`complete` False), so
no request ever scans a 100k-rollout store in one go.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from reinforge.errors import NotFoundError
from reinforge.semconv import ATTR_AGENT_NAME
from reinforge.store.protocol import Store
from reinforge.types import (
    MAX_PAGE_SIZE,
    Attempt,
    AttemptQuery,
    AttemptStatus,
    ResourcesVersion,
    Rollout,
    RolloutMode,
    RolloutQuery,
    RolloutStatus,
    SpanQuery,
)

TASK_PREVIEW_CHARS = 200
ERROR_PREVIEW_CHARS = 300
SCAN_BUDGET_S = 0.4
"""How long one rollouts request may look for matches before it answers with what it found."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RolloutFilter(_Model):
    """What the rollouts page filters on; every field is optional and they combine with AND."""

    statuses: list[RolloutStatus] | None = None
    mode: RolloutMode | None = None
    reward_min: float | None = None
    reward_max: float | None = None
    task_text: str | None = Field(default=None, min_length=1, max_length=200)
    """A substring of the task's JSON (case-insensitive for ASCII)."""
    agent: str | None = Field(default=None, min_length=1, max_length=256)
    """Rollouts with at least one span by this agent (`reinforge.agent.name`)."""
    policy_version: int | None = Field(default=None, ge=0)
    """Rollouts sampled by this policy version (through their resources version)."""

    @model_validator(mode="after")
    def _range(self) -> RolloutFilter:
        if self.reward_min is not None and self.reward_max is not None and self.reward_min > self.reward_max:
            raise ValueError(f"reward_min ({self.reward_min}) is above reward_max ({self.reward_max})")
        return self

    @property
    def is_empty(self) -> bool:
        return all(v is None for v in self.model_dump().values())


class RolloutRow(_Model):
    """One line of the rollouts list: enough to scan by eye, no task or spans in full."""

    seq: int
    rollout_id: str
    status: RolloutStatus
    mode: RolloutMode
    task_id: str | None
    group_id: str | None
    task_preview: str
    reward: float | None
    attempt_count: int
    resources_version: int | None
    policy_version: int | None
    created_at: float
    updated_at: float
    error: str | None


class RolloutListPage(_Model):
    """Newest first. `next_cursor` continues the list (None: nothing older is left); `complete` is False
    when the time budget ran out before the page filled (the cursor then marks how far it looked)."""

    items: list[RolloutRow]
    next_cursor: int | None
    complete: bool


class RunnerRow(_Model):
    runner_id: str
    attempts: int
    running: int
    failed: int
    last_heartbeat: float
    last_started: float


class RunningAttempt(_Model):
    attempt_id: str
    rollout_id: str
    runner_id: str
    attempt_no: int
    started_at: float
    last_heartbeat: float
    lease_deadline: float


class RunnersView(_Model):
    runners: list[RunnerRow]
    running: list[RunningAttempt]


class DashboardQueries(Protocol):
    async def rollouts(self, where: RolloutFilter, before: int | None, limit: int) -> RolloutListPage: ...

    async def runners(self) -> RunnersView: ...


def agent_marker(agent: str) -> str:
    """How an agent name appears inside a stored span's JSON (pydantic writes compact JSON, UTF-8)."""
    return f"{json.dumps(ATTR_AGENT_NAME)}:{json.dumps(agent, ensure_ascii=False)}"


def preview(text: str | None, limit: int) -> str | None:
    if text is None or len(text) <= limit:
        return text
    return text[: limit - 1] + "…"


def policy_version_of(resources: dict[str, Any]) -> int | None:
    value = resources.get("policy_version")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class PolicyVersions:
    """resources version -> policy version, cached until a new resources version appears (they are
    immutable, so a mapping once read stays right)."""

    def __init__(self) -> None:
        self.by_resources: dict[int, int | None] = {}

    def update(self, versions: list[ResourcesVersion]) -> None:
        for rv in versions:
            self.by_resources[rv.version] = policy_version_of(rv.resources)

    def resources_for(self, policy_version: int) -> list[int]:
        return [rv for rv, pv in self.by_resources.items() if pv == policy_version]


def row_of(seq: int, rollout: Rollout, versions: PolicyVersions) -> RolloutRow:
    rv = rollout.resources_version
    return RolloutRow(
        seq=seq,
        rollout_id=rollout.rollout_id,
        status=rollout.status,
        mode=rollout.mode,
        task_id=rollout.task_id,
        group_id=rollout.group_id,
        task_preview=preview(json.dumps(rollout.task, ensure_ascii=False), TASK_PREVIEW_CHARS) or "",
        reward=rollout.reward,
        attempt_count=rollout.attempt_count,
        resources_version=rv,
        policy_version=versions.by_resources.get(rv) if rv is not None else None,
        created_at=rollout.created_at,
        updated_at=rollout.updated_at,
        error=preview(rollout.error, ERROR_PREVIEW_CHARS),
    )


async def _all_pages(fetch: Any, query: Any) -> list[Any]:
    items: list[Any] = []
    offset = 0
    while True:
        page = await fetch(query.model_copy(update={"offset": offset, "limit": MAX_PAGE_SIZE}))
        items.extend(page.items)
        if page.next_offset is None:
            return items
        offset = page.next_offset


class ProtocolScanQueries:
    """The dashboard's queries through the `Store` protocol alone: reads every rollout and filters in
    Python. For the memory store and HTTP clients, whose stores are small; SQL stores use
    `SqlDashboardQueries`."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._versions = PolicyVersions()

    async def _refresh_versions(self) -> None:
        latest = (await self._store.counters()).latest_resources_version
        if latest is None:
            return
        for version in range(latest + 1):
            if version not in self._versions.by_resources:
                try:
                    self._versions.update([await self._store.get_resources(version)])
                except NotFoundError:
                    continue

    async def rollouts(self, where: RolloutFilter, before: int | None, limit: int) -> RolloutListPage:
        await self._refresh_versions()
        everything: list[Rollout] = await _all_pages(
            self._store.query_rollouts, RolloutQuery(statuses=where.statuses, mode=where.mode)
        )
        # The protocol lists oldest first and does not expose insertion numbers: position is one.
        numbered = list(enumerate(everything, start=1))
        allowed = (
            set(self._versions.resources_for(where.policy_version))
            if where.policy_version is not None
            else None
        )
        agents_ok: set[str] | None = None
        if where.agent is not None:
            agents_ok = await self._rollouts_of_agent(where.agent)
        needle = where.task_text.lower() if where.task_text is not None else None
        items: list[RolloutRow] = []
        for seq, r in reversed(numbered):
            if before is not None and seq >= before:
                continue
            if where.reward_min is not None and (r.reward is None or r.reward < where.reward_min):
                continue
            if where.reward_max is not None and (r.reward is None or r.reward > where.reward_max):
                continue
            if needle is not None and needle not in json.dumps(r.task, ensure_ascii=False).lower():
                continue
            if allowed is not None and r.resources_version not in allowed:
                continue
            if agents_ok is not None and r.rollout_id not in agents_ok:
                continue
            items.append(row_of(seq, r, self._versions))
            if len(items) > limit:
                break
        more = len(items) > limit
        items = items[:limit]
        return RolloutListPage(items=items, next_cursor=items[-1].seq if more else None, complete=True)

    async def _rollouts_of_agent(self, agent: str) -> set[str]:
        spans = await _all_pages(self._store.query_spans, SpanQuery())
        return {s.rollout_id for s in spans if s.attributes.get(ATTR_AGENT_NAME) == agent}

    async def runners(self) -> RunnersView:
        attempts: list[Attempt] = await _all_pages(self._store.query_attempts, AttemptQuery())
        by_runner: dict[str, RunnerRow] = {}
        for a in attempts:
            row = by_runner.get(a.runner_id)
            if row is None:
                row = by_runner[a.runner_id] = RunnerRow(
                    runner_id=a.runner_id,
                    attempts=0,
                    running=0,
                    failed=0,
                    last_heartbeat=0.0,
                    last_started=0.0,
                )
            row.attempts += 1
            row.running += a.status is AttemptStatus.running
            row.failed += a.status in (AttemptStatus.failed, AttemptStatus.timeout)
            row.last_heartbeat = max(row.last_heartbeat, a.last_heartbeat)
            row.last_started = max(row.last_started, a.started_at)
        running = [
            RunningAttempt(
                attempt_id=a.attempt_id,
                rollout_id=a.rollout_id,
                runner_id=a.runner_id,
                attempt_no=a.attempt_no,
                started_at=a.started_at,
                last_heartbeat=a.last_heartbeat,
                lease_deadline=a.lease_deadline,
            )
            for a in attempts
            if a.status is AttemptStatus.running
        ]
        rows = sorted(by_runner.values(), key=lambda r: r.last_heartbeat, reverse=True)
        return RunnersView(runners=rows, running=sorted(running, key=lambda a: a.started_at))


__all__ = [
    "SCAN_BUDGET_S",
    "DashboardQueries",
    "PolicyVersions",
    "ProtocolScanQueries",
    "RolloutFilter",
    "RolloutListPage",
    "RolloutRow",
    "RunnerRow",
    "RunnersView",
    "RunningAttempt",
    "agent_marker",
]
