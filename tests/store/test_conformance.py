"""One conformance suite for the store protocol; the `store` fixture runs it on every backend."""

from __future__ import annotations

import asyncio
import time

import pytest
from pydantic import ValidationError

from reinforge.errors import ConflictError, InvalidRequestError, NotFoundError, StaleAttemptError
from reinforge.store import Store
from reinforge.types import (
    MAX_PAGE_SIZE,
    MAX_STORED_INT,
    AttemptOutcome,
    AttemptQuery,
    AttemptStatus,
    RolloutMode,
    RolloutQuery,
    RolloutSpec,
    RolloutStatus,
    Span,
    SpanQuery,
    SpanStatus,
    SpanStatusCode,
)

from .chaos import run_chaos
from .conftest import WAKE_LIMIT

SHORT_LEASE = 0.3

SUCCEEDED = AttemptStatus.succeeded
FAILED = AttemptStatus.failed


def ok(reward: float | None = None) -> AttemptOutcome:
    return AttemptOutcome(status=SUCCEEDED, reward=reward)


def failed(error: str = "boom", retryable: bool = True) -> AttemptOutcome:
    return AttemptOutcome(status=FAILED, error=error, retryable=retryable)


async def enqueue(store: Store, n: int, **kw: object) -> list[str]:
    rollouts = await store.enqueue_rollouts([RolloutSpec(task={"i": i}, **kw) for i in range(n)])  # type: ignore[arg-type]
    return [r.rollout_id for r in rollouts]


def span(rollout_id: str, attempt_id: str, name: str = "step", **attrs: object) -> Span:
    return Span(rollout_id=rollout_id, attempt_id=attempt_id, name=name, attributes=dict(attrs))


# -- enqueue ---------------------------------------------------------------------------------------


async def test_enqueue_returns_rollouts_in_order_with_their_fields(store: Store) -> None:
    specs = [
        RolloutSpec(
            task={"q": "1+1", "a": 2}, task_id="t1", group_id="g", resources_version=3, max_attempts=2
        ),
        RolloutSpec(task={"q": "2+2"}, mode=RolloutMode.val, metadata={"k": [1, 2]}),
    ]
    r1, r2 = await store.enqueue_rollouts(specs)
    assert (r1.task, r1.task_id, r1.group_id, r1.resources_version, r1.max_attempts) == (
        {"q": "1+1", "a": 2},
        "t1",
        "g",
        3,
        2,
    )
    assert r1.status is RolloutStatus.queued and r1.attempt_count == 0 and r1.reward is None
    assert r2.mode is RolloutMode.val and r2.metadata == {"k": [1, 2]}
    assert r1.rollout_id != r2.rollout_id
    assert await store.get_rollout(r1.rollout_id) == r1
    assert await store.enqueue_rollouts([]) == []


async def test_enqueue_is_idempotent_for_given_ids(store: Store) -> None:
    first = await store.enqueue_rollouts([RolloutSpec(rollout_id="r-1", task={"x": 1})])
    again = await store.enqueue_rollouts(
        [RolloutSpec(rollout_id="r-1", task={"x": "changed"}), RolloutSpec(rollout_id="r-2", task={"x": 2})]
    )
    assert again[0] == first[0] and again[0].task == {"x": 1}
    assert again[1].rollout_id == "r-2"
    # The same id twice in one batch is one rollout.
    dup = await store.enqueue_rollouts([RolloutSpec(rollout_id="r-3"), RolloutSpec(rollout_id="r-3")])
    assert dup[0] == dup[1]
    page = await store.query_rollouts(RolloutQuery())
    assert [r.rollout_id for r in page.items] == ["r-1", "r-2", "r-3"]


async def test_enqueue_rejects_values_json_cannot_hold(store: Store) -> None:
    with pytest.raises(InvalidRequestError):
        await store.enqueue_rollouts([RolloutSpec(task={"x": object()})])
    assert (await store.query_rollouts(RolloutQuery())).total == 0


# -- lease -----------------------------------------------------------------------------------------


