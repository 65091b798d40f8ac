"""The attempt's one final reward: the returned reward wins, else the latest reported final reward,
else none; decided once, at the finish, from what reached the gateway (no span read back)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from reinforge import semconv
from reinforge.gateway import Gateway
from reinforge.gateway.finishing import final_reward
from reinforge.inference import ScriptedBackend
from reinforge.store.memory import MemoryStore
from reinforge.types import AttemptOutcome, AttemptStatus, Page, Span, SpanQuery

from .conftest import SECRET, running_attempt


class NoSpanReads(MemoryStore):
    """A store that counts span queries: the finish path must make none."""

    def __init__(self) -> None:
        super().__init__()
        self.span_queries = 0

    async def query_spans(self, query: SpanQuery) -> Page[Span]:
        self.span_queries += 1
        return await super().query_spans(query)


def _final_span(rollout_id: str, attempt_id: str, value: Any, at: float) -> Span:
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        name=semconv.SPAN_FINAL_REWARD,
        start_time=at,
        end_time=at,
        attributes={semconv.ATTR_STEP_KIND: semconv.STEP_REWARD, semconv.ATTR_REWARD_VALUE: value},
    )


def test_the_rule_returned_wins_else_the_latest_report_else_none() -> None:
    assert final_reward(0.0, [(1.0, 1.0)]) == 0.0  # a returned 0 is a reward, not "none"
    assert final_reward(None, [(2.0, 0.2), (1.0, 0.1)]) == 0.2
    assert final_reward(None, [(1.0, 0.1), (1.0, 0.3)]) == 0.3  # same time: the later-listed one
    assert final_reward(None, []) is None


# returned, posted to the reward URL (and whether it is final), in-process span (offset from now),
# expected stored reward
CASES = [
    (0.9, None, None, 0.9),
    (0.9, (0.5, True), (0.4, +1.0), 0.9),
    (None, (0.5, True), None, 0.5),
    (None, None, (0.4, +1.0), 0.4),
    (None, (0.5, True), (0.4, +60.0), 0.4),  # the in-process report came last
    (None, (0.5, True), (0.4, -60.0), 0.5),  # the URL report came last
    (None, (0.5, False), None, None),  # an intermediate reward is not a final one
    (None, None, None, None),
]


@pytest.mark.parametrize(("returned", "posted", "emitted", "expected"), CASES)
async def test_the_stored_reward_follows_the_rule_for_each_source(
    tokenizer: Any,
    returned: float | None,
    posted: tuple[float, bool] | None,
    emitted: tuple[float, float] | None,
    expected: float | None,
) -> None:
    store = NoSpanReads()
    gateway = Gateway(store, ScriptedBackend(tokenizer, ["ok"]), SECRET)
    leased = await running_attempt(store)
    attempt_id, rollout_id = leased.attempt.attempt_id, leased.rollout.rollout_id
    if posted is not None:
        caller = await gateway.admit(attempt_id, gateway.keys.token_for(attempt_id))
        await gateway.record_reward(caller, posted[0], posted[1], None)
    spans = (
        [] if emitted is None else [_final_span(rollout_id, attempt_id, emitted[0], time.time() + emitted[1])]
    )
    outcome = AttemptOutcome(status=AttemptStatus.succeeded, reward=returned)
    rollout = await gateway.finish_attempt(attempt_id, outcome, spans)
    assert rollout.reward == expected
    assert (await store.get_attempt(attempt_id)).reward == expected
    assert store.span_queries == 0  # decided from what reached the gateway, not read back
    stored = (await store.query_spans(SpanQuery(attempt_id=attempt_id))).items
    assert len(stored) == int(posted is not None) + int(emitted is not None)  # the reports stay as events
    await gateway.close()


async def test_a_failed_outcome_keeps_its_reward_and_a_bad_report_is_ignored(tokenizer: Any) -> None:
    store = NoSpanReads()
    gateway = Gateway(store, ScriptedBackend(tokenizer, ["ok"]), SECRET)
    failed = await running_attempt(store)
    caller = await gateway.admit(failed.attempt.attempt_id, gateway.keys.token_for(failed.attempt.attempt_id))
    await gateway.record_reward(caller, 1.0, True, None)
    outcome = AttemptOutcome(status=AttemptStatus.failed, error="crashed", retryable=False)
    assert (await gateway.finish_attempt(failed.attempt.attempt_id, outcome)).reward is None

    other = await running_attempt(store)
    bad = _final_span(other.rollout.rollout_id, other.attempt.attempt_id, "high", time.time())
    succeeded = AttemptOutcome(status=AttemptStatus.succeeded)
    assert (await gateway.finish_attempt(other.attempt.attempt_id, succeeded, [bad])).reward is None
    assert store.span_queries == 0
    await gateway.close()
