"""The store client across a store server that restarts or drops connections mid-call: idempotent
re-sends, nothing acknowledged lost, nothing applied twice."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from reinforge.errors import StaleAttemptError, StoreUnavailableError
from reinforge.net.background import BackgroundServer
from reinforge.net.keepalive_transport import KeepAliveTransport
from reinforge.store.http.client import HttpStoreClient
from reinforge.store.http.server import create_store_app
from reinforge.store.protocol import Store
from reinforge.store.sql.store import SqlStore
from reinforge.types import AttemptOutcome, AttemptQuery, AttemptStatus, RolloutSpec, RolloutStatus

TOKEN = "chaos-token"


class _AnswerLost(KeepAliveTransport):
    """Sends each request to the server, but for the first request to a path in `cut` throws the
    answer away and raises as a connection that broke mid-call would: the server has applied it."""

    def __init__(self, cut: set[str]) -> None:
        super().__init__()
        self.cut = set(cut)
        self.sent: list[str] = []

    async def send_wire(
        self, mod: ModuleType, pool: Any, host: str, port: int, wire: bytes, request: Any
    ) -> Any:
        path = wire.split(b" ", 2)[1].decode().partition("?")[0]
        self.sent.append(path)
        answer = await super().send_wire(mod, pool, host, port, wire, request)
        if any(path.endswith(p) for p in self.cut):
            self.cut = {p for p in self.cut if not path.endswith(p)}
            answer.conn.close()
            raise httpx.ReadError("connection reset by peer", request=request)
        return answer


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[BackgroundServer]:
    async def open_backend() -> Store:
        return await SqlStore.open(f"sqlite:///{tmp_path / 'store.db'}")

    served = await asyncio.to_thread(BackgroundServer(create_store_app(open_backend, TOKEN)).start)
    yield served
    await asyncio.to_thread(served.stop)


async def test_a_finish_whose_answer_was_lost_is_resent_and_applied_once(server: BackgroundServer) -> None:
    transport = _AnswerLost({"/finish", "/rollouts/enqueue"})
    client = HttpStoreClient(server.url, TOKEN, transport=transport)
    try:
        # The enqueue is applied, its answer lost, and re-sent: one rollout, returned as the first would.
        [rollout] = await client.enqueue_rollouts([RolloutSpec(rollout_id="r1", task={"q": 1})])
        assert rollout.rollout_id == "r1" and transport.sent.count("/store/rollouts/enqueue") == 2
        [leased] = await client.lease_rollouts("runner", 1)
        attempt_id = leased.attempt.attempt_id
        done = await client.finish_attempt(
            attempt_id, AttemptOutcome(status=AttemptStatus.succeeded, reward=1.0)
        )
        assert done.status == RolloutStatus.succeeded and done.reward == 1.0
        assert sum(p.endswith("/finish") for p in transport.sent) == 2
        attempts = (await client.query_attempts(AttemptQuery(rollout_id="r1"))).items
        assert [(a.attempt_id, a.status) for a in attempts] == [(attempt_id, AttemptStatus.succeeded)]
        # A finish that was not re-sent keeps the late-finish rule.
        with pytest.raises(StaleAttemptError):
            await client.finish_attempt(
                attempt_id, AttemptOutcome(status=AttemptStatus.succeeded, reward=1.0)
            )
    finally:
        await client.close()


async def test_a_resent_finish_that_lost_the_race_is_still_refused(server: BackgroundServer) -> None:
    """The attempt was ended otherwise (here: failed by someone else) before the re-send: refused."""
    setup = HttpStoreClient(server.url, TOKEN)
    transport = _AnswerLost({"/finish"})
    client = HttpStoreClient(server.url, TOKEN, transport=transport)
    try:
        await setup.enqueue_rollouts([RolloutSpec(rollout_id="r2", max_attempts=1)])
        [leased] = await setup.lease_rollouts("runner", 1)
        attempt_id = leased.attempt.attempt_id
        await setup.finish_attempt(attempt_id, AttemptOutcome(status=AttemptStatus.failed, error="x"))
        with pytest.raises(StaleAttemptError):
            await client.finish_attempt(
                attempt_id, AttemptOutcome(status=AttemptStatus.succeeded, reward=1.0)
            )
        assert (await setup.get_rollout("r2")).status == RolloutStatus.failed
    finally:
        await client.close()
        await setup.close()


async def test_a_client_rides_over_a_restart_longer_than_its_connect_retries(tmp_path: Path) -> None:
    async def open_backend() -> Store:
        return await SqlStore.open(f"sqlite:///{tmp_path / 'store.db'}")

    first = await asyncio.to_thread(BackgroundServer(create_store_app(open_backend, TOKEN)).start)
    port = first.port
    client = HttpStoreClient(first.url, TOKEN, connect_retries=1, restart_window_s=30.0)
    fresh = HttpStoreClient(first.url, TOKEN, connect_retries=1, restart_window_s=30.0)
    await client.enqueue_rollouts([RolloutSpec(rollout_id="before")])
    await asyncio.to_thread(first.stop)

    async def restart_later() -> BackgroundServer:
        await asyncio.sleep(2.0)  # longer than one retry's back-off
        return await asyncio.to_thread(
            BackgroundServer(create_store_app(open_backend, TOKEN), port=port).start
        )

    # A client that never reached the server fails fast (a wrong URL is not a restart).
    started = time.monotonic()
    with pytest.raises(StoreUnavailableError):
        await fresh.counters()
    assert time.monotonic() - started < 1.5
    restarting = asyncio.create_task(restart_later())
    try:
        [again] = await client.enqueue_rollouts([RolloutSpec(rollout_id="during")])
        assert again.rollout_id == "during"
        assert (await client.get_rollout("before")).status == RolloutStatus.queued
        client.stop_retrying()
        second = await restarting
        await asyncio.to_thread(second.stop)
        started = time.monotonic()
        with pytest.raises(StoreUnavailableError):
            await client.counters()
        assert time.monotonic() - started < 1.0  # on its way out: no waiting for a restart
    finally:
        if not restarting.done():
            await asyncio.to_thread((await restarting).stop)
        await client.close()
        await fresh.close()