async def test_lease_takes_oldest_first_up_to_max(store: Store) -> None:
    ids = await enqueue(store, 5)
    leased = await store.lease_rollouts("runner-a", max_rollouts=3, lease_seconds=30)
    assert [lr.rollout.rollout_id for lr in leased] == ids[:3]
    for lr in leased:
        assert lr.rollout.status is RolloutStatus.running and lr.rollout.attempt_count == 1
        a = lr.attempt
        assert (a.attempt_no, a.runner_id, a.status, a.rollout_id) == (
            1,
            "runner-a",
            AttemptStatus.running,
            lr.rollout.rollout_id,
        )
        assert 29 < a.lease_deadline - time.time() <= 30
        assert await store.get_attempt(a.attempt_id) == a
        assert (await store.get_rollout(a.rollout_id)).status is RolloutStatus.running
    rest = await store.lease_rollouts("runner-b", max_rollouts=10)
    assert [lr.rollout.rollout_id for lr in rest] == ids[3:]
    assert await store.lease_rollouts("runner-b") == []


async def test_lease_filters_by_mode(store: Store) -> None:
    train = await enqueue(store, 2)
    val = await enqueue(store, 2, mode=RolloutMode.val)
    got = await store.lease_rollouts("r", max_rollouts=10, mode=RolloutMode.val)
    assert [lr.rollout.rollout_id for lr in got] == val
    got = await store.lease_rollouts("r", max_rollouts=10, mode="val")  # type: ignore[arg-type]
    assert got == []
    with pytest.raises(InvalidRequestError):
        await store.lease_rollouts("r", mode="test")  # type: ignore[arg-type]
    got = await store.lease_rollouts("r", max_rollouts=10)
    assert [lr.rollout.rollout_id for lr in got] == train


async def test_lease_rejects_bad_arguments(store: Store) -> None:
    for kwargs in ({"max_rollouts": 0}, {"lease_seconds": 0}, {"wait_seconds": -1}, {"lease_seconds": -5}):
        with pytest.raises(InvalidRequestError):
            await store.lease_rollouts("r", **kwargs)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError):
        await store.lease_rollouts("")


async def test_long_poll_lease_wakes_on_enqueue(store: Store) -> None:
    waiter = asyncio.create_task(store.lease_rollouts("r", wait_seconds=10))
    await asyncio.sleep(0.2)
    assert not waiter.done()
    start = time.monotonic()
    (rid,) = await enqueue(store, 1)
    leased = await asyncio.wait_for(waiter, 5)
    assert time.monotonic() - start < WAKE_LIMIT  # woken by the enqueue, not by a timer
    assert [lr.rollout.rollout_id for lr in leased] == [rid]


async def test_long_poll_lease_returns_empty_after_its_wait(store: Store) -> None:
    start = time.monotonic()
    assert await store.lease_rollouts("r", wait_seconds=0.3) == []
    assert 0.25 < time.monotonic() - start < 2.0


async def test_concurrent_leases_never_share_a_rollout(store: Store) -> None:
    ids = await enqueue(store, 60)

    async def worker(n: int) -> list[str]:
        got: list[str] = []
        while batch := await store.lease_rollouts(f"w{n}", max_rollouts=3):
            got += [lr.rollout.rollout_id for lr in batch]
        return got

    results = await asyncio.gather(*(worker(n) for n in range(8)))
    leased = [rid for got in results for rid in got]
    assert sorted(leased) == sorted(ids)


# -- heartbeat, expiry, retries and the late-finish rule ---------------------------------------------


