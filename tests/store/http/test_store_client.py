"""HttpStoreClient against a real server: same values and same exceptions as a local store."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import pytest

from reinforge.errors import (
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    StaleAttemptError,
    StoreUnavailableError,
)
from reinforge.store.http import client as client_module
from reinforge.store.http.client import HttpStoreClient
from reinforge.store.protocol import Store
from reinforge.types import (
    AttemptOutcome,
    AttemptStatus,
    RolloutQuery,
    RolloutSpec,
    RolloutStatus,
    Span,
    SpanQuery,
)


def _span(rollout_id: str, attempt_id: str, i: int) -> Span:
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        name="reinforge.llm_call",
        attributes={
            "reinforge.llm.prompt_token_ids": list(range(i, i + 50)),
            "nested": {"k": [1.5, None, "é"]},
        },
    )


async def test_client_implements_the_protocol(client: HttpStoreClient) -> None:
    assert isinstance(client, Store)


async def test_round_trip_keeps_every_value(client: HttpStoreClient) -> None:
    spec = RolloutSpec(
        rollout_id="a/b?c", task={"question": "1+1", "digits": [1, 2]}, group_id="g", metadata={"x": 1}
    )
    [rollout] = await client.enqueue_rollouts([spec])
    assert rollout.rollout_id == "a/b?c"
    assert (await client.get_rollout("a/b?c")).task == {"question": "1+1", "digits": [1, 2]}
    [leased] = await client.lease_rollouts("runner-1", lease_seconds=30)
    spans = [_span("a/b?c", leased.attempt.attempt_id, i) for i in range(20)]
    assert await client.add_spans(spans) == 20
    assert await client.add_spans(spans) == 0  # idempotent by span id
    page = await client.query_spans(SpanQuery(rollout_id="a/b?c", limit=7))
    assert page.total == 20
    assert page.next_offset == 7
    assert [s.span_id for s in page.items] == [s.span_id for s in spans[:7]]
    assert page.items[3].attributes == spans[3].attributes
    beat = await client.heartbeat(leased.attempt.attempt_id, lease_seconds=90)
    assert beat.lease_deadline > leased.attempt.lease_deadline
    done = await client.finish_attempt(
        leased.attempt.attempt_id, AttemptOutcome(status=AttemptStatus.succeeded, reward=0.25)
    )
    assert done.status is RolloutStatus.succeeded
    assert done.reward == 0.25
    attempt = await client.get_attempt(leased.attempt.attempt_id)
    assert attempt.status is AttemptStatus.succeeded
    counters = await client.counters()
    assert counters.rollouts_by_status[RolloutStatus.succeeded] == 1
    assert counters.spans == 20


async def test_typed_errors_cross_the_wire(client: HttpStoreClient) -> None:
    with pytest.raises(NotFoundError, match="missing-id"):
        await client.get_rollout("missing-id")
    with pytest.raises(NotFoundError):
        await client.get_resources()
    await client.enqueue_rollouts([RolloutSpec(rollout_id="r")])
    [leased] = await client.lease_rollouts("w")
    await client.finish_attempt(leased.attempt.attempt_id, AttemptOutcome(status=AttemptStatus.succeeded))
    with pytest.raises(StaleAttemptError):
        await client.finish_attempt(leased.attempt.attempt_id, AttemptOutcome(status=AttemptStatus.failed))
    with pytest.raises(ConflictError):  # StaleAttemptError is a ConflictError, as locally
        await client.heartbeat(leased.attempt.attempt_id)
    await client.put_resources({"a": 1}, version=0)
    with pytest.raises(ConflictError):
        await client.put_resources({"a": 2}, version=0)
    with pytest.raises(InvalidRequestError, match="max_rollouts"):
        await client.lease_rollouts("w", max_rollouts=0)


async def test_long_poll_lease_wakes_on_enqueue(client: HttpStoreClient, server: object) -> None:
    other = HttpStoreClient(client.base_url, client_module.resolve_client_token(None) or _token())

    async def enqueue_later() -> None:
        await asyncio.sleep(0.3)
        await other.enqueue_rollouts([RolloutSpec(rollout_id="late")])

    started = time.monotonic()
    task = asyncio.create_task(enqueue_later())
    leased = await client.lease_rollouts("w", wait_seconds=10)
    elapsed = time.monotonic() - started
    await task
    await other.close()
    assert [item.rollout.rollout_id for item in leased] == ["late"]
    assert 0.25 < elapsed < 3.0  # woken by the enqueue, not by the timeout


async def test_waits_longer_than_one_call_are_split(
    client: HttpStoreClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client_module, "MAX_WAIT_SECONDS", 0.2)
    started = time.monotonic()
    assert await client.lease_rollouts("w", wait_seconds=0.7) == []
    assert 0.6 < time.monotonic() - started < 3.0

    await client.enqueue_rollouts([RolloutSpec(rollout_id="x"), RolloutSpec(rollout_id="y")])
    [leased_x, leased_y] = await client.lease_rollouts("w", max_rollouts=2)

    async def finish_later() -> None:
        await asyncio.sleep(0.5)
        await client.finish_attempt(
            leased_x.attempt.attempt_id, AttemptOutcome(status=AttemptStatus.succeeded)
        )
        await client.finish_attempt(
            leased_y.attempt.attempt_id, AttemptOutcome(status=AttemptStatus.failed, retryable=False)
        )

    task = asyncio.create_task(finish_later())
    done = await client.wait_for_rollouts(["x", "y"], timeout_seconds=10)
    await task
    assert {r.rollout_id: r.status for r in done} == {"x": RolloutStatus.succeeded, "y": RolloutStatus.failed}


async def test_wait_times_out_with_what_is_final(client: HttpStoreClient) -> None:
    await client.enqueue_rollouts([RolloutSpec(rollout_id="q")])
    started = time.monotonic()
    assert await client.wait_for_rollouts(["q"], timeout_seconds=0.3) == []
    assert time.monotonic() - started < 3.0


async def test_cancel_and_query(client: HttpStoreClient) -> None:
    await client.enqueue_rollouts([RolloutSpec(rollout_id=f"c{i}", group_id="g") for i in range(5)])
    cancelled = await client.cancel_rollouts(["c0", "c1"])
    assert {r.rollout_id for r in cancelled} == {"c0", "c1"}
    page = await client.query_rollouts(RolloutQuery(statuses=[RolloutStatus.queued], group_id="g"))
    assert [r.rollout_id for r in page.items] == ["c2", "c3", "c4"]


async def test_concurrent_calls_share_one_pool(client: HttpStoreClient) -> None:
    specs = [RolloutSpec(rollout_id=f"p{i}") for i in range(64)]
    await asyncio.gather(*(client.enqueue_rollouts([s]) for s in specs))
    leased = await asyncio.gather(*(client.lease_rollouts(f"w{i}") for i in range(64)))
    ids = [item.rollout.rollout_id for batch in leased for item in batch]
    assert sorted(ids) == sorted(s.rollout_id for s in specs if s.rollout_id)  # each leased exactly once


async def test_unreachable_server_is_store_unavailable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = HttpStoreClient(f"http://127.0.0.1:{port}", "t", connect_retries=1)
    with pytest.raises(StoreUnavailableError, match=str(port)):
        await client.counters()
    await client.close()


def _token() -> str:
    from .conftest import TOKEN

    return TOKEN


async def test_calls_ride_over_a_server_restart(tmp_path: Path) -> None:
    from reinforge.net.background import BackgroundServer
    from reinforge.store.http.server import create_store_app
    from reinforge.store.sql.store import SqlStore

    async def open_backend() -> Store:
        return await SqlStore.open(f"sqlite:///{tmp_path / 'store.db'}")

    token = _token()
    first = BackgroundServer(create_store_app(open_backend, token)).start()
    port = first.port
    client = HttpStoreClient(first.url, token, connect_retries=8)
    await client.enqueue_rollouts([RolloutSpec(rollout_id="before")])
    await asyncio.to_thread(first.stop)  # the pooled keep-alive connection is now dead

    async def restart_later() -> BackgroundServer:
        await asyncio.sleep(0.5)
        return await asyncio.to_thread(
            BackgroundServer(create_store_app(open_backend, token), port=port).start
        )

    restarting = asyncio.create_task(restart_later())
    # Refused while down, then a broken keep-alive connection: both are re-sent, nothing is lost.
    assert await client.add_spans([_span("before", "a1", 0)]) == 1
    second = await restarting
    try:
        assert (await client.get_rollout("before")).rollout_id == "before"
        assert (await client.counters()).spans == 1
    finally:
        await client.close()
        await asyncio.to_thread(second.stop)
