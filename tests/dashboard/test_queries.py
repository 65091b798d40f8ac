"""The dashboard's rollout list and runners view on every store: SQLite and PostgreSQL (keyset SQL) and
the memory store (the protocol scan) give the same answers, which a plain Python filter over the
stored rollouts gives too; paging by cursor returns every match once, newest first."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest
from tests.store.conftest import memory_store, postgres_store, sqlite_store

from reinforge.semconv import ATTR_AGENT_NAME
from reinforge.store import dashboard_queries
from reinforge.store.dashboard_backend import dashboard_queries_for
from reinforge.store.dashboard_queries import RolloutFilter
from reinforge.store.protocol import Store
from reinforge.store.sql.dashboard_queries import SqlDashboardQueries
from reinforge.types import (
    AttemptOutcome,
    AttemptStatus,
    RolloutMode,
    RolloutQuery,
    RolloutSpec,
    RolloutStatus,
    Span,
)

BACKENDS: dict[str, Callable[[Path], AbstractAsyncContextManager[Store]]] = {
    "memory": memory_store,
    "sqlite": sqlite_store,
    "postgres": pytest.param(postgres_store, marks=pytest.mark.postgres),  # type: ignore[dict-item]
}
N = 60


@pytest.fixture(params=list(BACKENDS.values()), ids=list(BACKENDS))
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    async with request.param(tmp_path) as opened:
        await fill(opened)
        yield opened


@pytest.fixture(
    params=[sqlite_store, pytest.param(postgres_store, marks=pytest.mark.postgres)],
    ids=["sqlite", "postgres"],
)
async def sql_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    async with request.param(tmp_path) as opened:
        await fill(opened)
        yield opened


async def fill(store: Store) -> None:
    """N rollouts over three policy versions: train and val, succeeded/failed/queued, agents a and b."""
    for version in range(3):
        await store.put_resources({"policy_version": version, "llm": {"model": "m"}})
    specs = [
        RolloutSpec(
            rollout_id=f"r{i:03d}",
            task={"question": f"what is {i} + {i % 7}?"},
            mode=RolloutMode.val if i % 4 == 0 else RolloutMode.train,
            resources_version=i % 3,
        )
        for i in range(N)
    ]
    await store.enqueue_rollouts(specs)
    for i in range(N - 10):  # the last ten stay queued
        (leased,) = await store.lease_rollouts(f"runner-{i % 2}")
        rid, attempt = leased.rollout.rollout_id, leased.attempt.attempt_id
        agent = "a" if int(rid[1:]) % 2 else "b"
        await store.add_spans(
            [Span(rollout_id=rid, attempt_id=attempt, name="step", attributes={ATTR_AGENT_NAME: agent})]
        )
        failed = int(rid[1:]) % 5 == 0
        outcome = AttemptOutcome(
            status=AttemptStatus.failed if failed else AttemptStatus.succeeded,
            reward=None if failed else (int(rid[1:]) % 10) / 10,
            retryable=False,
        )
        await store.finish_attempt(attempt, outcome)


def expected(rollouts: list[Any], where: RolloutFilter) -> list[str]:
    def keep(r: Any) -> bool:
        i = int(r.rollout_id[1:])
        return (
            (where.statuses is None or r.status in where.statuses)
            and (where.mode is None or r.mode is where.mode)
            and (where.reward_min is None or (r.reward is not None and r.reward >= where.reward_min))
            and (where.reward_max is None or (r.reward is not None and r.reward <= where.reward_max))
            and (where.task_text is None or where.task_text.lower() in str(r.task).lower())
            and (where.policy_version is None or r.resources_version == where.policy_version)
            and (
                where.agent is None
                or (r.status is not RolloutStatus.queued and where.agent == ("a" if i % 2 else "b"))
            )
        )

    return [r.rollout_id for r in reversed(rollouts) if keep(r)]


FILTERS = [
    RolloutFilter(),
    RolloutFilter(statuses=[RolloutStatus.failed]),
    RolloutFilter(statuses=[RolloutStatus.queued, RolloutStatus.failed], mode=RolloutMode.train),
    RolloutFilter(reward_min=0.5),
    RolloutFilter(reward_min=0.2, reward_max=0.4, mode=RolloutMode.train),
    RolloutFilter(task_text="+ 3?"),
    RolloutFilter(task_text="WHAT IS 1"),  # case-insensitive
    RolloutFilter(task_text="100%"),  # LIKE wildcards are matched literally: nothing has "100%"
    RolloutFilter(policy_version=2),
    RolloutFilter(agent="a", statuses=[RolloutStatus.succeeded]),
    RolloutFilter(agent="nobody"),
]


async def all_pages(store: Store, where: RolloutFilter, limit: int) -> list[str]:
    queries = dashboard_queries_for(store)
    seen: list[str] = []
    before = None
    for _ in range(200):
        page = await queries.rollouts(where, before, limit)
        assert len(page.items) <= limit
        seen += [r.rollout_id for r in page.items]
        if page.next_cursor is None:
            return seen
        before = page.next_cursor
    raise AssertionError("paging never ended")


async def test_pages_return_every_match_once_newest_first(store: Store) -> None:
    rollouts = (await store.query_rollouts(RolloutQuery(limit=1000))).items
    for where in FILTERS:
        for limit in (7, 100):
            assert await all_pages(store, where, limit) == expected(rollouts, where), (where, limit)


async def test_rows_carry_the_policy_version_and_previews(store: Store) -> None:
    page = await dashboard_queries_for(store).rollouts(RolloutFilter(), None, 3)
    first = page.items[0]
    assert first.rollout_id == f"r{N - 1:03d}" and first.status is RolloutStatus.queued
    assert first.resources_version == (N - 1) % 3 == first.policy_version
    assert first.task_preview == f'{{"question": "what is {N - 1} + {(N - 1) % 7}?"}}'
    assert page.next_cursor == page.items[-1].seq and page.complete


async def test_sql_queries_are_keyset_pages_bounded_in_time(
    sql_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = sql_store
    queries = dashboard_queries_for(store)
    assert isinstance(queries, SqlDashboardQueries)
    monkeypatch.setattr("reinforge.store.sql.dashboard_queries.SCAN_BUDGET_S", 0.0)
    monkeypatch.setattr("reinforge.store.sql.dashboard_queries._FIRST_WINDOW", 10)
    where = RolloutFilter(task_text="what is 5 +")  # one match, in the oldest window
    page = await queries.rollouts(where, None, 5)
    assert not page.complete and page.items == [] and page.next_cursor is not None
    assert await all_pages(store, where, limit=5) == ["r005"]


async def test_runners_view(store: Store) -> None:
    view = await dashboard_queries_for(store).runners()
    assert {r.runner_id for r in view.runners} == {"runner-0", "runner-1"}
    assert sum(r.attempts for r in view.runners) == N - 10
    assert sum(r.failed for r in view.runners) == sum(1 for i in range(N - 10) if i % 5 == 0)
    assert view.running == []
    (leased,) = await store.lease_rollouts("runner-9")
    view = await dashboard_queries_for(store).runners()
    assert [a.attempt_id for a in view.running] == [leased.attempt.attempt_id]
    assert view.runners[0].runner_id == "runner-9" and view.runners[0].running == 1


def test_filters_refuse_an_empty_range() -> None:
    with pytest.raises(ValueError, match="reward_min"):
        RolloutFilter(reward_min=1.0, reward_max=0.0)
    assert dashboard_queries.RolloutFilter().is_empty
