"""Checks that an attempt exists and is running, cheaply enough for every request.

Why a cache: the gateway's added-latency budget (docs/gateway.md) is smaller than a store round-trip
over HTTP, so a lookup per call would spend it. The HMAC token already proves the caller was handed
this attempt; the store is asked once per attempt and again only after `ttl_s`, and concurrent first
requests for one attempt share a single lookup. Final states are cached for good: they never change.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from reinforge.errors import NotFoundError
from reinforge.gateway.errors import GatewayHTTPError
from reinforge.gateway.history import TurnMemory
from reinforge.semconv import trace_id_for
from reinforge.store.protocol import Store
from reinforge.types import Attempt, AttemptStatus


@dataclass
class AttemptState:
    """What the gateway keeps per attempt between requests."""

    attempt_id: str
    rollout_id: str
    status: AttemptStatus
    checked_at: float
    trace_id: str
    next_sequence: int = 0
    admitted: int = 0
    """LLM calls and reward reports admitted for the attempt (`Gateway.max_calls_per_attempt`)."""
    refused: int = 0
    """Those refused because the attempt had used up its calls: it can't finish as succeeded."""
    extra: dict[str, object] = field(default_factory=dict)
    turns: TurnMemory = field(default_factory=TurnMemory)
    """The assistant turns this attempt was answered with (see `gateway.history`)."""
    final_report: tuple[float, float] | None = None
    """(when, value) of the latest final reward the agent reported to the gateway (`gateway.finishing`)."""

    def report_final_reward(self, at: float, value: float) -> None:
        """A final reward the agent reported at `at`; the latest one is kept (a tie: this one)."""
        if self.final_report is None or at >= self.final_report[0]:
            self.final_report = (at, value)

    def take_sequence(self) -> int:
        n = self.next_sequence
        self.next_sequence += 1
        return n


class AttemptGuard:
    """Answers "may this attempt call the gateway now?" from a short-lived cache of the store."""

    def __init__(self, store: Store, ttl_s: float = 2.0, max_entries: int = 100_000) -> None:
        self._store = store
        self.ttl_s = ttl_s
        self._max_entries = max_entries
        self._states: dict[str, AttemptState] = {}
        self._inflight: dict[str, asyncio.Future[AttemptState]] = {}
        self.lookups = 0

    def remember_running(self, attempts: Iterable[Attempt]) -> None:
        """Cache attempts a co-located runner has just leased (so running), sparing each one's first
        call the store lookup: in a trainer that lookup crossed to the store's busy event loop and
        held every rollout's first call back. Safe from another thread: it only adds new entries
        (one atomic dict store each) and never evicts; the entries expire after `ttl_s` as usual.
        """
        now = time.monotonic()
        for attempt in attempts:
            if attempt.status is AttemptStatus.running and attempt.attempt_id not in self._states:
                self._states[attempt.attempt_id] = AttemptState(
                    attempt_id=attempt.attempt_id,
                    rollout_id=attempt.rollout_id,
                    status=attempt.status,
                    checked_at=now,
                    trace_id=trace_id_for(attempt.attempt_id),
                )

    def cached(self, attempt_id: str) -> AttemptState | None:
        """What is remembered of the attempt, fresh or not (None when nothing is)."""
        return self._states.get(attempt_id)

    def forget(self, attempt_id: str) -> None:
        """Drop the cached state, so the next request reads the store (e.g. after a finish)."""
        self._states.pop(attempt_id, None)

    async def state(self, attempt_id: str) -> AttemptState:
        """The attempt's state, from the cache while fresh; NotFoundError for an unknown id."""
        state = self._states.get(attempt_id)
        if state is not None and (
            state.status is not AttemptStatus.running or time.monotonic() - state.checked_at < self.ttl_s
        ):
            return state
        pending = self._inflight.get(attempt_id)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[AttemptState] = asyncio.get_running_loop().create_future()
        self._inflight[attempt_id] = future
        try:
            attempt = await self._store.get_attempt(attempt_id)
            state = self._update(attempt)
            future.set_result(state)
            return state
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # mark retrieved: nobody else may be waiting
            raise
        finally:
            del self._inflight[attempt_id]

    async def require_running(self, attempt_id: str) -> AttemptState:
        """The state of a running attempt; 404 for an unknown one, 409 for one that has ended."""
        try:
            state = await self.state(attempt_id)
        except NotFoundError:
            raise GatewayHTTPError(404, f"unknown attempt {attempt_id!r}", code="attempt_not_found") from None
        if state.status is not AttemptStatus.running:
            raise GatewayHTTPError(
                409,
                f"attempt {attempt_id!r} is {state.status.value}, not running; calls for it are not accepted",
                code="attempt_not_running",
            )
        return state

    def _update(self, attempt: Attempt) -> AttemptState:
        now = time.monotonic()
        state = self._states.get(attempt.attempt_id)
        if state is None:
            if len(self._states) >= self._max_entries:
                self._evict(now)
            state = AttemptState(
                attempt_id=attempt.attempt_id,
                rollout_id=attempt.rollout_id,
                status=attempt.status,
                checked_at=now,
                trace_id=trace_id_for(attempt.attempt_id),
            )
            self._states[attempt.attempt_id] = state
        else:
            state.status = attempt.status
            state.checked_at = now
        self.lookups += 1
        return state

    def _evict(self, now: float) -> None:
        # Oldest-checked first: ended attempts and idle ones go before busy ones.
        by_age = sorted(self._states.values(), key=lambda s: s.checked_at)
        for state in by_age[: max(1, len(by_age) // 4)]:
            del self._states[state.attempt_id]
