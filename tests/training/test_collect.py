"""collect_transitions on a real SQLite store: it trains on the attempt credit/ would pick with every
attempt record, while reading records only for rollouts that needed more than one attempt."""

from __future__ import annotations

from pathlib import Path

from credit.span_factory import llm_span
from reinforge.credit import CreditConfig, build_transitions
from reinforge.store.factory import open_store
from reinforge.training.rollouts import collect_transitions
from reinforge.types import (
    AttemptOutcome,
    AttemptQuery,
    AttemptStatus,
    RolloutSpec,
    RolloutStatus,
    SpanQuery,
)


async def test_transitions_come_from_the_attempt_the_records_pick(tmp_path: Path) -> None:
    store = await open_store(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        await store.enqueue_rollouts(
            [
                RolloutSpec(rollout_id=r, task={"q": r}, group_id="g", max_attempts=2)
                for r in ("retry", "once")
            ]
        )
        first = {x.rollout.rollout_id: x.attempt.attempt_id for x in await store.lease_rollouts("w", 2)}
        # The retried rollout's failed first attempt wrote its span with a later clock than the
        # second attempt will: without the records, "the attempt that started last" would be it.
        await store.add_spans(
            [
                llm_span([1, 2], [3, 4], t=500.0, rollout_id="retry", attempt_id=first["retry"]),
                llm_span([1, 2], [9], t=100.0, rollout_id="once", attempt_id=first["once"]),
            ]
        )
        await store.finish_attempt(first["retry"], AttemptOutcome(status=AttemptStatus.failed, error="boom"))
        await store.finish_attempt(first["once"], AttemptOutcome(status=AttemptStatus.succeeded, reward=1.0))
        (again,) = await store.lease_rollouts("w", 1)
        second = again.attempt.attempt_id
        await store.add_spans([llm_span([1, 2], [5, 6, 7], t=200.0, rollout_id="retry", attempt_id=second)])
        await store.finish_attempt(second, AttemptOutcome(status=AttemptStatus.succeeded, reward=0.5))

        rollouts = await store.wait_for_rollouts(["retry", "once"], 5.0)
        assert [(r.status, r.attempt_count) for r in rollouts] == [
            (RolloutStatus.succeeded, 2),
            (RolloutStatus.succeeded, 1),
        ]
        transitions, metrics = await collect_transitions(store, rollouts, CreditConfig())
        assert [(t.rollout_id, t.attempt_id, t.response_ids, t.reward) for t in transitions] == [
            ("retry", second, [5, 6, 7], 0.5),
            ("once", first["once"], [9], 1.0),
        ]
        assert metrics.transitions == 2
        # The same as credit/ with every attempt record at hand.
        for rollout, got in zip(rollouts, transitions, strict=True):
            records = (await store.query_attempts(AttemptQuery(rollout_id=rollout.rollout_id))).items
            page = await store.query_spans(SpanQuery(rollout_id=rollout.rollout_id, limit=100))
            (want,), _ = build_transitions(rollout, page.items, CreditConfig(), attempts=records)
            assert got == want
    finally:
        await store.close()


async def test_finish_and_collect_reads_each_rollout_as_it_ends_and_keeps_the_given_order(
    tmp_path: Path,
) -> None:
    """Rollouts ending in reverse order, one of them never: the ones that ended come back with their
    transitions in the order asked for, the straggler is cancelled at the timeout."""
    import asyncio

    from reinforge.training.rollouts import finish_and_collect

    store = await open_store(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        ids = ["a", "b", "c", "stuck"]
        await store.enqueue_rollouts([RolloutSpec(rollout_id=r, task={"q": r}, group_id="g") for r in ids])
        attempts = {x.rollout.rollout_id: x.attempt.attempt_id for x in await store.lease_rollouts("w", 4)}
        reads: list[int] = []
        real_query = store.query_spans

        async def counted(query: SpanQuery) -> object:
            reads.append(1)
            return await real_query(query)

        store.query_spans = counted  # type: ignore[method-assign]

        async def finish_in_reverse() -> None:
            for n, rollout_id in enumerate(["c", "b", "a"]):
                await asyncio.sleep(0.3)
                attempt = attempts[rollout_id]
                span = llm_span([1], [2 + n], t=float(n), rollout_id=rollout_id, attempt_id=attempt)
                await store.add_spans([span])
                await store.finish_attempt(attempt, AttemptOutcome(status=AttemptStatus.succeeded, reward=n))
                if rollout_id == "c":
                    await asyncio.sleep(0.2)
                    assert reads == [1], "c's spans were read while the others still ran"

        finishing = asyncio.create_task(finish_in_reverse())
        rollouts, transitions, metrics = await finish_and_collect(
            store, ids, timeout_s=2.0, credit=CreditConfig(), poll_s=0.05
        )
        await finishing
        assert [(r.rollout_id, r.status) for r in rollouts] == [
            ("a", RolloutStatus.succeeded),
            ("b", RolloutStatus.succeeded),
            ("c", RolloutStatus.succeeded),
            ("stuck", RolloutStatus.cancelled),
        ]
        assert [(t.rollout_id, t.response_ids, t.reward) for t in transitions] == [
            ("a", [4], 2.0),
            ("b", [3], 1.0),
            ("c", [2], 0.0),
        ]
        assert metrics.transitions == 3
    finally:
        await store.close()