async def test_heartbeat_extends_the_lease(store: Store) -> None:
    await enqueue(store, 1)
    (lr,) = await store.lease_rollouts("r", lease_seconds=SHORT_LEASE)
    for _ in range(3):
        await asyncio.sleep(SHORT_LEASE / 2)
        beat = await store.heartbeat(lr.attempt.attempt_id, lease_seconds=SHORT_LEASE)
        assert beat.status is AttemptStatus.running and beat.lease_deadline > lr.attempt.lease_deadline
        assert beat.last_heartbeat > lr.attempt.last_heartbeat
    # Well past the first deadline, the heartbeats kept it alive.
    rollout = await store.finish_attempt(lr.attempt.attempt_id, ok(1.0))
    assert rollout.status is RolloutStatus.succeeded and rollout.attempt_count == 1
    with pytest.raises(NotFoundError):
        await store.heartbeat("no-such-attempt")
    with pytest.raises(StaleAttemptError):
        await store.heartbeat(lr.attempt.attempt_id)
    with pytest.raises(InvalidRequestError):
        await store.heartbeat(lr.attempt.attempt_id, lease_seconds=0)


async def test_expired_lease_times_out_and_a_new_attempt_follows(store: Store) -> None:
    (rid,) = await enqueue(store, 1)
    (first,) = await store.lease_rollouts("dead-runner", lease_seconds=SHORT_LEASE)
    await asyncio.sleep(SHORT_LEASE + 0.15)
    rollout = await store.get_rollout(rid)
    assert rollout.status is RolloutStatus.queued and rollout.attempt_count == 1
    old = await store.get_attempt(first.attempt.attempt_id)
    assert (
        old.status is AttemptStatus.timeout
        and old.finished_at is not None
        and "timed out" in (old.error or "")
    )

    (second,) = await store.lease_rollouts("live-runner", lease_seconds=30)
    assert second.rollout.rollout_id == rid and second.attempt.attempt_no == 2

    # The late-finish rule: the superseded attempt's report is rejected and nothing is counted.
    with pytest.raises(StaleAttemptError):
        await store.finish_attempt(first.attempt.attempt_id, ok(1.0))
    with pytest.raises(StaleAttemptError):
        await store.heartbeat(first.attempt.attempt_id)
    rollout = await store.get_rollout(rid)
    assert rollout.status is RolloutStatus.running and rollout.reward is None and rollout.attempt_count == 2
    assert (await store.get_attempt(first.attempt.attempt_id)).reward is None

    done = await store.finish_attempt(second.attempt.attempt_id, ok(0.5))
    assert done.status is RolloutStatus.succeeded and done.reward == 0.5
    attempts = await store.query_attempts(AttemptQuery(rollout_id=rid))
    assert [(a.attempt_no, a.status) for a in attempts.items] == [
        (1, AttemptStatus.timeout),
        (2, AttemptStatus.succeeded),
    ]


async def test_finish_after_the_deadline_is_stale_even_before_anyone_else_leases(store: Store) -> None:
    (rid,) = await enqueue(store, 1, max_attempts=1)
    (lr,) = await store.lease_rollouts("r", lease_seconds=SHORT_LEASE)
    await asyncio.sleep(SHORT_LEASE + 0.15)
    with pytest.raises(StaleAttemptError):
        await store.finish_attempt(lr.attempt.attempt_id, ok(1.0))
    rollout = await store.get_rollout(rid)
    assert (
        rollout.status is RolloutStatus.failed and rollout.reward is None and rollout.finished_at is not None
    )


async def test_failed_attempts_retry_until_max_attempts(store: Store) -> None:
    (rid,) = await enqueue(store, 1, max_attempts=3)
    for attempt_no in (1, 2):
        (lr,) = await store.lease_rollouts("r")
        assert lr.attempt.attempt_no == attempt_no
        rollout = await store.finish_attempt(lr.attempt.attempt_id, failed(f"err{attempt_no}"))
        assert rollout.status is RolloutStatus.queued and rollout.finished_at is None
    (lr,) = await store.lease_rollouts("r")
    assert lr.attempt.attempt_no == 3
    rollout = await store.finish_attempt(lr.attempt.attempt_id, failed("err3"))
    assert (
        rollout.status is RolloutStatus.failed and rollout.error == "err3" and rollout.finished_at is not None
    )
    assert await store.lease_rollouts("r") == []
    with pytest.raises(StaleAttemptError):
        await store.finish_attempt(lr.attempt.attempt_id, ok())
    statuses = [a.status for a in (await store.query_attempts(AttemptQuery(rollout_id=rid))).items]
    assert statuses == [AttemptStatus.failed] * 3


