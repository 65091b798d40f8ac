"""Many workers leasing, heartbeating, finishing, dying and cancelling at once, then the invariants."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

from reinforge.errors import StaleAttemptError
from reinforge.store import Store
from reinforge.types import (
    AttemptOutcome,
    AttemptQuery,
    AttemptStatus,
    RolloutQuery,
    RolloutSpec,
    RolloutStatus,
)


async def run_chaos(stores: list[Store], n_rollouts: int = 60, n_workers: int = 10, seed: int = 0) -> None:
    rng = random.Random(seed)
    specs = [RolloutSpec(rollout_id=f"r{i:04d}", task={"i": i}, max_attempts=3) for i in range(n_rollouts)]
    await stores[0].enqueue_rollouts(specs)
    ids = [s.rollout_id for s in specs if s.rollout_id]

    async def worker(n: int) -> None:
        store = stores[n % len(stores)]
        while True:
            leased = await store.lease_rollouts(f"w{n}", max_rollouts=2, lease_seconds=0.25, wait_seconds=0.5)
            if not leased:
                return
            for lr in leased:
                roll = rng.random()
                try:
                    if roll < 0.15:
                        continue  # the runner "dies": its lease expires
                    await store.heartbeat(lr.attempt.attempt_id, lease_seconds=0.25)
                    await asyncio.sleep(rng.random() * 0.02)
                    if roll < 0.4:
                        outcome = AttemptOutcome(status=AttemptStatus.failed, error="flaky")
                    else:
                        outcome = AttemptOutcome(status=AttemptStatus.succeeded, reward=1.0)
                    await store.finish_attempt(lr.attempt.attempt_id, outcome)
                except StaleAttemptError:
                    pass  # expired or cancelled meanwhile: exactly what the rule is for

    async def canceller() -> None:
        for _ in range(3):
            await asyncio.sleep(0.05)
            await stores[-1].cancel_rollouts(rng.sample(ids, 3))

    await asyncio.gather(*(worker(n) for n in range(n_workers)), canceller())
    done = await stores[0].wait_for_rollouts(ids, timeout_seconds=30)
    assert len(done) == n_rollouts, "every rollout ends final"

    rollouts = {r.rollout_id: r for r in (await stores[0].query_rollouts(RolloutQuery(limit=1000))).items}
    attempts = (await stores[0].query_attempts(AttemptQuery(limit=1000))).items
    per_rollout = Counter(a.rollout_id for a in attempts)
    for rid, r in rollouts.items():
        mine = [a for a in attempts if a.rollout_id == rid]
        assert r.attempt_count == per_rollout[rid] <= r.max_attempts
        assert sorted(a.attempt_no for a in mine) == list(range(1, len(mine) + 1))
        assert not any(a.status is AttemptStatus.running for a in mine)
        succeeded = [a for a in mine if a.status is AttemptStatus.succeeded]
        assert len(succeeded) <= 1
        if r.status is RolloutStatus.succeeded:
            assert succeeded and succeeded[0].attempt_no == r.attempt_count and r.reward == 1.0
        else:
            assert not succeeded and r.reward is None
