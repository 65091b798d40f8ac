"""Recording off the request path: batching, backpressure, retries, flush; rewards; pause/drain;
the attempt cache; mounting beside the store server."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import httpx
import openai
import pytest

from reinforge import semconv
from reinforge.errors import PayloadTooLargeError, StoreUnavailableError
from reinforge.gateway import SpanRecorder, create_gateway_app
from reinforge.gateway.recorder import PendingSpan
from reinforge.inference import ScriptedBackend
from reinforge.net.background import BackgroundServer
from reinforge.store.http.server import create_store_app
from reinforge.store.memory import MemoryStore
from reinforge.types import AttemptOutcome, AttemptStatus, Span, SpanQuery

from .conftest import SECRET, Served, running_attempt, serve

MESSAGES = [{"role": "user", "content": "hi"}]


class GatedStore(MemoryStore):
    """A real store whose writes wait for a gate (a store that has fallen behind)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.batches: list[int] = []

    async def add_spans(self, spans: Sequence[Span]) -> int:
        await self.gate.wait()
        self.batches.append(len(spans))
        return await super().add_spans(spans)


class FlakyStore(MemoryStore):
    """A real store whose first `failures` writes fail as if the server were down."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    async def add_spans(self, spans: Sequence[Span]) -> int:
        if self.failures:
            self.failures -= 1
            raise StoreUnavailableError("store down")
        return await super().add_spans(spans)


class PickyStore(MemoryStore):
    """A real store that refuses any batch holding a span named "huge" (over its body limit)."""

    async def add_spans(self, spans: Sequence[Span]) -> int:
        if any(s.name == "huge" for s in spans):
            raise PayloadTooLargeError("request body exceeds the 1-byte limit")
        return await super().add_spans(spans)


def span(attempt_id: str, n: int) -> Span:
    return Span(rollout_id="r", attempt_id=attempt_id, name=f"s{n}")


async def test_full_queue_applies_backpressure_and_drops_nothing() -> None:
    store = GatedStore()
    recorder = SpanRecorder(store, max_queue=2, max_batch=2)
    recorder.start()
    tasks = [asyncio.create_task(recorder.record(span("a", n))) for n in range(7)]
    await asyncio.sleep(0.05)
    # Memory is bounded: the writer holds one batch (2), the queue two more; the rest wait for room.
    assert sum(t.done() for t in tasks) == 4
    flushed = asyncio.create_task(recorder.flush("a"))
    await asyncio.sleep(0.05)
    assert not flushed.done(), "flush must wait for the spans still queued"
    store.gate.set()
    await asyncio.wait_for(asyncio.gather(*tasks, flushed), 5)
    page = await store.query_spans(SpanQuery(attempt_id="a"))
    assert sorted(s.name for s in page.items) == [f"s{n}" for n in range(7)]
    assert max(store.batches) > 1, "spans are written in batches"
    await recorder.close()


async def test_failed_writes_are_retried_until_stored() -> None:
    store = FlakyStore(failures=2)
    recorder = SpanRecorder(store, max_retry_delay_s=0.05)
    recorder.start()
    for n in range(3):
        await recorder.record(span("b", n))
    await asyncio.wait_for(recorder.flush("b"), 5)
    assert (await store.query_spans(SpanQuery(attempt_id="b"))).total == 3
    assert recorder.write_errors == 2
    await recorder.flush("never-recorded")  # nothing pending: returns at once
    await recorder.close()


async def test_a_span_the_store_refuses_is_isolated_not_a_stall() -> None:
    store = PickyStore()
    recorder = SpanRecorder(store, linger_s=0.2)
    recorder.start()
    for n in range(5):
        await recorder.record(span("c", n))
    await recorder.record(Span(rollout_id="r", attempt_id="c", name="huge"))
    await recorder.record(span("c", 5))
    await asyncio.wait_for(recorder.flush("c"), 5)
    stored = (await store.query_spans(SpanQuery(attempt_id="c"))).items
    assert sorted(s.name for s in stored) == [f"s{n}" for n in range(6)]
    assert recorder.rejected == 1
    await recorder.close()


async def test_pending_spans_are_built_by_the_writer_and_a_broken_one_is_isolated(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemoryStore()
    recorder = SpanRecorder(store, linger_s=0.2)
    recorder.start()
    built: list[int] = []

    def build(n: int) -> Span:
        built.append(n)
        return span("p", n)

    def broken() -> Span:
        raise ValueError("a field the gateway got wrong")

    await recorder.record(PendingSpan("p", lambda: build(0)))
    await recorder.record(PendingSpan("p", broken))
    await recorder.record(span("p", 1))
    await recorder.record(PendingSpan("p", lambda: build(2)))
    assert built == [] and recorder.queued == 4  # nothing is built on the recording call's path
    await asyncio.wait_for(recorder.flush("p"), 5)  # the broken one counts as done: no hang
    stored = (await store.query_spans(SpanQuery(attempt_id="p"))).items
    assert sorted(s.name for s in stored) == ["s0", "s1", "s2"] and built == [0, 2]
    assert recorder.rejected == 1 and recorder.written == 3
    assert "building a span of attempt p failed" in caplog.text
    await recorder.close()


async def test_reward_route_and_flush(served: Served) -> None:
    attempt_id = (await running_attempt(served.store)).attempt.attempt_id
    headers = served.headers(attempt_id)
    async with httpx.AsyncClient(base_url=f"{served.url}/r/{attempt_id}", headers=headers) as http:
        first = await http.post("/reward", json={"reward": 0.25, "final": False, "name": "format"})
        assert first.status_code == 200 and first.json()["final"] is False
        final = await http.post("/reward", json={"reward": 1.0}, headers={"X-Reinforge-Agent": "solver"})
        assert final.status_code == 200
        flushed = await http.post("/flush")
        assert flushed.json() == {"attempt_id": attempt_id, "flushed": True}
        assert (await http.post("/flush", headers={"Authorization": "Bearer nope"})).status_code == 401
    # /flush returned, so both spans are already in the store.
    spans = (await served.store.query_spans(SpanQuery(attempt_id=attempt_id))).items
    assert [s.name for s in spans] == [semconv.SPAN_REWARD, semconv.SPAN_FINAL_REWARD]
    assert spans[0].attributes[semconv.ATTR_REWARD_VALUE] == 0.25
    assert spans[0].attributes[semconv.ATTR_REWARD_NAME] == "format"
    assert spans[1].attributes[semconv.ATTR_REWARD_VALUE] == 1.0
    assert spans[1].attributes[semconv.ATTR_AGENT_NAME] == "solver"
    assert spans[1].attributes[semconv.ATTR_STEP_KIND] == semconv.STEP_REWARD
    assert [s.attributes[semconv.ATTR_SEQUENCE_IN_ATTEMPT] for s in spans] == [0, 1]


async def test_pause_drains_in_flight_and_holds_new_calls(tokenizer: Any) -> None:
    backend = ScriptedBackend(tokenizer, ["slow"], delay_s=0.4)
    for served in serve(backend):
        gateway = served.gateway
        attempt_id = (await running_attempt(served.store)).attempt.attempt_id
        client = served.client(attempt_id)
        first = asyncio.create_task(client.chat.completions.create(model="p", messages=MESSAGES))  # type: ignore[arg-type]
        while gateway.in_flight == 0:
            await asyncio.sleep(0.01)
        # pause() is called from this test's loop; the gateway serves from another thread's loop.
        paused = asyncio.create_task(gateway.pause())
        await asyncio.sleep(0.05)
        second = asyncio.create_task(client.chat.completions.create(model="p", messages=MESSAGES))  # type: ignore[arg-type]
        await asyncio.wait_for(paused, 5)
        assert first.done() and (await first).choices[0].message.content == "slow"
        await asyncio.sleep(0.3)
        assert not second.done() and gateway.in_flight == 0, "a call that arrived during the pause waits"
        backend.policy_version = 1  # the "weight update" happens while nothing is in flight
        gateway.resume()
        assert (await asyncio.wait_for(second, 5)).choices[0].message.content == "slow"
        await gateway.flush(attempt_id)
        spans = (await served.store.query_spans(SpanQuery(attempt_id=attempt_id))).items
        assert [s.attributes[semconv.ATTR_POLICY_VERSION] for s in spans] == [0, 1]


async def test_calls_of_held_rollouts_wait_for_their_policy_version(tokenizer: Any) -> None:
    backend = ScriptedBackend(tokenizer, ["ok"])
    for served in serve(backend):
        gateway = served.gateway
        free = await running_attempt(served.store)
        held = await running_attempt(served.store)
        dropped = await running_attempt(served.store)
        gateway.hold_rollouts([held.rollout.rollout_id, dropped.rollout.rollout_id], version=1)
        assert gateway.holds.held == 2

        def call(leased: Any, served: Served = served) -> asyncio.Task[Any]:
            client = served.client(leased.attempt.attempt_id)
            return asyncio.create_task(client.chat.completions.create(model="p", messages=MESSAGES))  # type: ignore[arg-type]

        waiting, cancelled = call(held), call(dropped)
        # A rollout nobody holds goes straight through while the others wait.
        assert (await asyncio.wait_for(call(free), 5)).choices[0].message.content == "ok"
        await asyncio.sleep(0.2)
        assert not waiting.done() and not cancelled.done() and gateway.in_flight == 0
        gateway.release_version(0)  # an older version releases nothing
        await asyncio.sleep(0.1)
        assert not waiting.done()
        gateway.drop_holds([dropped.rollout.rollout_id])
        with pytest.raises(openai.ConflictError, match="cancelled before the policy version"):
            await asyncio.wait_for(cancelled, 5)
        assert not waiting.done()
        backend.policy_version = 1  # what the trainer publishes before releasing the version
        gateway.release_version(1)
        assert (await asyncio.wait_for(waiting, 5)).choices[0].message.content == "ok"
        assert gateway.holds.held == 0
        await gateway.flush()
        spans = (await served.store.query_spans(SpanQuery(attempt_id=held.attempt.attempt_id))).items
        assert [s.attributes[semconv.ATTR_POLICY_VERSION] for s in spans] == [1]
        # Later calls of a released rollout are not held again.
        assert (await asyncio.wait_for(call(held), 5)).choices[0].message.content == "ok"


async def test_attempt_is_looked_up_once_for_many_calls(served: Served) -> None:
    attempt_id = (await running_attempt(served.store)).attempt.attempt_id
    client = served.client(attempt_id)
    await asyncio.gather(*[client.chat.completions.create(model="p", messages=MESSAGES) for _ in range(8)])  # type: ignore[arg-type]
    assert served.gateway.attempts.lookups == 1
    await served.gateway.flush(attempt_id)
    spans = (await served.store.query_spans(SpanQuery(attempt_id=attempt_id))).items
    assert sorted(s.attributes[semconv.ATTR_SEQUENCE_IN_ATTEMPT] for s in spans) == list(range(8))


async def test_attempts_a_runner_reports_leased_need_no_store_lookup(served: Served) -> None:
    leased = await running_attempt(served.store)
    finished = await running_attempt(served.store)
    ended_id = finished.attempt.attempt_id
    await served.store.finish_attempt(ended_id, AttemptOutcome(status=AttemptStatus.succeeded))
    ended = await served.store.get_attempt(ended_id)
    served.gateway.attempts.remember_running([leased.attempt, ended])
    client = served.client(leased.attempt.attempt_id)
    await asyncio.gather(*[client.chat.completions.create(model="p", messages=MESSAGES) for _ in range(3)])  # type: ignore[arg-type]
    assert served.gateway.attempts.lookups == 0
    # An attempt that is not running is not taken on the runner's word: the store is asked, and says no.
    with pytest.raises(openai.ConflictError):
        await served.client(ended.attempt_id).chat.completions.create(model="p", messages=MESSAGES)  # type: ignore[arg-type]
    assert served.gateway.attempts.lookups == 1


async def test_traceparent_nests_the_call_under_the_agent_span(served: Served) -> None:
    attempt_id = (await running_attempt(served.store)).attempt.attempt_id
    trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    await served.client(attempt_id).chat.completions.create(
        model="p",
        messages=MESSAGES,
        extra_headers={"traceparent": f"00-{trace_id}-{parent}-01"},  # type: ignore[arg-type]
    )
    await served.client(attempt_id).chat.completions.create(model="p", messages=MESSAGES)  # type: ignore[arg-type]
    await served.gateway.flush(attempt_id)
    first, second = (await served.store.query_spans(SpanQuery(attempt_id=attempt_id))).items
    assert (first.trace_id, first.parent_id) == (trace_id, parent)
    assert second.trace_id == attempt_id and second.parent_id is None


async def test_mounted_beside_the_store_server(tokenizer: Any) -> None:
    store = MemoryStore()
    store_app = create_store_app(store, "store-token")
    store_app.mount("/gateway", create_gateway_app(store, ScriptedBackend(tokenizer, ["mounted"]), SECRET))
    with BackgroundServer(store_app) as server:
        attempt_id = (await running_attempt(store)).attempt.attempt_id
        served = Served(server.url + "/gateway", store, ScriptedBackend(tokenizer, ["x"]), None)
        response = await served.client(attempt_id).chat.completions.create(model="p", messages=MESSAGES)  # type: ignore[arg-type]
        assert response.choices[0].message.content == "mounted"
        async with httpx.AsyncClient(base_url=server.url) as http:
            flushed = await http.post(f"/gateway/r/{attempt_id}/flush", headers=served.headers(attempt_id))
            assert flushed.status_code == 200
            assert (await http.get("/health")).status_code == 200  # the store's own routes still answer
            assert (await http.get("/gateway/health")).json()["calls"] == 1
        spans = (await store.query_spans(SpanQuery(attempt_id=attempt_id))).items
        assert [s.name for s in spans] == [semconv.SPAN_LLM_CALL]
        with pytest.raises(openai.NotFoundError):
            await served.client("missing").chat.completions.create(model="p", messages=MESSAGES)  # type: ignore[arg-type]


async def test_the_gateway_beside_the_store_learns_of_attempts_leased_over_http(tokenizer: Any) -> None:
    """Runner processes lease from the store server: its lease route tells the gateway mounted beside
    it, so their calls need no store lookup."""
    from reinforge.store.http.client import HttpStoreClient
    from reinforge.types import RolloutSpec

    store = MemoryStore()
    gateway_app = create_gateway_app(store, ScriptedBackend(tokenizer, ["leased"]), SECRET)
    gateway = gateway_app.state.gateway

    def tell_gateway(leased: list[Any]) -> None:
        gateway.attempts.remember_running(lr.attempt for lr in leased)

    store_app = create_store_app(store, "store-token", on_lease=tell_gateway)
    store_app.mount("/gateway", gateway_app)
    with BackgroundServer(store_app) as server:
        await store.enqueue_rollouts([RolloutSpec(task={"q": i}) for i in range(3)])
        remote = HttpStoreClient(server.url, "store-token")
        try:
            leased = await remote.lease_rollouts("remote-runner", max_rollouts=3)
        finally:
            await remote.close()
        assert len(leased) == 3
        served = Served(server.url + "/gateway", store, ScriptedBackend(tokenizer, ["x"]), None)
        for lr in leased:
            response = await served.client(lr.attempt.attempt_id).chat.completions.create(  # type: ignore[call-overload]
                model="p", messages=MESSAGES
            )
            assert response.choices[0].message.content == "leased"
        assert gateway.attempts.lookups == 0


async def test_shutdown_writes_the_spans_still_queued(tokenizer: Any) -> None:
    for served in serve(ScriptedBackend(tokenizer, ["bye"]), span_linger_s=30.0):
        attempt_id = (await running_attempt(served.store)).attempt.attempt_id
        for _ in range(3):
            await served.client(attempt_id).chat.completions.create(model="p", messages=MESSAGES)  # type: ignore[arg-type]
        queued = await served.store.query_spans(SpanQuery(attempt_id=attempt_id))
        assert queued.total == 0, "still lingering"
    # Leaving `serve` stopped the server; its lifespan closed the gateway, which wrote them.
    assert (await served.store.query_spans(SpanQuery(attempt_id=attempt_id))).total == 3


async def test_concurrent_attempts_each_get_all_their_spans(served: Served) -> None:
    attempts = [(await running_attempt(served.store)).attempt.attempt_id for _ in range(6)]

    async def agent(attempt_id: str) -> None:
        client = served.client(attempt_id)
        for i in range(4):
            if i % 2:
                stream = await client.chat.completions.create(model="p", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
                async for _ in stream:
                    pass
            else:
                await client.chat.completions.create(model="p", messages=MESSAGES)  # type: ignore[arg-type]
        async with httpx.AsyncClient() as http:
            flushed = await http.post(
                f"{served.url}/r/{attempt_id}/flush", headers=served.headers(attempt_id)
            )
            assert flushed.status_code == 200
        # The flush returned, so this attempt's four spans are stored, whatever the others are doing.
        spans = (await served.store.query_spans(SpanQuery(attempt_id=attempt_id))).items
        assert sorted(s.attributes[semconv.ATTR_SEQUENCE_IN_ATTEMPT] for s in spans) == [0, 1, 2, 3]

    await asyncio.gather(*[agent(a) for a in attempts])
    assert served.gateway.in_flight == 0