async def test_non_retryable_failure_ends_the_rollout_at_once(store: Store) -> None:
    await enqueue(store, 1, max_attempts=5)
    (lr,) = await store.lease_rollouts("r")
    rollout = await store.finish_attempt(lr.attempt.attempt_id, failed("bad task", retryable=False))
    assert rollout.status is RolloutStatus.failed and rollout.attempt_count == 1


async def test_expiry_at_the_last_attempt_fails_the_rollout(store: Store) -> None:
    (rid,) = await enqueue(store, 1, max_attempts=1)
    await store.lease_rollouts("r", lease_seconds=SHORT_LEASE)
    start = time.monotonic()
    # One event-driven wait: it must wake at the lease deadline, not at its own timeout.
    (rollout,) = await store.wait_for_rollouts([rid], timeout_seconds=10)
    assert time.monotonic() - start < 2.0
    assert rollout.status is RolloutStatus.failed and "timed out" in (rollout.error or "")


async def test_success_records_reward_and_a_second_finish_is_stale(store: Store) -> None:
    await enqueue(store, 1)
    (lr,) = await store.lease_rollouts("r")
    rollout = await store.finish_attempt(lr.attempt.attempt_id, ok(0.75))
    assert (rollout.status, rollout.reward, rollout.error) == (RolloutStatus.succeeded, 0.75, None)
    attempt = await store.get_attempt(lr.attempt.attempt_id)
    assert attempt.status is AttemptStatus.succeeded and attempt.reward == 0.75 and attempt.finished_at
    with pytest.raises(StaleAttemptError):
        await store.finish_attempt(lr.attempt.attempt_id, failed())
    assert (await store.get_rollout(lr.rollout.rollout_id)).status is RolloutStatus.succeeded
    with pytest.raises(NotFoundError):
        await store.finish_attempt("nope", ok())
    with pytest.raises(InvalidRequestError):
        await store.finish_attempt(lr.attempt.attempt_id, ok(float("nan")))


async def test_cancel(store: Store) -> None:
    queued, running, done = await enqueue(store, 3)
    leased = await store.lease_rollouts("r", max_rollouts=2)
    assert [lr.rollout.rollout_id for lr in leased] == [queued, running]
    await store.finish_attempt(leased[0].attempt.attempt_id, ok(1.0))
    # `queued` is now the finished one; re-label for clarity.
    finished, running_lr = queued, leased[1]
    with pytest.raises(NotFoundError):
        await store.cancel_rollouts([running, "missing"])
    assert (await store.get_rollout(running)).status is RolloutStatus.running  # nothing changed

    out = await store.cancel_rollouts([done, running, finished])
    assert [r.rollout_id for r in out] == [done, running, finished]
    assert [r.status for r in out] == [
        RolloutStatus.cancelled,
        RolloutStatus.cancelled,
        RolloutStatus.succeeded,
    ]
    assert (await store.get_attempt(running_lr.attempt.attempt_id)).status is AttemptStatus.cancelled
    with pytest.raises(StaleAttemptError):
        await store.finish_attempt(running_lr.attempt.attempt_id, ok(1.0))
    assert await store.lease_rollouts("r", max_rollouts=10) == []
    assert (await store.get_rollout(done)).finished_at is not None


async def test_cancelled_outcome_cancels_the_rollout(store: Store) -> None:
    await enqueue(store, 1)
    (lr,) = await store.lease_rollouts("r")
    rollout = await store.finish_attempt(
        lr.attempt.attempt_id, AttemptOutcome(status=AttemptStatus.cancelled)
    )
    assert rollout.status is RolloutStatus.cancelled


# -- spans -----------------------------------------------------------------------------------------


