"""The store protocol: the only shared state in reinforge.

Every backend (memory, SQL, the HTTP client) implements exactly this protocol, and one conformance
suite (tests/store/test_conformance.py) runs against all of them, so callers can't tell them apart.

Rules every backend keeps:
- `enqueue_rollouts` is idempotent for specs that carry a `rollout_id`: the second call returns the
  existing rollout unchanged.
- A lease makes a new attempt (`attempt_no` = previous + 1) and moves the rollout to `running`.
  A lease whose deadline passes without a heartbeat is expired: the attempt becomes `timeout`, and the
  rollout goes back to `queued` (or `failed`, when `max_attempts` is used up).
- `finish_attempt` from an attempt that is not the rollout's current running one raises
  `StaleAttemptError` and changes nothing (the late-finish rule).
- A failed, retryable attempt requeues the rollout while attempts remain; otherwise it ends `failed`.
- `add_spans` is idempotent by `span_id`; it returns how many spans were new.
- Waits (`lease_rollouts(wait_seconds=...)`, `wait_for_rollouts`) are event-driven, not busy polls.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from reinforge.types import (
    Attempt,
    AttemptOutcome,
    AttemptQuery,
    LeasedRollout,
    Page,
    ResourcesVersion,
    Rollout,
    RolloutMode,
    RolloutQuery,
    RolloutSpec,
    Span,
    SpanQuery,
    StoreCounters,
)


@runtime_checkable
class Store(Protocol):
    async def enqueue_rollouts(self, specs: Sequence[RolloutSpec]) -> list[Rollout]:
        """Add rollouts in one batch; returns them in the order given."""
        ...

    async def lease_rollouts(
        self,
        runner_id: str,
        max_rollouts: int = 1,
        lease_seconds: float = 60.0,
        wait_seconds: float = 0.0,
        mode: RolloutMode | None = None,
    ) -> list[LeasedRollout]:
        """Lease up to `max_rollouts` queued rollouts (oldest first), waiting up to `wait_seconds`
        for at least one to become available."""
        ...

    async def heartbeat(self, attempt_id: str, lease_seconds: float = 60.0) -> Attempt:
        """Extend a running attempt's lease. Raises StaleAttemptError if it was superseded."""
        ...

    async def finish_attempt(self, attempt_id: str, outcome: AttemptOutcome) -> Rollout:
        """Report the end of an attempt; returns the rollout after the retry policy is applied."""
        ...

    async def cancel_rollouts(self, rollout_ids: Sequence[str]) -> list[Rollout]:
        """Cancel rollouts that are not final yet; their running attempts become `cancelled`."""
        ...

    async def add_spans(self, spans: Sequence[Span]) -> int:
        """Insert spans in one batch (idempotent by span_id); returns the number newly stored."""
        ...

    async def get_rollout(self, rollout_id: str) -> Rollout:
        """Raises NotFoundError for an unknown id."""
        ...

    async def get_attempt(self, attempt_id: str) -> Attempt:
        """Raises NotFoundError for an unknown id."""
        ...

    async def query_rollouts(self, query: RolloutQuery) -> Page[Rollout]:
        """Oldest first."""
        ...

    async def query_attempts(self, query: AttemptQuery) -> Page[Attempt]:
        """By rollout, then attempt_no."""
        ...

    async def query_spans(self, query: SpanQuery) -> Page[Span]:
        """In arrival order (`sequence`)."""
        ...

    async def wait_for_rollouts(self, rollout_ids: Sequence[str], timeout_seconds: float) -> list[Rollout]:
        """Block until every listed rollout is final or the timeout passes; returns the final ones."""
        ...

    async def put_resources(
        self, resources: dict[str, object], version: int | None = None
    ) -> ResourcesVersion:
        """Store a new resources version (next number when `version` is None). Re-putting a version
        with identical content is a no-op; with other content it raises ConflictError."""
        ...

    async def get_resources(self, version: int | None = None) -> ResourcesVersion:
        """The given version, or the latest. Raises NotFoundError when there is none."""
        ...

    async def counters(self) -> StoreCounters: ...

    async def close(self) -> None: ...
