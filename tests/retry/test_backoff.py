"""`reinforge.retry.Backoff`: the one retry rule, and the loops that follow it giving up as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from reinforge.errors import StaleAttemptError, StoreUnavailableError
from reinforge.restarts import RestartPolicy
from reinforge.retry import Backoff
from reinforge.runner.runner import Runner
from reinforge.store.sql.store import SqlStore
from reinforge.types import AttemptOutcome, AttemptStatus


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_delays_grow_by_the_factor_up_to_the_cap() -> None:
    policy = Backoff(0.1, max_s=2.0)
    assert [policy.delay(n) for n in range(1, 8)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0])
    assert [Backoff(0.5, factor=1.0).delay(n) for n in (1, 5)] == [0.5, 0.5]


def test_a_run_gives_up_after_its_tries_and_starts_over_after_a_success() -> None:
    retry = Backoff(0.1, tries=3).start()
    assert [retry.failed(), retry.failed(), retry.failed()] == pytest.approx([0.1, 0.2, None])
    retry.succeeded()
    assert retry.failed() == pytest.approx(0.1)
    unbounded = Backoff(0.05, max_s=5.0).start()
    assert [unbounded.failed() for _ in range(12)][-1] == 5.0  # never None


def test_a_run_gives_up_when_the_next_try_would_start_past_its_window() -> None:
    clock = _Clock()
    retry = Backoff(1.0, within_s=10.0).start(clock)
    assert retry.failed() == 1.0  # the next try would start 1s into the window
    clock.now += 8.0
    assert retry.failed() == 2.0  # ... at 8s + 2s: the window's last moment
    clock.now += 1.0
    assert retry.failed() is None  # ... at 9s + 4s: past it


def test_a_policy_with_nonsense_numbers_is_refused() -> None:
    for bad in ({"first_s": -1.0}, {"first_s": 1.0, "factor": 0.5}, {"first_s": 1.0, "tries": 0}):
        with pytest.raises(ValueError, match="back-off"):
            Backoff(**bad)  # type: ignore[arg-type]


def test_child_restarts_double_per_recent_death_up_to_their_cap() -> None:
    policy = RestartPolicy(backoff_s=0.5, max_backoff_s=3.0)
    assert [policy.delay(n) for n in (0, 1, 2, 3, 4)] == [0.5, 0.5, 1.0, 2.0, 3.0]


async def _runner(tmp_path: Path) -> Runner:
    store = await SqlStore.open(f"sqlite:///{tmp_path / 'store.db'}")
    return Runner(store, lambda task: 0.0, gateway_url="http://127.0.0.1:9", gateway_secret="s")


async def test_the_runner_retries_a_finish_its_tries_then_gives_up(tmp_path: Path) -> None:
    runner = await _runner(tmp_path)
    runner._report_tries = 3
    sent = 0

    async def unavailable() -> None:
        nonlocal sent
        sent += 1
        raise StoreUnavailableError("down")

    await runner._report("a1", AttemptOutcome(status=AttemptStatus.succeeded), unavailable)
    assert (sent, runner.stats.succeeded) == (3, 0)

    async def down_then_up() -> None:
        nonlocal sent
        sent += 1
        if sent < 3:
            raise StoreUnavailableError("down")

    sent = 0
    await runner._report("a2", AttemptOutcome(status=AttemptStatus.succeeded), down_then_up)
    assert (sent, runner.stats.succeeded) == (3, 1)  # the last of its tries got through

    runner.stop_now(report_once=True)
    sent = 0
    await runner._report("a3", AttemptOutcome(status=AttemptStatus.failed), unavailable)
    assert sent == 1

    async def stale() -> None:
        raise StaleAttemptError("late")

    await runner._report("a4", AttemptOutcome(status=AttemptStatus.failed), stale)
    assert runner.stats.stopped == 1


async def test_a_weight_sync_is_tried_its_retries_more_times_then_raises() -> None:
    from reinforge.stack.weight_sync.protocol import StagedWeights, WeightSyncError, switch_with_retries

    class Flaky:
        def __init__(self, failures: int) -> None:
            self.failures, self.calls = failures, 0

        async def switch(self, staged: StagedWeights) -> None:
            self.calls += 1
            if self.calls <= self.failures:
                raise WeightSyncError("not yet")

    recovers = Flaky(failures=2)
    await switch_with_retries(recovers, StagedWeights(version=1), retries=2, delay_s=0.01)  # type: ignore[arg-type]
    assert recovers.calls == 3
    never = Flaky(failures=10)
    with pytest.raises(WeightSyncError, match="not yet"):
        await switch_with_retries(never, StagedWeights(version=1), retries=2, delay_s=0.01)  # type: ignore[arg-type]
    assert never.calls == 3