async def test_spans_are_batched_idempotent_and_ordered_by_arrival(store: Store) -> None:
    a = [span("r1", "a1", "llm", tokens=[1, 2, 3], nested={"x": [{"y": "é"}]}) for _ in range(3)]
    assert await store.add_spans(a) == 3
    assert await store.add_spans(a) == 0
    b = [span("r1", "a2", "tool"), a[0], span("r2", "a3", "llm")]
    assert await store.add_spans([*b, b[0]]) == 2
    assert await store.add_spans([]) == 0

    page = await store.query_spans(SpanQuery())
    assert page.total == 5 and page.next_offset is None
    assert [s.span_id for s in page.items] == [s.span_id for s in a] + [b[0].span_id, b[2].span_id]
    seqs = [s.sequence for s in page.items]
    assert all(isinstance(x, int) for x in seqs) and seqs == sorted(seqs) and len(set(seqs)) == 5
    got = page.items[0]
    assert got.attributes == {"tokens": [1, 2, 3], "nested": {"x": [{"y": "é"}]}}
    assert got.model_dump(exclude={"sequence"}) == a[0].model_dump(exclude={"sequence"})


async def test_span_round_trip_keeps_every_field(store: Store) -> None:
    s = Span(
        rollout_id="r",
        attempt_id="a",
        name="reinforge.llm_call",
        parent_id="0123456789abcdef",
        start_time=1.5,
        end_time=2.25,
        attributes={"f": 0.1, "b": True, "n": None, "big": list(range(2000))},
        status=SpanStatus(code=SpanStatusCode.error, message="tool failed"),
        events=[{"name": "exception", "timestamp": 2.0, "attributes": {"type": "ValueError"}}],  # type: ignore[list-item]
    )
    await store.add_spans([s])
    (got,) = (await store.query_spans(SpanQuery(attempt_id="a"))).items
    assert got.model_dump(exclude={"sequence"}) == s.model_dump(exclude={"sequence"})


async def test_span_query_filters_and_pagination(store: Store) -> None:
    spans = [span(f"r{i % 2}", f"a{i % 4}", "llm" if i % 3 else "tool") for i in range(12)]
    spans[5] = spans[5].model_copy(update={"trace_id": "f" * 32})
    await store.add_spans(spans[:6])
    await store.add_spans(spans[6:])

    def ids(items: list[Span]) -> list[str]:
        return [s.span_id for s in items]

    by_rollout = await store.query_spans(SpanQuery(rollout_id="r1"))
    assert ids(by_rollout.items) == ids([s for s in spans if s.rollout_id == "r1"])
    by_attempt = await store.query_spans(SpanQuery(attempt_id="a2", name="llm"))
    assert ids(by_attempt.items) == ids([s for s in spans if s.attempt_id == "a2" and s.name == "llm"])
    assert ids((await store.query_spans(SpanQuery(trace_id="f" * 32))).items) == [spans[5].span_id]
    assert (await store.query_spans(SpanQuery(rollout_id="nope"))).total == 0

    p1 = await store.query_spans(SpanQuery(limit=5))
    p2 = await store.query_spans(SpanQuery(limit=5, offset=5))
    p3 = await store.query_spans(SpanQuery(limit=5, offset=10))
    assert (p1.total, p1.next_offset, p2.next_offset, p3.next_offset) == (12, 5, 10, None)
    # Totals of short (last) pages, filtered ones and pages past the end are counts all the same.
    assert (p3.total, by_rollout.total, by_attempt.total) == (12, 6, len(by_attempt.items))
    past = await store.query_spans(SpanQuery(rollout_id="r1", limit=5, offset=20))
    assert (past.items, past.total, past.next_offset) == ([], 6, None)
    assert ids(p1.items + p2.items + p3.items) == ids(spans)


