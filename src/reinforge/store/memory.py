"""The in-memory store: the reference implementation of the protocol, for tests and one-process runs.

Everything lives in dicts guarded by one lock (callers may sit on several threads and event loops).
Values go in and out through a JSON round trip, so what a caller gets back is exactly what the SQL
and HTTP backends would give, and mutating a returned object never changes the store.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel
from pydantic_core import PydanticSerializationError, to_json

from reinforge.errors import (
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    StaleAttemptError,
    StoreUnavailableError,
)
from reinforge.store import rules
from reinforge.store.notify import Signal
from reinforge.types import (
    Attempt,
    AttemptOutcome,
    AttemptQuery,
    AttemptStatus,
    LeasedRollout,
    Page,
    ResourcesVersion,
    Rollout,
    RolloutMode,
    RolloutQuery,
    RolloutSpec,
    RolloutStatus,
    Span,
    SpanQuery,
    StoreCounters,
    new_ordered_id,
)

M = TypeVar("M", bound=BaseModel)


def _frozen(model: M) -> M:
    """A JSON round trip: detaches the value from the caller and rejects what JSON can't hold."""
    try:
        return type(model).model_validate_json(model.model_dump_json())
    except PydanticSerializationError as e:
        raise InvalidRequestError(f"{type(model).__name__} holds a value that is not JSON: {e}") from e


def _copy(model: M) -> M:
    return model.model_copy(deep=True)


class _Queues:
    """The queued rollouts of each mode, oldest first by enqueue order. A rollout that left the queue
    (leased, cancelled) keeps its entry until it reaches the front, where it is dropped."""

    def __init__(self) -> None:
        self.order: dict[str, int] = {}  # rollout id -> enqueue order, the "oldest first" key
        self._heaps: dict[RolloutMode, list[tuple[int, str]]] = {m: [] for m in RolloutMode}

    def push(self, rollout: Rollout) -> None:
        """Queue `rollout` (again) in its place by first enqueue."""
        rid = rollout.rollout_id
        order = self.order.setdefault(rid, len(self.order))
        heapq.heappush(self._heaps[rollout.mode], (order, rid))

    def pop_oldest(self, modes: list[RolloutMode], rollouts: dict[str, Rollout]) -> str | None:
        best: RolloutMode | None = None
        for m in modes:
            q = self._heaps[m]
            while q and rollouts[q[0][1]].status is not RolloutStatus.queued:
                heapq.heappop(q)
            if q and (best is None or q[0] < self._heaps[best][0]):
                best = m
        return heapq.heappop(self._heaps[best])[1] if best is not None else None


class _LeaseDeadlines:
    """Running attempts by lease deadline. A heartbeat pushes a new entry rather than moving the old
    one, so an entry whose attempt stopped running or whose deadline moved is stale and skipped."""

    def __init__(self, attempts: dict[str, Attempt]) -> None:
        self._attempts = attempts
        self._heap: list[tuple[float, str]] = []

    def push(self, attempt: Attempt) -> None:
        heapq.heappush(self._heap, (attempt.lease_deadline, attempt.attempt_id))

    def _is_live(self, deadline: float, attempt_id: str) -> bool:
        a = self._attempts[attempt_id]
        return a.status is AttemptStatus.running and a.lease_deadline == deadline

    def next(self) -> float | None:
        """The earliest deadline still standing."""
        while self._heap and not self._is_live(*self._heap[0]):
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def expired(self, now: float) -> Iterator[Attempt]:
        """The running attempts whose lease passed before `now`, each removed as it is yielded."""
        while self._heap and self._heap[0][0] < now:
            deadline, aid = heapq.heappop(self._heap)
            if self._is_live(deadline, aid):
                yield self._attempts[aid]


