"""Each misbehaving in-process agent gets a clear recorded error and harms no rollout beside it."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from reinforge import semconv
from reinforge.runner import Runner
from reinforge.types import AttemptQuery, Rollout, RolloutSpec, RolloutStatus, Span, SpanQuery, SpanStatusCode

from .agents import LATE_CALLERS, STREAMS_DROPPED, misbehaving
from .conftest import GATEWAY_SECRET, GOOD_ROLLOUTS, Stack, enqueue, final, open_fds, serve_stack, until_idle


async def _run_rollouts(stack: Stack, runner: Runner, count: int) -> list[Rollout]:
    """Enqueue `count` one-try rollouts of an empty task and run them to their end."""
    rollouts = await stack.store.enqueue_rollouts([RolloutSpec(max_attempts=1) for _ in range(count)])
    await runner.run(max_rollouts=count)
    return await final(stack.store, rollouts)


async def _run(stack: Stack, bad_task: dict[str, Any], **runner_options: Any) -> tuple[Any, Any]:
    """Run the bad rollout beside the good ones; every good one must succeed. Returns the bad
    rollout and its attempt as the store recorded them."""
    bad, good = await enqueue(stack.store, bad_task)
    options = {"timeout_s": 60.0, **runner_options}  # generous: a loaded CI machine is slow
    runner = Runner(
        stack.store, misbehaving, stack.gateway_url, GATEWAY_SECRET, concurrency=1 + GOOD_ROLLOUTS, **options
    )
    await runner.run(max_rollouts=1 + GOOD_ROLLOUTS)
    bad_done, *good_done = await final(stack.store, [bad, *good])
    assert [(r.status, r.reward) for r in good_done] == [(RolloutStatus.succeeded, 1.0)] * GOOD_ROLLOUTS
    attempts = (await stack.store.query_attempts(AttemptQuery(rollout_id=bad.rollout_id))).items
    assert len(attempts) == 1  # no retry: the store's attempt holds the error
    await until_idle(stack.gateway)
    return bad_done, attempts[0]


@pytest.mark.parametrize(
    ("kind", "error"),
    [
        ("nan", "a reward must be finite, got nan"),
        ("inf", "a reward must be finite, got -inf"),
        ("string", "a reward must be a number, got str: '1.0'"),
    ],
)
async def test_bad_reward_is_a_clear_failure(tokenizer: Any, kind: str, error: str) -> None:
    with serve_stack(tokenizer) as stack:
        rollout, attempt = await _run(stack, {"kind": kind})
    assert rollout.status is RolloutStatus.failed and rollout.reward is None
    assert error in (attempt.error or ""), attempt.error


async def test_agent_that_never_returns_times_out(tokenizer: Any) -> None:
    with serve_stack(tokenizer) as stack:
        rollout, attempt = await _run(stack, {"kind": "never_returns"}, timeout_s=3.0)
    assert rollout.status is RolloutStatus.failed
    assert attempt.error == "timed out: the agent did not finish within 3.0s"


async def test_flood_of_llm_calls_is_cut_off_and_recorded(tokenizer: Any) -> None:
    with serve_stack(tokenizer, max_calls_per_attempt=20) as stack:
        rollout, attempt = await _run(stack, {"kind": "flood_calls", "calls": 1000})
        spans = await stack.store.query_spans(SpanQuery(attempt_id=attempt.attempt_id, limit=1000))
    assert rollout.status is RolloutStatus.failed and rollout.reward is None
    assert "after its 20 LLM calls and reward reports" in (attempt.error or ""), attempt.error
    assert "1 more were refused" in (attempt.error or "")
    assert sum(s.name == semconv.SPAN_LLM_CALL for s in spans.items) == 20


async def test_flood_of_spans_is_capped_and_recorded(tokenizer: Any) -> None:
    with serve_stack(tokenizer) as stack:
        rollout, attempt = await _run(stack, {"kind": "flood_spans", "spans": 500}, max_spans_per_attempt=100)
        spans = await stack.store.query_spans(SpanQuery(attempt_id=attempt.attempt_id, limit=1000))
    assert rollout.status is RolloutStatus.failed
    # 500 tool steps: 100 kept, 400 dropped (the returned reward is the outcome's, not a span).
    assert attempt.error == (
        "the agent recorded more than 100 spans in one attempt (Runner's max_spans_per_attempt); "
        "400 were dropped"
    )
    assert len([s for s in spans.items if s.name.startswith("step ")]) == 100


async def test_hundred_megabyte_body_is_refused(tokenizer: Any) -> None:
    with serve_stack(tokenizer) as stack:
        rollout, attempt = await _run(stack, {"kind": "huge_body"})
        spans = await stack.store.query_spans(SpanQuery(attempt_id=attempt.attempt_id))
    assert rollout.status is RolloutStatus.failed
    assert "request body of 104857" in (attempt.error or "") and "16777216-byte limit" in (
        attempt.error or ""
    )
    assert spans.items == []


async def test_call_after_the_attempt_ended_is_refused_and_not_recorded(tokenizer: Any) -> None:
    with serve_stack(tokenizer) as stack:
        rollout, attempt = await _run(stack, {"kind": "late_call", "key": "late"})
        assert rollout.status is RolloutStatus.succeeded  # the agent itself behaved until now
        before = await stack.store.query_spans(SpanQuery(attempt_id=attempt.attempt_id))
        llm = LATE_CALLERS.pop("late")
        body = {"model": llm.model, "messages": [{"role": "user", "content": "hello"}]}
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {llm.api_key}"}) as client:
            late = await client.post(llm.base_url + "/chat/completions", json=body)
            reward = await client.post(llm.reward_url, json={"reward": 5.0})
        spans = await stack.store.query_spans(SpanQuery(attempt_id=attempt.attempt_id))
        after = await stack.store.get_rollout(rollout.rollout_id)
    assert late.status_code == 409 and reward.status_code == 409
    assert "is succeeded, not running" in late.json()["error"]["message"]
    assert before.items == [] and rollout.reward == 1.0  # the returned reward is the outcome's
    assert spans.items == before.items and after.reward == 1.0


async def test_thousands_of_dropped_streams_leave_nothing_behind(tokenizer: Any) -> None:
    # Each generation takes a while, so every stream is still generating when its client hangs up.
    with serve_stack(tokenizer, generation_s=0.5) as stack:
        before = httpx.get(stack.gateway_url + "/health").json()
        fds_before = open_fds()
        started = time.monotonic()
        rollout, attempt = await _run(stack, {"kind": "drop_streams"})
        took = time.monotonic() - started
        assert rollout.status is RolloutStatus.succeeded
        assert stack.gateway.in_flight == 0 and stack.gateway.open_streams == 0 and not stack.gateway.paused
        await stack.gateway.flush()
        spans = await _all_spans(stack, attempt.attempt_id)
        after = httpx.get(stack.gateway_url + "/health").json()
        fds_after = open_fds()
    calls = [s for s in spans if s.name == semconv.SPAN_LLM_CALL]
    cancelled = [s for s in calls if s.status.code is SpanStatusCode.error]
    # Every dropped call is in the record: answered in full before the hang-up was seen, or cancelled.
    assert len(calls) == STREAMS_DROPPED
    assert len(cancelled) > STREAMS_DROPPED // 2, len(cancelled)
    assert all(
        (s.status.message or "").startswith("cancelled: the client closed the stream") for s in cancelled
    )
    assert all(semconv.ATTR_COMPLETION_TOKEN_IDS not in s.attributes for s in cancelled)  # never trained on
    assert after["cancelled_calls"] - before["cancelled_calls"] == len(cancelled)
    # Nothing of the streams is left: no call in flight, no stream open, no task, no socket.
    assert (after["in_flight"], after["open_streams"]) == (0, 0)
    assert after["tasks"] <= before["tasks"] + 5, (before["tasks"], after["tasks"])
    assert fds_after <= fds_before + 10, (fds_before, fds_after)
    print(f"RESULT dropped_streams={STREAMS_DROPPED} cancelled={len(cancelled)} seconds={took:.1f}")


async def _all_spans(stack: Stack, attempt_id: str) -> list[Span]:
    spans: list[Span] = []
    while True:
        page = await stack.store.query_spans(SpanQuery(attempt_id=attempt_id, limit=1000, offset=len(spans)))
        spans += page.items
        if len(page.items) < 1000:
            return spans