async def test_span_query_by_many_rollouts(store: Store) -> None:
    spans = [span(f"r{i % 3}", f"a{i % 3}", "llm" if i % 2 else "tool") for i in range(12)]
    await store.add_spans(spans[:7])
    await store.add_spans(spans[7:])

    def ids(items: list[Span]) -> list[str]:
        return [s.span_id for s in items]

    both = await store.query_spans(SpanQuery(rollout_ids=["r2", "r0", "r0", "unknown"]))
    assert ids(both.items) == ids([s for s in spans if s.rollout_id in ("r0", "r2")])
    assert (both.total, both.next_offset) == (8, None)
    p1 = await store.query_spans(SpanQuery(rollout_ids=["r0", "r2"], limit=5))
    p2 = await store.query_spans(SpanQuery(rollout_ids=["r0", "r2"], limit=5, offset=5))
    assert (p1.total, p1.next_offset, p2.total, p2.next_offset) == (8, 5, 8, None)
    assert ids(p1.items + p2.items) == ids(both.items)
    # Combined with the other filters, every filter holds.
    tools = await store.query_spans(SpanQuery(rollout_ids=["r0", "r1"], name="tool"))
    assert ids(tools.items) == ids([s for s in spans if s.rollout_id in ("r0", "r1") and s.name == "tool"])
    narrowed = await store.query_spans(SpanQuery(rollout_ids=["r0", "r1"], rollout_id="r1"))
    assert ids(narrowed.items) == ids([s for s in spans if s.rollout_id == "r1"])
    assert (await store.query_spans(SpanQuery(rollout_ids=[]))).items == []
    with pytest.raises(ValidationError):
        SpanQuery(rollout_ids=["r"] * (MAX_PAGE_SIZE + 1))


# -- queries ---------------------------------------------------------------------------------------


async def test_rollout_query_filters_and_pagination(store: Store) -> None:
    g = await enqueue(store, 3, group_id="g1", task_id="t1")
    v = await enqueue(store, 2, mode=RolloutMode.val)
    other = await enqueue(store, 2)
    (lr,) = await store.lease_rollouts("r", mode=RolloutMode.val)
    await store.finish_attempt(lr.attempt.attempt_id, ok(1.0))

    async def ids(**kw: object) -> list[str]:
        return [r.rollout_id for r in (await store.query_rollouts(RolloutQuery(**kw))).items]  # type: ignore[arg-type]

    assert await ids() == g + v + other
    assert await ids(group_id="g1") == g
    assert await ids(task_id="t1") == g
    assert await ids(mode=RolloutMode.val) == v
    assert await ids(statuses=[RolloutStatus.succeeded]) == [v[0]]
    assert await ids(statuses=[RolloutStatus.queued, RolloutStatus.succeeded], mode=RolloutMode.val) == v
    assert await ids(rollout_ids=[other[1], g[0], "unknown"]) == [g[0], other[1]]
    page = await store.query_rollouts(RolloutQuery(limit=3, offset=3))
    assert (page.total, page.next_offset, [r.rollout_id for r in page.items]) == (7, 6, v + other[:1])
    last = await store.query_rollouts(RolloutQuery(limit=3, offset=6))
    assert (last.next_offset, len(last.items)) == (None, 1)
    beyond = await store.query_rollouts(RolloutQuery(offset=50))
    assert (beyond.total, beyond.items, beyond.next_offset) == (7, [], None)


async def test_attempt_query_filters_and_order(store: Store) -> None:
    r1, r2 = await enqueue(store, 2, max_attempts=3)
    (a,) = await store.lease_rollouts("x")
    await store.finish_attempt(a.attempt.attempt_id, failed())  # r1 requeued, ahead of r2 (older)
    (b,) = await store.lease_rollouts("y")
    assert b.rollout.rollout_id == r1 and b.attempt.attempt_no == 2
    (c,) = await store.lease_rollouts("x")
    assert c.rollout.rollout_id == r2

    async def pairs(**kw: object) -> list[tuple[str, int]]:
        page = await store.query_attempts(AttemptQuery(**kw))  # type: ignore[arg-type]
        return [(x.rollout_id, x.attempt_no) for x in page.items]

    assert await pairs() == [(r1, 1), (r1, 2), (r2, 1)]
    assert await pairs(runner_id="x") == [(r1, 1), (r2, 1)]
    assert await pairs(statuses=[AttemptStatus.running]) == [(r1, 2), (r2, 1)]
    assert await pairs(rollout_id=r2) == [(r2, 1)]
    page = await store.query_attempts(AttemptQuery(limit=2))
    assert (page.total, page.next_offset) == (3, 2)


