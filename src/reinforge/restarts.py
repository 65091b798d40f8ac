"""When a dead child process is started again: back-off doubling per recent death, and a crash loop
(too many deaths within a window) that stops restarting. The engine child and the runner children
follow the same rule with different numbers, so the rule lives once, below both."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from reinforge.retry import Backoff


@dataclass(frozen=True)
class RestartPolicy:
    """A death schedules a restart after `backoff_s`, doubled for each earlier death still inside
    the window (up to `max_backoff_s`); `crash_loop_deaths` deaths within `crash_loop_window_s`
    are a crash loop instead."""

    backoff_s: float = 0.5
    max_backoff_s: float = 30.0
    crash_loop_deaths: int = 5
    crash_loop_window_s: float = 60.0

    def delay(self, recent_deaths: int) -> float:
        return Backoff(self.backoff_s, max_s=self.max_backoff_s).delay(recent_deaths)


class DeathWindow:
    """One child's deaths (time, exit code) within its policy's window."""

    def __init__(self) -> None:
        self.deaths: deque[tuple[float, int | None]] = deque()

    def record(self, now: float, code: int | None, policy: RestartPolicy) -> bool:
        """Add a death; True when the deaths inside the window now make a crash loop."""
        self.deaths.append((now, code))
        while self.deaths and self.deaths[0][0] < now - policy.crash_loop_window_s:
            self.deaths.popleft()
        return len(self.deaths) >= policy.crash_loop_deaths

    def __len__(self) -> int:
        return len(self.deaths)

    @property
    def codes(self) -> list[int | None]:
        return [code for _, code in self.deaths]