class MemoryStore:
    """The whole store in this process's memory; lost when the process ends."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._rollouts: dict[str, Rollout] = {}
        self._queues = _Queues()
        self._attempts: dict[str, Attempt] = {}
        self._attempts_of: dict[str, list[str]] = {}
        self._current: dict[str, str] = {}  # rollout id -> its running attempt id
        self._deadlines = _LeaseDeadlines(self._attempts)
        self._spans: dict[str, Span] = {}
        self._span_order: list[str] = []
        self._spans_by_rollout: dict[str, list[str]] = {}
        self._spans_by_attempt: dict[str, list[str]] = {}
        self._resources: dict[int, ResourcesVersion] = {}
        self._queued = Signal()
        self._finalised = Signal()
        self._closed = False

    # -- rollouts ---------------------------------------------------------------------------------

    async def enqueue_rollouts(self, specs: Sequence[RolloutSpec]) -> list[Rollout]:
        for spec in specs:
            rules.check_spec(spec)
        frozen = [_frozen(s) for s in specs]
        out: list[Rollout] = []
        added = False
        with self._lock:
            self._check_open()
            now = time.time()
            for spec in frozen:
                rid = spec.rollout_id or new_ordered_id()
                existing = self._rollouts.get(rid)
                if existing is None:
                    existing = Rollout(
                        rollout_id=rid,
                        task=spec.task,
                        task_id=spec.task_id,
                        mode=spec.mode,
                        group_id=spec.group_id,
                        resources_version=spec.resources_version,
                        max_attempts=spec.max_attempts,
                        metadata=spec.metadata,
                        created_at=now,
                        updated_at=now,
                    )
                    self._rollouts[rid] = existing
                    self._queues.push(existing)
                    added = True
                out.append(_copy(existing))
        if added:
            self._queued.fire()
        return out

    async def lease_rollouts(
        self,
        runner_id: str,
        max_rollouts: int = 1,
        lease_seconds: float = 60.0,
        wait_seconds: float = 0.0,
        mode: RolloutMode | None = None,
    ) -> list[LeasedRollout]:
        mode = rules.check_lease_args(runner_id, max_rollouts, lease_seconds, wait_seconds, mode)
        deadline = time.monotonic() + wait_seconds
        with self._queued.watch() as watch:
            while True:
                leased = self._lease_now(runner_id, max_rollouts, lease_seconds, mode)
                remaining = deadline - time.monotonic()
                if leased or remaining <= 0:
                    return leased
                await watch.wait(self._sleep_for(remaining))

    def _lease_now(
        self, runner_id: str, max_rollouts: int, lease_seconds: float, mode: RolloutMode | None
    ) -> list[LeasedRollout]:
        with self._lock:
            self._check_open()
            now = time.time()
            self._expire(now)
            modes = [mode] if mode is not None else list(RolloutMode)
            out: list[LeasedRollout] = []
            while len(out) < max_rollouts:
                rid = self._queues.pop_oldest(modes, self._rollouts)
                if rid is None:
                    break
                rollout = self._rollouts[rid]
                attempt = rules.start_attempt(rollout, runner_id, now, now + lease_seconds)
                self._attempts[attempt.attempt_id] = attempt
                self._attempts_of.setdefault(rid, []).append(attempt.attempt_id)
                self._current[rid] = attempt.attempt_id
                self._deadlines.push(attempt)
                out.append(LeasedRollout(rollout=_copy(rollout), attempt=_copy(attempt)))
            return out

    def _sleep_for(self, remaining: float) -> float:
        """Sleep until woken, but no later than the next lease deadline (an expiry may free work)."""
        with self._lock:
            deadline = self._deadlines.next()
        if deadline is not None:
            remaining = min(remaining, max(deadline - time.time(), 0.0) + 0.001)
        return remaining

    def _expire(self, now: float) -> None:
        """Time out every running attempt whose lease has passed; their rollouts retry or fail."""
        requeued = finalised = False
        for attempt in self._deadlines.expired(now):
            attempt.status = AttemptStatus.timeout
            attempt.finished_at = now
            attempt.error = rules.expiry_error(attempt.attempt_no, attempt.runner_id)
            rollout = self._rollouts[attempt.rollout_id]
            self._current.pop(rollout.rollout_id, None)
            status = rules.after_expiry(rollout.attempt_count, rollout.max_attempts)
            self._move(rollout, status, now, error=attempt.error)
            requeued |= status is RolloutStatus.queued
            finalised |= status is RolloutStatus.failed
        if requeued:
            self._queued.fire()
        if finalised:
            self._finalised.fire()

    def _move(self, rollout: Rollout, status: RolloutStatus, now: float, *, error: str | None) -> None:
        rollout.status = status
        rollout.updated_at = now
        rollout.error = error
        if status is RolloutStatus.queued:
            self._queues.push(rollout)
        elif status.is_final:
            rollout.finished_at = now

    async def heartbeat(self, attempt_id: str, lease_seconds: float = 60.0) -> Attempt:
        rules.check_lease_seconds(lease_seconds)
        with self._lock:
            attempt, now = self._running_attempt(attempt_id)
            attempt.lease_deadline = now + lease_seconds
            attempt.last_heartbeat = now
            self._deadlines.push(attempt)
            return _copy(attempt)

    async def finish_attempt(self, attempt_id: str, outcome: AttemptOutcome) -> Rollout:
        outcome = rules.check_outcome(outcome)
        with self._lock:
            attempt, now = self._running_attempt(attempt_id)
            attempt.status = AttemptStatus(outcome.status)
            attempt.finished_at = now
            attempt.reward = outcome.reward
            attempt.error = outcome.error
            rollout = self._rollouts[attempt.rollout_id]
            self._current.pop(rollout.rollout_id, None)
            status = rules.after_finish(outcome, rollout.attempt_count, rollout.max_attempts)
            self._move(rollout, status, now, error=outcome.error)
            if status.is_final:
                rollout.reward = outcome.reward
            result = _copy(rollout)
        if status is RolloutStatus.queued:
            self._queued.fire()
        else:
            self._finalised.fire()
        return result

    async def cancel_rollouts(self, rollout_ids: Sequence[str]) -> list[Rollout]:
        ids = rules.check_ids(rollout_ids, "rollout_ids")
        with self._lock:
            self._check_open()
            now = time.time()
            self._expire(now)
            self._require_rollouts(ids)
            out = []
            for rid in ids:
                rollout = self._rollouts[rid]
                if not rollout.status.is_final:
                    aid = self._current.pop(rid, None)
                    if aid is not None:
                        attempt = self._attempts[aid]
                        attempt.status = AttemptStatus.cancelled
                        attempt.finished_at = now
                    self._move(rollout, RolloutStatus.cancelled, now, error=rollout.error)
                out.append(_copy(rollout))
        self._finalised.fire()
        return out

    # -- spans ------------------------------------------------------------------------------------

    async def add_spans(self, spans: Sequence[Span]) -> int:
        for s in spans:
            rules.check_span(s)
        frozen = [_frozen(s) for s in spans]
        added = 0
        with self._lock:
            self._check_open()
            for span in frozen:
                if span.span_id in self._spans:
                    continue
                span.sequence = len(self._span_order) + 1
                self._spans[span.span_id] = span
                self._span_order.append(span.span_id)
                self._spans_by_rollout.setdefault(span.rollout_id, []).append(span.span_id)
                self._spans_by_attempt.setdefault(span.attempt_id, []).append(span.span_id)
                added += 1
        return added

    # -- reads ------------------------------------------------------------------------------------

    async def get_rollout(self, rollout_id: str) -> Rollout:
        with self._lock:
            self._check_open()
            self._expire(time.time())
            self._require_rollouts([rollout_id])
            return _copy(self._rollouts[rollout_id])

    async def get_attempt(self, attempt_id: str) -> Attempt:
        with self._lock:
            self._check_open()
            self._expire(time.time())
            return _copy(self._get_attempt(attempt_id))

    async def query_rollouts(self, query: RolloutQuery) -> Page[Rollout]:
        with self._lock:
            self._check_open()
            self._expire(time.time())
            if query.rollout_ids is not None:
                wanted = set(query.rollout_ids)
                pool = sorted((r for r in wanted if r in self._rollouts), key=self._queues.order.__getitem__)
            else:
                pool = list(self._rollouts)
            statuses = set(query.statuses) if query.statuses is not None else None
            matches = [
                r
                for r in (self._rollouts[i] for i in pool)
                if (statuses is None or r.status in statuses)
                and (query.mode is None or r.mode is query.mode)
                and (query.group_id is None or r.group_id == query.group_id)
                and (query.task_id is None or r.task_id == query.task_id)
            ]
            return _page(matches, query.offset, query.limit)

    async def query_attempts(self, query: AttemptQuery) -> Page[Attempt]:
        with self._lock:
            self._check_open()
            self._expire(time.time())
            if query.rollout_id is not None:
                pool = list(self._attempts_of.get(query.rollout_id, []))
            else:
                pool = [a for rid in self._rollouts for a in self._attempts_of.get(rid, [])]
            statuses = set(query.statuses) if query.statuses is not None else None
            matches = [
                a
                for a in (self._attempts[i] for i in pool)
                if (statuses is None or a.status in statuses)
                and (query.runner_id is None or a.runner_id == query.runner_id)
            ]
            return _page(matches, query.offset, query.limit)

    async def query_spans(self, query: SpanQuery) -> Page[Span]:
        with self._lock:
            self._check_open()
            if query.attempt_id is not None:
                pool = self._spans_by_attempt.get(query.attempt_id, [])
            elif query.rollout_id is not None:
                pool = self._spans_by_rollout.get(query.rollout_id, [])
            elif query.rollout_ids is not None:
                pool = sorted(
                    (i for r in set(query.rollout_ids) for i in self._spans_by_rollout.get(r, [])),
                    key=lambda i: self._spans[i].sequence or 0,
                )
            else:
                pool = self._span_order
            wanted = None if query.rollout_ids is None else set(query.rollout_ids)
            matches = [
                s
                for s in (self._spans[i] for i in pool)
                if (query.rollout_id is None or s.rollout_id == query.rollout_id)
                and (wanted is None or s.rollout_id in wanted)
                and (query.attempt_id is None or s.attempt_id == query.attempt_id)
                and (query.name is None or s.name == query.name)
                and (query.trace_id is None or s.trace_id == query.trace_id)
            ]
            return _page(matches, query.offset, query.limit)

    async def wait_for_rollouts(self, rollout_ids: Sequence[str], timeout_seconds: float) -> list[Rollout]:
        ids = rules.check_ids(rollout_ids, "rollout_ids")
        rules.check_wait_seconds(timeout_seconds, "timeout_seconds")
        deadline = time.monotonic() + timeout_seconds
        with self._finalised.watch() as watch:
            while True:
                with self._lock:
                    self._check_open()
                    self._expire(time.time())
                    self._require_rollouts(ids)
                    done = [_copy(self._rollouts[i]) for i in ids if self._rollouts[i].status.is_final]
                remaining = deadline - time.monotonic()
                if len(done) == len(ids) or remaining <= 0:
                    return done
                await watch.wait(self._sleep_for(remaining))

    # -- resources --------------------------------------------------------------------------------

    async def put_resources(
        self, resources: dict[str, object], version: int | None = None
    ) -> ResourcesVersion:
        rules.check_version(version, "version")
        try:
            content: dict[str, Any] = ResourcesVersion.model_validate_json(
                to_json({"version": 0, "resources": resources})
            ).resources
        except (PydanticSerializationError, ValueError) as e:
            raise InvalidRequestError(f"resources must be a JSON object: {e}") from e
        with self._lock:
            self._check_open()
            if version is None:
                version = rules.next_version(max(self._resources, default=None))
            existing = self._resources.get(version)
            if existing is not None:
                if existing.resources != content:
                    raise ConflictError(
                        f"resources version {version} already exists with other content; "
                        "put the new content under a new version (or omit version to get the next one)"
                    )
                return _copy(existing)
            stored = ResourcesVersion(version=version, resources=content, created_at=time.time())
            self._resources[version] = stored
            return _copy(stored)

    async def get_resources(self, version: int | None = None) -> ResourcesVersion:
        rules.check_version(version, "version")
        with self._lock:
            self._check_open()
            if version is None:
                if not self._resources:
                    raise NotFoundError("no resources have been put yet")
                version = max(self._resources)
            found = self._resources.get(version)
            if found is None:
                raise NotFoundError(f"resources version {version} not found")
            return _copy(found)

    async def counters(self) -> StoreCounters:
        with self._lock:
            self._check_open()
            self._expire(time.time())
            rollouts: dict[RolloutStatus, int] = {}
            for r in self._rollouts.values():
                rollouts[r.status] = rollouts.get(r.status, 0) + 1
            attempts: dict[AttemptStatus, int] = {}
            for a in self._attempts.values():
                attempts[a.status] = attempts.get(a.status, 0) + 1
            return StoreCounters(
                rollouts_by_status=rollouts,
                attempts_by_status=attempts,
                spans=len(self._spans),
                resources_versions=len(self._resources),
                latest_resources_version=max(self._resources, default=None),
            )

    async def close(self) -> None:
        with self._lock:
            self._closed = True
        # Wake every waiter so it notices the store is closed instead of sleeping out its timeout.
        self._queued.fire()
        self._finalised.fire()

    # -- helpers ----------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreUnavailableError("the store is closed")

    def _get_attempt(self, attempt_id: str) -> Attempt:
        attempt = self._attempts.get(attempt_id)
        if attempt is None:
            raise NotFoundError(f"attempt {attempt_id!r} not found")
        return attempt

    def _running_attempt(self, attempt_id: str) -> tuple[Attempt, float]:
        """The attempt a runner still holds (leases past their deadline expire first) and the time
        now; StaleAttemptError when it is no longer running. Called under the lock."""
        self._check_open()
        now = time.time()
        self._expire(now)
        attempt = self._get_attempt(attempt_id)
        if attempt.status is not AttemptStatus.running:
            raise StaleAttemptError(_stale_message(attempt))
        return attempt, now

    def _require_rollouts(self, ids: list[str]) -> None:
        missing = [i for i in ids if i not in self._rollouts]
        if missing:
            raise NotFoundError(f"rollouts not found: {', '.join(map(repr, missing[:10]))}")


def _stale_message(attempt: Attempt) -> str:
    return (
        f"attempt {attempt.attempt_id!r} (try {attempt.attempt_no} of rollout {attempt.rollout_id!r}) "
        f"is {attempt.status.value}, no longer the rollout's running attempt; its report was not counted"
    )


def _page(matches: list[M], offset: int, limit: int) -> Page[M]:
    return rules.make_page([_copy(m) for m in matches[offset : offset + limit]], len(matches), offset)