async def test_unknown_ids_raise_not_found(store: Store) -> None:
    with pytest.raises(NotFoundError):
        await store.get_rollout("missing")
    with pytest.raises(NotFoundError):
        await store.get_attempt("missing")
    with pytest.raises(NotFoundError):
        await store.wait_for_rollouts(["missing"], timeout_seconds=0)
    with pytest.raises(NotFoundError):
        await store.cancel_rollouts(["missing"])


# -- waiting for rollouts --------------------------------------------------------------------------


async def test_wait_for_rollouts_wakes_when_the_last_one_finishes(store: Store) -> None:
    ids = await enqueue(store, 3)
    leased = await store.lease_rollouts("r", max_rollouts=3)
    waiter = asyncio.create_task(store.wait_for_rollouts(ids, timeout_seconds=10))
    for lr in leased[:2]:
        await store.finish_attempt(lr.attempt.attempt_id, ok(1.0))
    await asyncio.sleep(0.2)
    assert not waiter.done()
    start = time.monotonic()
    await store.finish_attempt(leased[2].attempt.attempt_id, failed(retryable=False))
    done = await asyncio.wait_for(waiter, 5)
    assert time.monotonic() - start < WAKE_LIMIT
    assert [r.rollout_id for r in done] == ids
    assert [r.status for r in done] == [RolloutStatus.succeeded] * 2 + [RolloutStatus.failed]


async def test_wait_for_rollouts_returns_the_final_ones_at_timeout(store: Store) -> None:
    ids = await enqueue(store, 2)
    (lr,) = await store.lease_rollouts("r")
    await store.finish_attempt(lr.attempt.attempt_id, ok())
    start = time.monotonic()
    done = await store.wait_for_rollouts(ids, timeout_seconds=0.3)
    assert 0.25 < time.monotonic() - start < 2.0
    assert [r.rollout_id for r in done] == ids[:1]
    assert await store.wait_for_rollouts([], timeout_seconds=5) == []
    with pytest.raises(InvalidRequestError):
        await store.wait_for_rollouts(ids, timeout_seconds=-1)


# -- resources and counters ------------------------------------------------------------------------


async def test_resources_versions(store: Store) -> None:
    with pytest.raises(NotFoundError):
        await store.get_resources()
    v0 = await store.put_resources({"llm": {"url": "http://x/v1"}})
    v1 = await store.put_resources({"llm": {"url": "http://y/v1"}, "prompt": "hi"})
    assert (v0.version, v1.version) == (0, 1)
    assert (await store.get_resources()).resources == {"llm": {"url": "http://y/v1"}, "prompt": "hi"}
    assert await store.get_resources(0) == v0
    again = await store.put_resources({"llm": {"url": "http://x/v1"}}, version=0)
    assert again == v0
    with pytest.raises(ConflictError):
        await store.put_resources({"llm": "other"}, version=0)
    v7 = await store.put_resources({"a": [1, 2]}, version=7)
    assert v7.version == 7 and (await store.get_resources()).version == 7
    assert (await store.put_resources({})).version == 8
    with pytest.raises(NotFoundError):
        await store.get_resources(3)
    with pytest.raises(InvalidRequestError):
        await store.put_resources({"x": 1}, version=-1)


async def test_counters(store: Store) -> None:
    empty = await store.counters()
    assert (empty.spans, empty.resources_versions, empty.latest_resources_version) == (0, 0, None)
    assert sum(empty.rollouts_by_status.values()) == 0
    await enqueue(store, 4, max_attempts=1)
    leased = await store.lease_rollouts("r", max_rollouts=2)
    await store.finish_attempt(leased[0].attempt.attempt_id, ok())
    await store.add_spans([span("r", "a"), span("r", "a")])
    await store.put_resources({"v": 1}, version=4)
    c = await store.counters()
    assert c.rollouts_by_status.get(RolloutStatus.queued) == 2
    assert c.rollouts_by_status.get(RolloutStatus.running) == 1
    assert c.rollouts_by_status.get(RolloutStatus.succeeded) == 1
    assert c.attempts_by_status.get(AttemptStatus.running) == 1
    assert c.attempts_by_status.get(AttemptStatus.succeeded) == 1
    assert (c.spans, c.resources_versions, c.latest_resources_version) == (2, 1, 4)


