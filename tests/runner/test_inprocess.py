"""In-process agents under a real Runner, store and gateway, with the real `openai` client."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx
import openai
import pytest

import reinforge
from reinforge import semconv
from reinforge.runner import LLM, Runner
from reinforge.types import AttemptQuery, AttemptStatus, RolloutStatus, SpanQuery

from .conftest import GATEWAY_SECRET, REPLIES, Stack, enqueue, until, wait_final


def _expected_ids(stack: Stack, text: str) -> list[int]:
    """What the scripted backend produces for `text`: its tokens then EOS (never re-derived by us)."""
    return [*stack.backend.encode(text), stack.backend.tokenizer.eos_token_id]


async def test_async_openai_agent_calls_are_recorded_with_backend_token_ids(stack: Stack) -> None:
    running = 0
    peak = 0

    @reinforge.agent(name="solver")
    async def solve(task: dict[str, Any], llm: LLM) -> float:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        try:
            client = openai.AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
            first = await client.chat.completions.create(
                model=llm.model, messages=[{"role": "user", "content": task["question"]}]
            )
            with reinforge.span("check", kind="tool"):
                await asyncio.sleep(0.05)  # overlap with the other attempts
            stream = await client.chat.completions.create(
                model=llm.model,
                messages=[
                    {"role": "user", "content": task["question"]},
                    {"role": "assistant", "content": first.choices[0].message.content},
                ],
                stream=True,
            )
            second = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
            await client.close()
            reinforge.emit_reward(0.5, name="checked")
            return 1.0 if "4" in second else 0.0
        finally:
            running -= 1

    rollouts = await enqueue(stack.store, *({"question": f"what is 2 + {i}?"} for i in range(4)))
    runner = Runner(stack.store, solve, stack.gateway_url, GATEWAY_SECRET, concurrency=4)
    stats = await runner.run(max_rollouts=4)

    assert (stats.leased, stats.succeeded, stats.failed) == (4, 4, 0)
    assert peak > 1, "the runner should run attempts concurrently"
    for rollout in await wait_final(stack.store, rollouts):
        assert rollout.status == RolloutStatus.succeeded and rollout.reward == 1.0
        spans = (await stack.store.query_spans(SpanQuery(rollout_id=rollout.rollout_id))).items
        names = sorted(s.name for s in spans)
        # The returned reward is the attempt's outcome (rollout.reward), not written again as a span.
        assert names == sorted([semconv.SPAN_LLM_CALL] * 2 + ["check", semconv.SPAN_REWARD])
        calls = [s for s in spans if s.name == semconv.SPAN_LLM_CALL]
        # Every recorded call carries the backend's own ids; both replies came back in some order.
        got = sorted(tuple(c.attributes[semconv.ATTR_COMPLETION_TOKEN_IDS]) for c in calls)
        assert all(list(g) in [_expected_ids(stack, r) for r in REPLIES] for g in got)
        for call in calls:
            assert call.attributes[semconv.ATTR_AGENT_NAME] == "solver"
            ids = call.attributes[semconv.ATTR_COMPLETION_TOKEN_IDS]
            assert len(call.attributes[semconv.ATTR_COMPLETION_LOGPROBS]) == len(ids)
        # Agent spans join the attempt's trace, the same one the gateway's LLM spans use.
        assert len({s.trace_id for s in spans}) == 1


async def test_sync_agent_in_threads_with_emitted_final_reward(stack: Stack) -> None:
    thread_names: set[str] = set()

    @reinforge.agent
    def solve(task: dict[str, Any], llm: LLM) -> None:
        thread_names.add(threading.current_thread().name)
        client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
        client.completions.create(model=llm.model, prompt=task["prompt"], max_tokens=3)
        client.close()

        # A thread the agent starts itself still belongs to the attempt.
        def grade() -> None:
            reinforge.emit_reward(task["score"], final=True)

        t = threading.Thread(target=grade)
        t.start()
        t.join()

    rollouts = await enqueue(
        stack.store, {"prompt": "hello", "score": 0.25}, {"prompt": "world", "score": 0.75}
    )
    stats = await Runner(stack.store, solve, stack.gateway_url, GATEWAY_SECRET, concurrency=2).run(
        max_rollouts=2
    )
    assert stats.succeeded == 2
    done = await wait_final(stack.store, rollouts)
    assert [r.reward for r in done] == [0.25, 0.75]
    assert all(name.startswith("reinforge-agent") for name in thread_names)
    spans = (await stack.store.query_spans(SpanQuery(rollout_id=rollouts[0].rollout_id))).items
    call = next(s for s in spans if s.name == semconv.SPAN_LLM_CALL)
    assert len(call.attributes[semconv.ATTR_COMPLETION_TOKEN_IDS]) == 3  # max_tokens passed through


async def test_reward_posted_to_the_reward_url_counts(stack: Stack) -> None:
    class Poster(reinforge.Agent):
        async def rollout(self, task: dict[str, Any], llm: LLM) -> None:
            async with httpx.AsyncClient() as http:
                headers = {"Authorization": f"Bearer {llm.api_key}"}
                r = await http.post(llm.reward_url, json={"reward": 0.9}, headers=headers)
                r.raise_for_status()

    rollouts = await enqueue(stack.store, {})
    await Runner(stack.store, Poster, stack.gateway_url, GATEWAY_SECRET).run(max_rollouts=1)
    (done,) = await wait_final(stack.store, rollouts)
    assert done.status == RolloutStatus.succeeded and done.reward == 0.9


async def test_a_long_attempt_s_emitted_final_reward_reaches_the_finish_and_the_latest_report_wins(
    stack: Stack,
) -> None:
    class Reporter(reinforge.Agent):
        async def rollout(self, task: dict[str, Any], llm: LLM) -> float | None:
            async with httpx.AsyncClient() as http:
                headers = {"Authorization": f"Bearer {llm.api_key}"}
                r = await http.post(llm.reward_url, json={"reward": 0.1}, headers=headers)
                r.raise_for_status()
            await asyncio.sleep(1.2)  # past the buffer's hold time: the attempt's spans go live
            reinforge.emit_reward(0.6, final=True)  # the latest report: it wins over the URL's
            return task["returned"]

    rollouts = await enqueue(stack.store, {"returned": None}, {"returned": 0.3})
    runner = Runner(stack.store, Reporter, stack.gateway_url, GATEWAY_SECRET, concurrency=2)
    assert (await runner.run(max_rollouts=2)).succeeded == 2
    reported, returned = await wait_final(stack.store, rollouts)
    assert reported.reward == 0.6  # held for the finish although the attempt ran past the hold time
    assert returned.reward == 0.3  # a returned reward wins over every report
    for rollout in (reported, returned):
        spans = (await stack.store.query_spans(SpanQuery(rollout_id=rollout.rollout_id))).items
        finals = sorted(
            s.attributes[semconv.ATTR_REWARD_VALUE] for s in spans if s.name == semconv.SPAN_FINAL_REWARD
        )
        assert finals == [0.1, 0.6]  # the reports stay in the trace as events


async def test_a_crashing_agent_is_retried_with_its_traceback(stack: Stack) -> None:
    tries: dict[str, int] = {}

    @reinforge.agent
    async def flaky(task: dict[str, Any], llm: LLM) -> float:
        tries[task["id"]] = tries.get(task["id"], 0) + 1
        if tries[task["id"]] == 1:
            raise RuntimeError(f"tool crashed on {task['id']}")
        return 1.0

    rollouts = await enqueue(stack.store, {"id": "a"}, {"id": "b"})
    stats = await Runner(stack.store, flaky, stack.gateway_url, GATEWAY_SECRET, concurrency=2).run(
        max_rollouts=4
    )
    assert (stats.succeeded, stats.failed) == (2, 2)
    for rollout in await wait_final(stack.store, rollouts):
        assert rollout.status == RolloutStatus.succeeded and rollout.attempt_count == 2
        attempts = (await stack.store.query_attempts(AttemptQuery(rollout_id=rollout.rollout_id))).items
        assert [a.status for a in attempts] == [AttemptStatus.failed, AttemptStatus.succeeded]
        assert attempts[0].error is not None
        assert "Traceback" in attempts[0].error and "RuntimeError: tool crashed on" in attempts[0].error


async def test_bad_return_value_fails_without_retry(stack: Stack) -> None:
    @reinforge.agent
    def wrong(task: dict[str, Any], llm: LLM) -> Any:
        return "great"

    rollouts = await enqueue(stack.store, {})
    await Runner(stack.store, wrong, stack.gateway_url, GATEWAY_SECRET).run(max_rollouts=1)
    (done,) = await wait_final(stack.store, rollouts)
    assert done.status == RolloutStatus.failed and done.attempt_count == 1
    assert done.error is not None and "returned 'great'" in done.error


async def test_timeout_fails_the_attempt_and_records_the_signal(stack: Stack) -> None:
    cancelled = asyncio.Event()

    @reinforge.agent(timeout_s=0.3)
    async def slow(task: dict[str, Any], llm: LLM) -> float:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return 1.0

    rollouts = await enqueue(stack.store, {})
    started = time.monotonic()
    stats = await Runner(stack.store, slow, stack.gateway_url, GATEWAY_SECRET).run(max_rollouts=1)
    assert time.monotonic() - started < 10
    assert stats.timed_out == 1 and cancelled.is_set()
    (done,) = await wait_final(stack.store, rollouts)
    assert done.status == RolloutStatus.failed and done.attempt_count == 1  # timeouts are not retried
    assert done.error is not None and "timed out" in done.error
    spans = (await stack.store.query_spans(SpanQuery(rollout_id=done.rollout_id))).items
    assert [s.attributes[semconv.ATTR_AIR_SIGNAL] for s in spans] == [semconv.AIR_TIMEOUT]


async def test_cancelling_a_rollout_stops_its_agent(stack: Stack) -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    @reinforge.agent
    async def long(task: dict[str, Any], llm: LLM) -> float:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return 1.0

    rollouts = await enqueue(stack.store, {})
    runner = Runner(stack.store, long, stack.gateway_url, GATEWAY_SECRET, heartbeat_seconds=0.05)
    run = asyncio.create_task(runner.run(max_rollouts=1))
    await asyncio.wait_for(started.wait(), 10)
    await stack.store.cancel_rollouts([rollouts[0].rollout_id])
    stats = await asyncio.wait_for(run, 10)
    assert cancelled.is_set() and stats.stopped == 1
    assert (await stack.store.get_rollout(rollouts[0].rollout_id)).status == RolloutStatus.cancelled


async def test_stop_event_stops_leasing_and_lets_running_attempts_finish(stack: Stack) -> None:
    release = asyncio.Event()
    started = asyncio.Event()

    @reinforge.agent
    async def gated(task: dict[str, Any], llm: LLM) -> float:
        started.set()
        await release.wait()
        return 1.0

    rollouts = await enqueue(stack.store, {"n": 1}, {"n": 2})
    stop = asyncio.Event()
    runner = Runner(stack.store, gated, stack.gateway_url, GATEWAY_SECRET, concurrency=1, poll_seconds=30)
    run = asyncio.create_task(runner.run(stop=stop))
    await asyncio.wait_for(started.wait(), 10)
    stop.set()
    release.set()
    stats = await asyncio.wait_for(run, 10)
    assert (stats.leased, stats.succeeded) == (1, 1)
    first, second = [await stack.store.get_rollout(r.rollout_id) for r in rollouts]
    assert first.status == RolloutStatus.succeeded and second.status == RolloutStatus.queued

    # An idle runner blocked in a long poll stops promptly too.
    idle_stop = asyncio.Event()
    idle = asyncio.create_task(
        Runner(stack.store, gated, stack.gateway_url, GATEWAY_SECRET, poll_seconds=30, mode=None).run(
            stop=idle_stop, max_rollouts=2
        )
    )
    await until(lambda: _is_final(stack, rollouts[1].rollout_id))
    t0 = time.monotonic()
    idle_stop.set()
    await asyncio.wait_for(idle, 5)
    assert time.monotonic() - t0 < 5  # well under the 30 s long poll


async def _is_final(stack: Stack, rollout_id: str) -> bool:
    return (await stack.store.get_rollout(rollout_id)).status.is_final


async def test_agents_see_the_resources_version_they_run_with(stack: Stack) -> None:
    seen: list[tuple[str, int | None, str]] = []

    @reinforge.agent
    def record(task: dict[str, Any], llm: LLM) -> float:
        seen.append((llm.model, llm.resources_version, llm.resources["prompt"].format(**task)))
        return 0.0

    await stack.store.put_resources({"llm": {"model": "policy-v0"}, "prompt": "Q0: {q}"})
    await stack.store.put_resources({"model": "policy-v1", "prompt": "Q1: {q}"})
    pinned = await enqueue(stack.store, {"q": "a"}, resources_version=0)
    latest = await enqueue(stack.store, {"q": "b"})
    runner = Runner(stack.store, record, stack.gateway_url, GATEWAY_SECRET)
    await runner.run(max_rollouts=2)
    await wait_final(stack.store, pinned + latest)
    assert seen == [("policy-v0", 0, "Q0: a"), ("policy-v1", 1, "Q1: b")]

    # "Put resources, then enqueue": the same runner (and its cache) shows the new version at once.
    await stack.store.put_resources({"model": "policy-v2", "prompt": "Q2: {q}"})
    newer = await enqueue(stack.store, {"q": "c"})
    await runner.run(max_rollouts=1)
    await wait_final(stack.store, newer)
    assert seen[-1] == ("policy-v2", 2, "Q2: c")


async def test_a_lease_batch_reads_its_resources_version_once(stack: Stack, monkeypatch: Any) -> None:
    await stack.store.put_resources({"model": "policy-v0"})
    reads: list[int | None] = []
    real = stack.store.get_resources

    async def slow_read(version: int | None = None) -> Any:
        reads.append(version)
        await asyncio.sleep(0.02)  # every attempt of the batch asks while the first read is out
        return await real(version)

    monkeypatch.setattr(stack.store, "get_resources", slow_read)
    seen: list[int | None] = []

    @reinforge.agent
    def record(task: dict[str, Any], llm: LLM) -> float:
        seen.append(llm.resources_version)
        return 1.0

    rollouts = await enqueue(stack.store, *({"q": i} for i in range(8)), resources_version=0)
    await Runner(stack.store, record, stack.gateway_url, GATEWAY_SECRET, concurrency=8).run(max_rollouts=8)
    assert [r.status for r in await wait_final(stack.store, rollouts)] == [RolloutStatus.succeeded] * 8
    assert seen == [0] * 8 and reads == [0]


async def test_drain_timeout_gives_running_attempts_back_for_a_retry(stack: Stack) -> None:
    started = asyncio.Event()

    @reinforge.agent
    async def stuck(task: dict[str, Any], llm: LLM) -> float:
        started.set()
        await asyncio.sleep(60)
        return 1.0

    rollouts = await enqueue(stack.store, {})
    stop = asyncio.Event()
    runner = Runner(stack.store, stuck, stack.gateway_url, GATEWAY_SECRET, drain_timeout_s=0.2)
    run = asyncio.create_task(runner.run(stop=stop))
    await asyncio.wait_for(started.wait(), 10)
    stop.set()
    stats = await asyncio.wait_for(run, 10)
    assert stats.failed == 1 and stats.errors == ["the runner stopped"]
    rollout = await stack.store.get_rollout(rollouts[0].rollout_id)
    assert rollout.status == RolloutStatus.queued and rollout.attempt_count == 1
    (attempt,) = (await stack.store.query_attempts(AttemptQuery(rollout_id=rollout.rollout_id))).items
    assert attempt.status == AttemptStatus.failed and attempt.error == "the runner stopped"


async def test_runner_over_http_store_and_bad_configuration(stack: Stack, http_store: Any) -> None:
    @reinforge.agent
    async def quick(task: dict[str, Any], llm: LLM) -> float:
        return float(task["v"])

    rollouts = await enqueue(http_store, *({"v": i} for i in range(6)))
    stats = await Runner(http_store, quick, stack.gateway_url, GATEWAY_SECRET, concurrency=3).run(
        max_rollouts=6
    )
    assert stats.succeeded == 6
    assert [r.reward for r in await wait_final(http_store, rollouts)] == [float(i) for i in range(6)]

    with pytest.raises(reinforge.InvalidRequestError, match="concurrency"):
        Runner(http_store, quick, stack.gateway_url, GATEWAY_SECRET, concurrency=0)
    with pytest.raises(reinforge.InvalidRequestError, match="secret"):
        Runner(http_store, quick, stack.gateway_url, "")
    with pytest.raises(reinforge.InvalidRequestError, match="not an agent"):
        Runner(http_store, 42, stack.gateway_url, GATEWAY_SECRET)  # type: ignore[arg-type]


async def test_a_wrong_gateway_secret_fails_the_flush_and_the_attempt_is_retried(stack: Stack) -> None:
    @reinforge.agent
    async def quiet(task: dict[str, Any], llm: LLM) -> float:
        return 1.0

    rollouts = await enqueue(stack.store, {}, max_attempts=1)
    await Runner(stack.store, quiet, stack.gateway_url, "not-the-secret").run(max_rollouts=1)
    (done,) = await wait_final(stack.store, rollouts)
    assert done.status == RolloutStatus.failed
    assert done.error is not None and "flush" in done.error and "401" in done.error


async def test_heartbeats_keep_a_long_attempt_s_lease(stack: Stack) -> None:
    @reinforge.agent
    async def slow(task: dict[str, Any], llm: LLM) -> float:
        await asyncio.sleep(2.0)  # twice the lease
        return 1.0

    rollouts = await enqueue(stack.store, {})
    runner = Runner(
        stack.store, slow, stack.gateway_url, GATEWAY_SECRET, lease_seconds=1.0, heartbeat_seconds=0.1
    )
    stats = await runner.run(max_rollouts=1)
    assert (stats.succeeded, stats.stopped) == (1, 0)
    (done,) = await wait_final(stack.store, rollouts)
    assert done.status == RolloutStatus.succeeded and done.attempt_count == 1


async def test_a_long_attempt_s_spans_go_live_and_are_all_stored_before_the_finish(stack: Stack) -> None:
    seen_live: list[str] = []

    @reinforge.agent
    async def slow(task: dict[str, Any], llm: LLM) -> float:
        with reinforge.span("early", kind="tool"):
            pass
        await asyncio.sleep(1.2)  # past the buffer's hold time: spans from here go to the writer
        with reinforge.span("late", kind="tool"):
            pass
        while not seen_live:  # the spans so far are in the store while the attempt still runs
            await asyncio.sleep(0.02)
        return 1.0

    async def watch(rollout_id: str) -> None:
        while not seen_live:
            page = await stack.store.query_spans(SpanQuery(rollout_id=rollout_id))
            seen_live.extend(s.name for s in page.items)
            await asyncio.sleep(0.05)

    rollouts = await enqueue(stack.store, {})
    run = asyncio.create_task(
        Runner(stack.store, slow, stack.gateway_url, GATEWAY_SECRET).run(max_rollouts=1)
    )
    await asyncio.wait_for(watch(rollouts[0].rollout_id), 10.0)
    assert set(seen_live) <= {"early", "late"}  # visible while the attempt still runs
    stats = await run
    assert stats.succeeded == 1
    (done,) = await wait_final(stack.store, rollouts)
    assert done.status == RolloutStatus.succeeded and done.reward == 1.0
    spans = (await stack.store.query_spans(SpanQuery(rollout_id=done.rollout_id))).items
    assert sorted(s.name for s in spans) == ["early", "late"]


async def test_on_lease_sees_each_leased_attempt_before_its_agent_runs(stack: Stack) -> None:
    reported: list[str] = []
    seen_first: list[bool] = []

    @reinforge.agent
    async def solve(task: dict[str, Any], llm: LLM) -> float:
        seen_first.append(any(llm.reward_url.endswith(f"/r/{a}/reward") for a in reported))
        return 1.0

    rollouts = await enqueue(stack.store, *({"question": f"q{i}"} for i in range(5)))
    runner = Runner(
        stack.store,
        solve,
        stack.gateway_url,
        GATEWAY_SECRET,
        concurrency=5,
        on_lease=lambda leased: reported.extend(lr.attempt.attempt_id for lr in leased),
    )
    stats = await runner.run(max_rollouts=5)
    assert stats.succeeded == 5 and seen_first == [True] * 5
    attempts = (await stack.store.query_attempts(AttemptQuery(limit=10))).items
    assert sorted(reported) == sorted(a.attempt_id for a in attempts)
    assert all(r.status == RolloutStatus.succeeded for r in await wait_final(stack.store, rollouts))
