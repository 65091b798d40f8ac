"""`Backoff`: the one rule for how long to wait before trying again, and when to stop.

Every retry in reinforge follows it (the store client, the runner's lease and finish loops, both span
batchers, the weight sync, child restarts), each with its own numbers: the delay grows by `factor`
from `first_s` up to `max_s`, and a run of tries gives up once it has made `tries` tries or when the
next try would start more than `within_s` after the run started.

    retry = LEASE_BACKOFF.start()
    while True:
        try:
            return await call()
        except Unavailable:
            delay = retry.failed()
            if delay is None:
                raise
            await asyncio.sleep(delay)

No jitter: the loops retry calls to one local server that is down or restarting, where spreading the
tries out buys nothing, and a fixed schedule keeps the tests' timings exact.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delays `first_s`, `first_s * factor`, ... capped at `max_s`; at most `tries` tries (None: no
    limit) and none starting later than `within_s` after the run started (None: no limit)."""

    first_s: float
    factor: float = 2.0
    max_s: float = math.inf
    tries: int | None = None
    within_s: float | None = None

    def __post_init__(self) -> None:
        if not (self.first_s >= 0 and self.factor >= 1 and self.max_s >= 0):
            raise ValueError(f"a back-off needs first_s >= 0, factor >= 1 and max_s >= 0: {self}")
        if self.tries is not None and self.tries < 1:
            raise ValueError(f"a back-off needs tries >= 1 (or None): {self}")

    def delay(self, failures: int) -> float:
        """The wait after the `failures`-th failure in a row (1 for the first)."""
        return min(self.max_s, self.first_s * self.factor ** max(failures - 1, 0))

    def start(self, clock: Callable[[], float] = time.monotonic) -> Retrying:
        """A fresh run of tries under this rule."""
        return Retrying(self, clock)


class Retrying:
    """One run of tries: counts its failures in a row and says how long to wait before the next."""

    __slots__ = ("_clock", "_started_at", "failures", "policy")

    def __init__(self, policy: Backoff, clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self._clock = clock
        self.failures = 0
        self._started_at = clock() if policy.within_s is not None else 0.0

    def failed(self) -> float | None:
        """Count a failure: the delay before the next try, or None when the rule says give up."""
        policy = self.policy
        self.failures += 1
        if policy.tries is not None and self.failures >= policy.tries:
            return None
        delay = policy.delay(self.failures)
        if policy.within_s is not None and self._clock() + delay - self._started_at > policy.within_s:
            return None
        return delay

    def succeeded(self) -> None:
        """A try worked: the next failure waits the first delay again."""
        self.failures = 0
