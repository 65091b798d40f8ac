"""When each step's rollouts start, and whether another step fits the time budget.

The step itself is always the same: its rollouts are collected, trained on, and the new policy is
published. What this module decides is everything around that:

- prefetching (`ScheduleSettings.prefetch_rollouts`): the next step's rollouts are enqueued early,
  tagged with the next policy version, and their LLM calls are held at the gateway until that
  version is published, so agents and runners do their pre-call work early while every token is
  still sampled by the policy it trains. They start while this step generates when the runners
  have room for two steps' rollouts; otherwise once this step's rollouts are back (waiting agents
  hold their runner slots, so with room for one step they could starve a retry of this step).
- overlapping (`ScheduleSettings.overlap_rollouts`): the next step's rollouts start, unheld, once
  this step's are back, and are sampled by the version being updated (one behind).
- the time budget (`ScheduleSettings.max_minutes`): a step starts only when the longest of the
  last few steps would still fit, and a step started ahead that the budget then leaves out is
  cancelled instead of left running.

The trainer calls `start_step` before collecting, `rollouts_collected` after, `time_step` around the
whole step, and `cancel_ahead` at the end; the rollouts themselves come from a `RolloutQueue`.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from reinforge.training.config import ScheduleSettings

BUDGET_STEPS = 5
"""Steps whose longest duration predicts the next one's for `max_minutes`: step times vary (longer
answers, a slow validation), and predicting with the last one alone let runs end past the budget."""


@dataclass(frozen=True)
class EnqueuedStep:
    """One step's rollouts in the store, and the data position right after its tasks were drawn
    (what a checkpoint taken after training this step records)."""

    number: int
    rollout_ids: list[str]
    data_position: dict[str, Any]


class RolloutQueue(Protocol):
    """Where a step's rollouts come from."""

    async def enqueue(self, step: int, policy_version: int, *, hold: bool) -> EnqueuedStep:
        """Draw step `step`'s tasks and enqueue its rollouts, sampled by `policy_version`; with
        `hold`, their LLM calls wait at the gateway until that version is published."""
        ...

    async def cancel(self, step: EnqueuedStep) -> None:
        """Cancel a step that will not be trained on (and drop its holds)."""
        ...


class RolloutScheduler:
    """Decides when each step's rollouts are enqueued and whether another step fits the budget."""

    def __init__(
        self,
        settings: ScheduleSettings,
        queue: RolloutQueue,
        *,
        runner_slots: int,
        rollouts_per_step: int,
        runner_processes: bool,
        rl_seconds: float = 0.0,
    ) -> None:
        """`runner_slots`: attempts the runners run at once; `runner_processes`: whether the agents run
        in child processes (the default prefetches only then: in-process agents would run their
        pre-call Python under the trainer's interpreter lock, during the update); `rl_seconds`: RL
        time already spent (a resumed run)."""
        self._settings = settings
        self._queue = queue
        prefetch = runner_processes if settings.prefetch_rollouts is None else settings.prefetch_rollouts
        self._overlap = settings.overlap_rollouts
        self._prefetch = prefetch and not self._overlap
        self._prefetch_while_generating = self._prefetch and runner_slots >= 2 * rollouts_per_step
        self._started = time.monotonic() - rl_seconds
        self._recent_steps_s: collections.deque[float] = collections.deque(maxlen=BUDGET_STEPS)
        self._ahead: EnqueuedStep | None = None

    @property
    def rl_seconds(self) -> float:
        """RL wall time so far, sessions before a resume included."""
        return time.monotonic() - self._started

    def fits(self, steps: int) -> bool:
        """Whether `steps` more steps likely fit in the time budget."""
        if self._settings.max_minutes is None:
            return True
        longest = max(self._recent_steps_s, default=0.0)
        return self.rl_seconds + steps * longest <= self._settings.max_minutes * 60

    def run_progress(self, steps_done: int) -> float:
        """How far along the run is (0 to 1, for the learning-rate schedule): steps done over
        `max_steps` or, with `max_minutes`, the time spent over the budget, whichever is further."""
        done = steps_done / max(self._settings.max_steps, 1)
        if self._settings.max_minutes is not None:
            done = max(done, self.rl_seconds / (self._settings.max_minutes * 60))
        return done

    async def start_step(self, step: int, policy_version: int) -> EnqueuedStep:
        """Step `step`'s rollouts: those started ahead, else enqueued now. With room for two steps,
        the next step's start too, held for the version this step publishes."""
        current = self._ahead or await self._queue.enqueue(step, policy_version, hold=False)
        self._ahead = None
        if self._prefetch_while_generating and self._may_start_ahead(step):
            self._ahead = await self._queue.enqueue(step + 1, policy_version + 1, hold=True)
        return current

    async def rollouts_collected(self, step: int, policy_version: int) -> None:
        """Step `step`'s rollouts are back: start the next step's during the update, overlapped
        (sampled by `policy_version`, the one being updated) or prefetched (held for the next)."""
        if not self._may_start_ahead(step):
            return
        if self._overlap:
            self._ahead = await self._queue.enqueue(step + 1, policy_version, hold=False)
        elif self._prefetch:
            self._ahead = await self._queue.enqueue(step + 1, policy_version + 1, hold=True)

    @contextmanager
    def time_step(self) -> Iterator[None]:
        """Count the block (a step, with its validation) among the recent steps the budget predicts
        from."""
        started = time.monotonic()
        yield
        self._recent_steps_s.append(time.monotonic() - started)

    async def cancel_ahead(self) -> None:
        """A step started ahead that the budget then left out: not trained on, so not left running."""
        if self._ahead is not None:
            await self._queue.cancel(self._ahead)
            self._ahead = None

    def _may_start_ahead(self, step: int) -> bool:
        return self._ahead is None and step < self._settings.max_steps and self.fits(2)
