"""Finishing an attempt: nothing of it missing from the store, and its one final reward.

The reward rule lives here and nowhere else (`final_reward`): the number the agent returned wins
(for a command agent, its last `REINFORGE_REWARD=` line), else the last final reward the agent
reported (`reinforge.emit_reward(x, final=True)`, a POST to the reward URL, or a
`reinforge.final_reward` span sent over OTLP), else none. The result is the attempt's outcome, the
one stored reward that credit assignment and the dashboard read; reward spans stay in the trace as
events, and nothing derives the final reward from them again. The reports reach the gateway on its
own routes (reward URL, OTLP) or with the runner's finish (an in-process agent's final rewards are
held for it: `AttemptSpanBuffer`), so finishing reads nothing back from the store.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from reinforge.gateway.attempts import AttemptGuard, AttemptState
from reinforge.gateway.recorder import SpanRecorder
from reinforge.semconv import ATTR_REWARD_VALUE, SPAN_FINAL_REWARD
from reinforge.store.protocol import Store
from reinforge.types import AttemptOutcome, AttemptStatus, Rollout, Span

RewardReport = tuple[float, float]
"""(when, value) of a final reward the agent reported."""


def final_reward(returned: float | None, reports: Iterable[RewardReport]) -> float | None:
    """The attempt's final reward: `returned` when there is one, else the latest report's value (the
    later-listed one among reports of the same time), else None."""
    if returned is not None:
        return returned
    latest: RewardReport | None = None
    for report in reports:
        if latest is None or report[0] >= latest[0]:
            latest = report
    return latest[1] if latest is not None else None


def reported_reward(span: Span) -> RewardReport | None:
    """The final reward a `reinforge.final_reward` span reports, or None for any other span (or one
    without a finite number)."""
    if span.name != SPAN_FINAL_REWARD:
        return None
    value = span.attributes.get(ATTR_REWARD_VALUE)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return span.start_time, float(value)


def note_reported_rewards(state: AttemptState, spans: Iterable[Span]) -> None:
    """Remember the final rewards among `spans` that reached the gateway during the attempt."""
    for span in spans:
        report = reported_reward(span)
        if report is not None:
            state.report_final_reward(*report)


class AttemptFinisher:
    """Ends attempts for the runner: its spans queued with the gateway's, all stored, then the finish."""

    def __init__(
        self, store: Store, attempts: AttemptGuard, recorder: SpanRecorder, max_calls_per_attempt: int
    ) -> None:
        self._store = store
        self._attempts = attempts
        self._recorder = recorder
        self._max_calls = max_calls_per_attempt

    async def finish(self, attempt_id: str, outcome: AttemptOutcome, spans: Sequence[Span] = ()) -> Rollout:
        """Queue `spans` (the runner's own: tool spans, reported final rewards), wait until every span
        recorded for the attempt is in the store, then finish the attempt with its final reward.
        Runs on the serving loop. Store errors propagate (StaleAttemptError for a late finish)."""
        for span in spans:
            await self._recorder.record(span)
        await self._recorder.flush(attempt_id)
        state = self._attempts.cached(attempt_id)
        final = self._over_limit(state, outcome)
        if final.status is AttemptStatus.succeeded:
            reports = [r for r in map(reported_reward, spans) if r is not None]
            if state is not None and state.final_report is not None:
                reports.insert(0, state.final_report)
            reward = final_reward(final.reward, reports)
            if reward != final.reward:
                final = final.model_copy(update={"reward": reward})
        try:
            return await self._store.finish_attempt(attempt_id, final)
        finally:
            self._attempts.forget(attempt_id)  # the next call for it reads its final state

    def _over_limit(self, state: AttemptState | None, outcome: AttemptOutcome) -> AttemptOutcome:
        """A succeeded outcome of an attempt that had calls refused (a runaway agent) is recorded as a
        failure that names the limit: its episode is not what the agent would have done."""
        if state is None or not state.refused or outcome.status is not AttemptStatus.succeeded:
            return outcome
        error = (
            f"the agent went on calling after its {self._max_calls} LLM calls and reward "
            f"reports (the gateway's max_calls_per_attempt); {state.refused} more were refused"
        )
        return AttemptOutcome(status=AttemptStatus.failed, error=error, retryable=False)
