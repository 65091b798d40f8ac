"""How `SqlStore`'s waits sleep between looks: until woken, a lease may have expired, or the wait
is over (`RECHECK_SECONDS` at most, for wake-ups from other processes that no notification brings)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from reinforge.store import rules
from reinforge.store.notify import Watch
from reinforge.types import Rollout


def sleep_for(remaining: float, next_deadline: float | None) -> float:
    sleep = min(remaining, rules.RECHECK_SECONDS)
    if next_deadline is not None:
        sleep = min(sleep, max(next_deadline - time.time(), 0.0) + 0.001)
    return sleep


async def until_all_reported(
    watch: Watch,
    ids: Sequence[str],
    done: dict[str, Rollout],
    deadline: float,
    next_deadline: float | None,
) -> None:
    """Sleep until every rollout still awaited was reported final, a fire named nothing, a lease
    may have expired, or the wait is over: one read for a whole batch, not one per commit."""
    waiting = {i for i in ids if i not in done}
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not await watch.wait(sleep_for(remaining, next_deadline)):
            return
        reported = watch.take_keys()
        if reported is None:
            return
        waiting -= reported
        if not waiting:
            return