async def test_long_poll_lease_wakes_on_a_retry_and_on_an_expiry(store: Store) -> None:
    (rid,) = await enqueue(store, 1, max_attempts=3)
    (first,) = await store.lease_rollouts("a")
    waiter = asyncio.create_task(store.lease_rollouts("b", wait_seconds=10))
    await asyncio.sleep(0.2)
    assert not waiter.done()
    start = time.monotonic()
    await store.finish_attempt(first.attempt.attempt_id, failed())  # retryable: back in the queue
    (second,) = await asyncio.wait_for(waiter, 5)
    assert time.monotonic() - start < WAKE_LIMIT
    assert (second.rollout.rollout_id, second.attempt.attempt_no) == (rid, 2)

    # Nobody heartbeats the second attempt: a waiting lease picks the rollout up at its deadline.
    await store.heartbeat(second.attempt.attempt_id, lease_seconds=SHORT_LEASE)
    start = time.monotonic()
    (third,) = await store.lease_rollouts("c", wait_seconds=10)
    assert SHORT_LEASE * 0.5 < time.monotonic() - start < SHORT_LEASE + 1.0
    assert third.attempt.attempt_no == 3
    assert (await store.get_attempt(second.attempt.attempt_id)).status is AttemptStatus.timeout


async def test_out_of_range_values_are_rejected_not_crashing(store: Store) -> None:
    with pytest.raises(InvalidRequestError):
        await store.put_resources({"x": 1}, version=2**70)
    with pytest.raises(InvalidRequestError):
        await store.get_resources(2**70)
    with pytest.raises(InvalidRequestError):
        await store.lease_rollouts("r", lease_seconds=1e12)
    v = await store.put_resources({"x": 1}, version=MAX_STORED_INT)
    assert (await store.get_resources()).version == v.version == MAX_STORED_INT
    await enqueue(store, 2, resources_version=MAX_STORED_INT)
    huge = MAX_STORED_INT
    page = await store.query_rollouts(RolloutQuery(offset=huge))
    assert (page.total, page.items, page.next_offset) == (2, [], None)
    assert (await store.query_spans(SpanQuery(offset=huge))).items == []
    assert (await store.query_attempts(AttemptQuery(offset=huge))).items == []


async def test_unicode_round_trips_and_nul_in_ids_is_rejected(store: Store) -> None:
    rid = "ünï-çødé-🙂"
    (r,) = await store.enqueue_rollouts([RolloutSpec(rollout_id=rid, task={"t": rid + "\x00"})])
    assert r.rollout_id == rid and (await store.get_rollout(rid)).task == {"t": rid + "\x00"}
    # Ids are matched by equality everywhere, and PostgreSQL text can't hold NUL: a clear 400.
    with pytest.raises(InvalidRequestError):
        await store.enqueue_rollouts([RolloutSpec(rollout_id="with\x00nul")])
    with pytest.raises(InvalidRequestError):
        await store.add_spans([span("r\x00", "a")])
    with pytest.raises(InvalidRequestError):
        await store.lease_rollouts("runner\x00")
    with pytest.raises((NotFoundError, InvalidRequestError)):
        await store.get_attempt("no\x00such")
    # An error text is free-form (often raw process output): NUL is replaced, not refused.
    (lr,) = await store.lease_rollouts("r")
    done = await store.finish_attempt(lr.attempt.attempt_id, failed("bad\x00output", retryable=False))
    assert done.error == "bad\ufffdoutput"


async def test_chaos_keeps_the_invariants(store: Store) -> None:
    await run_chaos([store])
