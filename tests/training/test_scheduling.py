"""RolloutScheduler's decisions (when each step's rollouts start, with which version, held or not),
on a fake queue: no store, engine or runners."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from reinforge.training.config import ScheduleSettings
from reinforge.training.scheduling import EnqueuedStep, RolloutScheduler


class FakeQueue:
    """Records each enqueue as (step, version, hold), and each cancelled step."""

    def __init__(self) -> None:
        self.enqueued: list[tuple[int, int, bool]] = []
        self.cancelled: list[int] = []

    async def enqueue(self, step: int, policy_version: int, *, hold: bool) -> EnqueuedStep:
        self.enqueued.append((step, policy_version, hold))
        return EnqueuedStep(number=step, rollout_ids=[f"s{step}"], data_position={"position": step})

    async def cancel(self, step: EnqueuedStep) -> None:
        self.cancelled.append(step.number)


def run_steps(scheduler: RolloutScheduler, steps: int) -> list[int]:
    """Drive the scheduler as the trainer does; returns the step each trained batch was enqueued for."""

    async def go() -> list[int]:
        trained = []
        for step in range(1, steps + 1):
            version = step - 1  # each step publishes one version
            batch = await scheduler.start_step(step, version)
            trained.append(batch.number)
            await scheduler.rollouts_collected(step, version)
        await scheduler.cancel_ahead()
        return trained

    return asyncio.run(go())


def scheduler(
    queue: FakeQueue, *, slots: int = 16, processes: bool = False, **settings: Any
) -> RolloutScheduler:
    return RolloutScheduler(
        ScheduleSettings(**{"max_steps": 3, **settings}),
        queue,
        runner_slots=slots,
        rollouts_per_step=8,
        runner_processes=processes,
    )


def test_without_prefetch_each_step_enqueues_its_own_rollouts_unheld() -> None:
    queue = FakeQueue()
    assert run_steps(scheduler(queue), 3) == [1, 2, 3]
    assert queue.enqueued == [(1, 0, False), (2, 1, False), (3, 2, False)]
    assert queue.cancelled == []


def test_prefetch_with_room_for_two_steps_starts_the_next_while_this_one_generates() -> None:
    queue = FakeQueue()
    assert run_steps(scheduler(queue, slots=16, prefetch_rollouts=True), 3) == [1, 2, 3]
    # Step n + 1 is enqueued right after step n's, held for version n; none past max_steps.
    assert queue.enqueued == [(1, 0, False), (2, 1, True), (3, 2, True)]


def test_prefetch_with_room_for_one_step_starts_the_next_during_the_update() -> None:
    queue = FakeQueue()
    sched = scheduler(queue, slots=8, prefetch_rollouts=True)

    async def first_step() -> list[tuple[int, int, bool]]:
        await sched.start_step(1, 0)
        before_collect = list(queue.enqueued)
        await sched.rollouts_collected(1, 0)
        return before_collect

    assert asyncio.run(first_step()) == [(1, 0, False)]  # nothing ahead while step 1 generates
    assert queue.enqueued == [(1, 0, False), (2, 1, True)]


def test_runner_processes_prefetch_by_default_and_in_process_runners_do_not() -> None:
    with_processes, in_process = FakeQueue(), FakeQueue()
    run_steps(scheduler(with_processes, processes=True, max_steps=2), 2)
    run_steps(scheduler(in_process, processes=False, max_steps=2), 2)
    assert with_processes.enqueued == [(1, 0, False), (2, 1, True)]
    assert in_process.enqueued == [(1, 0, False), (2, 1, False)]


def test_overlap_starts_the_next_step_unheld_on_the_version_being_updated() -> None:
    queue = FakeQueue()
    # Overlap wins over prefetch: the next step samples the version this step is updating.
    assert run_steps(scheduler(queue, overlap_rollouts=True, prefetch_rollouts=True), 3) == [1, 2, 3]
    assert queue.enqueued == [(1, 0, False), (2, 0, False), (3, 1, False)]


def test_a_step_started_ahead_that_the_run_leaves_out_is_cancelled() -> None:
    queue = FakeQueue()
    sched = scheduler(queue, max_steps=5, prefetch_rollouts=True)
    assert run_steps(sched, 2) == [1, 2]  # the trainer stopped early (the time budget, say)
    assert queue.enqueued[-1] == (3, 2, True) and queue.cancelled == [3]


def test_the_budget_predicts_with_the_longest_recent_step(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr("reinforge.training.scheduling.time.monotonic", lambda: now[0])
    sched = RolloutScheduler(
        ScheduleSettings(max_steps=100, max_minutes=1.0),
        FakeQueue(),
        runner_slots=8,
        rollouts_per_step=8,
        runner_processes=False,
        rl_seconds=20.0,  # resumed: 20 s spent in an earlier session
    )
    for seconds in (10.0, 4.0):
        with sched.time_step():
            now[0] += seconds
    assert sched.rl_seconds == 34.0
    assert sched.fits(2)  # 34 + 2 x 10 <= 60
    assert not sched.fits(3)  # 34 + 3 x 10 > 60: the longest step, not the last, predicts
    # The schedule's progress is the larger of steps done and time spent.
    assert sched.run_progress(10) == pytest.approx(34.0 / 60.0)
    assert sched.run_progress(80) == pytest.approx(0.8)
