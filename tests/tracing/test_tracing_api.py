"""The tracing API against a real MemoryStore: spans, rewards, errors, JSON attributes, context."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from opentelemetry import trace

import reinforge
from reinforge import semconv
from reinforge.errors import InvalidRequestError
from reinforge.store.memory import MemoryStore
from reinforge.tracing import (
    AttemptContext,
    SpanWriter,
    attempt_scope,
    current_attempt,
    emit_reward,
    install_global_tracer_provider,
    instrument_threads,
    span,
)
from reinforge.types import Span, SpanQuery, SpanStatusCode


@pytest.fixture
async def store() -> AsyncIterator[MemoryStore]:
    s = MemoryStore()
    yield s
    await s.close()


@pytest.fixture
async def writer(store: MemoryStore) -> AsyncIterator[SpanWriter]:
    w = await SpanWriter(store).start()
    yield w
    await w.close()


def _ctx(writer: SpanWriter, attempt: str = "a1", agent: str | None = None) -> AttemptContext:
    return AttemptContext(rollout_id="r-" + attempt, attempt_id=attempt, sink=writer, agent_name=agent)


async def _spans(store: MemoryStore, writer: SpanWriter, attempt: str = "a1") -> list[Span]:
    await writer.flush()
    return (await store.query_spans(SpanQuery(attempt_id=attempt))).items


async def test_reward_and_nested_spans_are_stored_with_ids_and_parents(
    store: MemoryStore, writer: SpanWriter
) -> None:
    with attempt_scope(_ctx(writer, agent="solver")):
        with span("plan", step=1) as outer:
            outer.set_attribute("plan", {"steps": ["a", "b"], "n": 2})
            with span("calculator", kind="tool", expression="2+2"):
                pass
            emit_reward(0.25, name="progress")
        emit_reward(1.0, final=True)

    spans = {s.name: s for s in await _spans(store, writer)}
    assert set(spans) == {"plan", "calculator", semconv.SPAN_REWARD, semconv.SPAN_FINAL_REWARD}
    plan, tool = spans["plan"], spans["calculator"]
    reward, final = spans[semconv.SPAN_REWARD], spans[semconv.SPAN_FINAL_REWARD]
    for s in spans.values():
        assert (s.rollout_id, s.attempt_id) == ("r-a1", "a1")
        assert s.end_time is not None and s.end_time >= s.start_time
        assert s.attributes[semconv.ATTR_AGENT_NAME] == "solver"
    assert tool.parent_id == plan.span_id and reward.parent_id == plan.span_id
    assert tool.trace_id == plan.trace_id
    assert plan.parent_id is None and final.parent_id is None
    assert plan.attributes["plan"] == {"steps": ["a", "b"], "n": 2}
    assert plan.attributes["step"] == 1
    assert plan.attributes[semconv.ATTR_STEP_KIND] == semconv.STEP_CUSTOM
    assert tool.attributes[semconv.ATTR_STEP_KIND] == semconv.STEP_TOOL
    assert tool.attributes[semconv.ATTR_TOOL_NAME] == "calculator"
    assert reward.attributes[semconv.ATTR_REWARD_VALUE] == 0.25
    assert reward.attributes[semconv.ATTR_REWARD_NAME] == "progress"
    assert final.attributes[semconv.ATTR_REWARD_VALUE] == 1.0
    assert "reinforge.internal.json_keys" not in plan.attributes
    # Stamped in start order: plan, calculator, reward, final.
    seq = {n: s.attributes[semconv.ATTR_SEQUENCE_IN_ATTEMPT] for n, s in spans.items()}
    assert seq == {"plan": 0, "calculator": 1, semconv.SPAN_REWARD: 2, semconv.SPAN_FINAL_REWARD: 3}


async def test_tool_error_sets_status_and_air_signal_and_reraises(
    store: MemoryStore, writer: SpanWriter
) -> None:
    with attempt_scope(_ctx(writer)):
        with pytest.raises(ZeroDivisionError), span("divide", kind="tool"):
            _ = 1 / 0
        with pytest.raises(KeyError), span("lookup"):
            raise KeyError("missing")

    spans = {s.name: s for s in await _spans(store, writer)}
    tool, custom = spans["divide"], spans["lookup"]
    assert tool.status.code == SpanStatusCode.error
    assert tool.status.message is not None and "ZeroDivisionError" in tool.status.message
    assert tool.attributes[semconv.ATTR_AIR_SIGNAL] == semconv.AIR_TOOL_ERROR
    assert [e.name for e in tool.events] == ["exception"]
    assert tool.events[0].attributes["exception.type"] == "ZeroDivisionError"
    # A custom step fails too, but only tools produce the tool_error signal.
    assert custom.status.code == SpanStatusCode.error
    assert semconv.ATTR_AIR_SIGNAL not in custom.attributes


async def test_decorator_on_sync_and_async_functions(store: MemoryStore, writer: SpanWriter) -> None:
    @span("add", kind="tool")
    def add(a: int, b: int) -> int:
        return a + b

    @span("fetch", kind="tool", source="web")
    async def fetch(q: str) -> str:
        await asyncio.sleep(0)
        if q == "bad":
            raise ValueError("no results")
        return q.upper()

    with attempt_scope(_ctx(writer)):
        assert add(2, 3) == 5
        assert await fetch("x") == "X"
        with pytest.raises(ValueError, match="no results"):
            await fetch("bad")
        # Concurrent calls of one decorated function each get their own span.
        assert await asyncio.gather(fetch("a"), fetch("b")) == ["A", "B"]

    spans = await _spans(store, writer)
    assert [s.name for s in spans].count("fetch") == 4
    assert len({s.span_id for s in spans}) == len(spans) == 5
    errors = [s for s in spans if s.status.code == SpanStatusCode.error]
    assert len(errors) == 1 and errors[0].attributes["source"] == "web"
    assert add.__name__ == "add" and fetch.__name__ == "fetch"


async def test_outside_an_attempt_nothing_is_recorded_and_nothing_breaks(
    store: MemoryStore, writer: SpanWriter
) -> None:
    assert current_attempt() is None
    emit_reward(1.0)
    with span("step", kind="tool") as s:
        s.set_attribute("x", [1, 2])
    await writer.flush()
    assert (await store.counters()).spans == 0


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "1.0", None, True])
def test_emit_reward_rejects_non_numbers(bad: Any) -> None:
    with pytest.raises(InvalidRequestError, match="reward must be"):
        emit_reward(bad)


def test_span_rejects_unknown_kind_and_empty_name() -> None:
    with pytest.raises(InvalidRequestError, match="kind"):
        span("x", kind="llm")  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match="name"):
        span("")


async def test_context_flows_into_threads_executors_and_tasks(store: MemoryStore, writer: SpanWriter) -> None:
    instrument_threads()
    loop = asyncio.get_running_loop()

    def reward_in_thread(value: float) -> None:
        emit_reward(value, name=f"thread-{value}")

    async def reward_in_task(value: float) -> None:
        await asyncio.sleep(0)
        emit_reward(value, name=f"task-{value}")

    with attempt_scope(_ctx(writer)):
        t = threading.Thread(target=reward_in_thread, args=(1.0,))
        t.start()
        t.join()

        class Worker(threading.Thread):  # a subclass that overrides run() is covered too
            def run(self) -> None:
                reward_in_thread(2.0)

        w = Worker()
        w.start()
        w.join()
        with ThreadPoolExecutor(2) as pool:
            pool.submit(reward_in_thread, 3.0).result()
        await loop.run_in_executor(None, reward_in_thread, 4.0)
        await asyncio.to_thread(reward_in_thread, 5.0)
        await asyncio.gather(reward_in_task(6.0), reward_in_task(7.0))

    names = sorted(s.attributes[semconv.ATTR_REWARD_NAME] for s in await _spans(store, writer))
    assert names == [
        "task-6.0",
        "task-7.0",
        "thread-1.0",
        "thread-2.0",
        "thread-3.0",
        "thread-4.0",
        "thread-5.0",
    ]

    # Threads started outside an attempt stay outside one.
    seen: list[AttemptContext | None] = []
    t = threading.Thread(target=lambda: seen.append(current_attempt()))
    t.start()
    t.join()
    assert seen == [None]


async def test_concurrent_attempts_keep_their_own_spans(store: MemoryStore, writer: SpanWriter) -> None:
    instrument_threads()

    async def agent(attempt: str, value: float) -> None:
        with attempt_scope(_ctx(writer, attempt)), span("work"):
            await asyncio.sleep(0.01)
            await asyncio.to_thread(emit_reward, value)

    await asyncio.gather(*(agent(f"a{i}", float(i)) for i in range(5)))
    for i in range(5):
        spans = await _spans(store, writer, f"a{i}")
        assert sorted(s.name for s in spans) == [semconv.SPAN_REWARD, "work"]
        reward = next(s for s in spans if s.name == semconv.SPAN_REWARD)
        assert reward.attributes[semconv.ATTR_REWARD_VALUE] == float(i)
        assert reward.parent_id == next(s for s in spans if s.name == "work").span_id


async def test_global_provider_routes_third_party_spans(store: MemoryStore, writer: SpanWriter) -> None:
    install_global_tracer_provider()
    framework_tracer = trace.get_tracer("some.agent.framework")
    with (
        attempt_scope(_ctx(writer)),
        framework_tracer.start_as_current_span("framework.step"),
        reinforge.span("inner"),
    ):
        pass
    spans = {s.name: s for s in await _spans(store, writer)}
    assert spans["inner"].parent_id == spans["framework.step"].span_id


async def test_pool_workers_started_inside_an_attempt_do_not_leak_it(
    store: MemoryStore, writer: SpanWriter
) -> None:
    instrument_threads()
    with ThreadPoolExecutor(1) as pool:
        with attempt_scope(_ctx(writer)):
            assert pool.submit(current_attempt).result() is not None  # starts the worker in the attempt
        assert pool.submit(current_attempt).result() is None
        loop = asyncio.get_running_loop()
        with attempt_scope(_ctx(writer)):
            await loop.run_in_executor(pool, emit_reward, 1.0)
        assert await loop.run_in_executor(pool, current_attempt) is None


async def test_json_attributes_survive_later_updates(store: MemoryStore, writer: SpanWriter) -> None:
    with attempt_scope(_ctx(writer)), span("step", config={"a": 1}, tags=["x", 2]) as s:
        s.set_attribute("result", {"rows": [[1, "a"]]})
        s.set_attributes({"tags": "now a string", "empty": [], "maybe": None})
        s.add_event("retrieved", docs=[{"id": 1}], n=1)
    (stored,) = await _spans(store, writer)
    attrs = stored.attributes
    assert attrs["config"] == {"a": 1} and attrs["result"] == {"rows": [[1, "a"]]}
    assert attrs["tags"] == "now a string" and attrs["empty"] == [] and attrs["maybe"] is None
    assert stored.events[0].attributes == {"docs": [{"id": 1}], "n": 1}
