"""PostgreSQL specifics: several stores on one database (as several server processes would be)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from reinforge.store import SqlStore
from reinforge.types import AttemptOutcome, AttemptStatus, RolloutSpec, RolloutStatus

from ..chaos import run_chaos
from ..conftest import PG_URL, WAKE_LIMIT, pg_schema
from ..durability import assert_acked_spans_present, write_until_killed

pytestmark = pytest.mark.postgres


@pytest.fixture
async def two_stores() -> AsyncIterator[tuple[SqlStore, SqlStore]]:
    async with pg_schema() as schema:
        a = await SqlStore.open(PG_URL, schema=schema, workers=4)
        b = await SqlStore.open(f"{PG_URL}?schema={schema}", workers=4)
        try:
            yield a, b
        finally:
            await a.close()
            await b.close()


async def test_two_stores_leasing_concurrently_never_share_a_rollout(
    two_stores: tuple[SqlStore, SqlStore],
) -> None:
    a, b = two_stores
    ids = {r.rollout_id for r in await a.enqueue_rollouts([RolloutSpec(task={"i": i}) for i in range(300)])}

    async def worker(store: SqlStore, n: int) -> list[str]:
        got: list[str] = []
        while batch := await store.lease_rollouts(f"w{n}", max_rollouts=4):
            got += [lr.rollout.rollout_id for lr in batch]
        return got

    results = await asyncio.gather(*(worker(a if n % 2 else b, n) for n in range(12)))
    leased = [rid for got in results for rid in got]
    assert len(leased) == len(set(leased)) == 300 and set(leased) == ids
    # Both stores did part of the work.
    assert sum(len(r) for r in results[1::2]) > 0 and sum(len(r) for r in results[0::2]) > 0


async def test_a_lease_waiting_on_one_store_wakes_on_an_enqueue_through_another(
    two_stores: tuple[SqlStore, SqlStore],
) -> None:
    a, b = two_stores
    waiter = asyncio.create_task(a.lease_rollouts("r", wait_seconds=10))
    await asyncio.sleep(0.3)
    start = time.monotonic()
    await b.enqueue_rollouts([RolloutSpec(rollout_id="x")])
    (leased,) = await asyncio.wait_for(waiter, 5)
    # LISTEN/NOTIFY: the conftest pushes the safety re-check far past WAKE_LIMIT.
    assert time.monotonic() - start < WAKE_LIMIT
    assert leased.rollout.rollout_id == "x"


async def test_wait_for_rollouts_wakes_on_a_finish_through_another_store(
    two_stores: tuple[SqlStore, SqlStore],
) -> None:
    a, b = two_stores
    await a.enqueue_rollouts([RolloutSpec(rollout_id="x")])
    (lr,) = await b.lease_rollouts("r")
    waiter = asyncio.create_task(a.wait_for_rollouts(["x"], timeout_seconds=10))
    await asyncio.sleep(0.3)
    start = time.monotonic()
    await b.finish_attempt(lr.attempt.attempt_id, AttemptOutcome(status=AttemptStatus.succeeded, reward=1.0))
    (done,) = await asyncio.wait_for(waiter, 5)
    assert time.monotonic() - start < WAKE_LIMIT
    assert done.status is RolloutStatus.succeeded and done.reward == 1.0


async def test_expiry_seen_by_both_stores_happens_once(two_stores: tuple[SqlStore, SqlStore]) -> None:
    a, b = two_stores
    await a.enqueue_rollouts([RolloutSpec(rollout_id="x", max_attempts=3)])
    await a.lease_rollouts("dead", lease_seconds=0.2)
    await asyncio.sleep(0.35)
    got = await asyncio.gather(a.lease_rollouts("ra"), b.lease_rollouts("rb"))
    winners = [lr for g in got for lr in g]
    assert len(winners) == 1 and winners[0].attempt.attempt_no == 2
    assert (await a.get_rollout("x")).attempt_count == 2


async def test_concurrent_auto_numbered_resources_get_distinct_versions(
    two_stores: tuple[SqlStore, SqlStore],
) -> None:
    a, b = two_stores
    puts = await asyncio.gather(*(s.put_resources({"n": i}) for i, s in enumerate([a, b] * 4)))
    assert sorted(p.version for p in puts) == list(range(8))


async def test_acknowledged_span_batches_survive_sigkill() -> None:
    async with pg_schema() as schema:
        acked = write_until_killed(PG_URL, schema, acks_wanted=40)
        store = await SqlStore.open(PG_URL, schema=schema)
        try:
            await assert_acked_spans_present(store, acked)
        finally:
            await store.close()


async def test_chaos_across_two_stores_keeps_the_invariants(two_stores: tuple[SqlStore, SqlStore]) -> None:
    await run_chaos(list(two_stores), n_rollouts=80, n_workers=12)
