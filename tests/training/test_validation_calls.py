"""`mean_llm_calls`: the model calls per held-out episode that validation reports as `val/calls`."""

from __future__ import annotations

from reinforge import semconv
from reinforge.store.memory import MemoryStore
from reinforge.training.rollouts import mean_llm_calls
from reinforge.types import AttemptOutcome, AttemptStatus, RolloutSpec, Span


def _spans(rollout_id: str, attempt_id: str, llm: int, other: int = 1) -> list[Span]:
    names = [semconv.SPAN_LLM_CALL] * llm + ["tool.calculator"] * other
    return [Span(rollout_id=rollout_id, attempt_id=attempt_id, name=name) for name in names]


async def test_counts_llm_spans_of_each_rollouts_last_attempt() -> None:
    store = MemoryStore()
    rollouts = await store.enqueue_rollouts([RolloutSpec(task={"n": n}, max_attempts=2) for n in range(4)])
    leased = {lr.rollout.rollout_id: lr.attempt for lr in await store.lease_rollouts("r", max_rollouts=4)}
    a, b, c, d = (r.rollout_id for r in rollouts)
    await store.add_spans(_spans(a, leased[a].attempt_id, 3) + _spans(b, leased[b].attempt_id, 0))
    await store.add_spans(_spans(c, leased[c].attempt_id, 2))  # c's first try fails and is retried
    for rid in (a, b, d):
        await store.finish_attempt(leased[rid].attempt_id, AttemptOutcome(status=AttemptStatus.succeeded))
    await store.finish_attempt(leased[c].attempt_id, AttemptOutcome(status=AttemptStatus.failed))
    (retry,) = await store.lease_rollouts("r", max_rollouts=1)
    assert retry.rollout.rollout_id == c
    await store.add_spans(_spans(c, retry.attempt.attempt_id, 1))
    await store.finish_attempt(retry.attempt.attempt_id, AttemptOutcome(status=AttemptStatus.succeeded))
    final = [await store.get_rollout(r.rollout_id) for r in rollouts]

    # a: 3 calls, b: none, c: the retry's 1 (not its failed try's 2), d: no span at all.
    assert await mean_llm_calls(store, final) == (3 + 0 + 1 + 0) / 4
    assert await mean_llm_calls(store, final[:1]) == 3.0
    assert await mean_llm_calls(store, []) == 0.0
