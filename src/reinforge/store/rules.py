"""The store rules every backend shares: argument checks, a lease's new attempt, the retry policy,
paging.

Keeping them in one place is what lets the memory and SQL backends (and, through the server, the
HTTP client) pass one conformance suite without drifting apart.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeVar

from reinforge.errors import ConflictError, InvalidRequestError
from reinforge.types import (
    MAX_STORED_INT,
    Attempt,
    AttemptOutcome,
    AttemptStatus,
    Page,
    Rollout,
    RolloutMode,
    RolloutSpec,
    RolloutStatus,
    Span,
    new_ordered_id,
)

T = TypeVar("T")

MAX_LEASE_BATCH = 1000
"""The most rollouts one lease call may ask for."""
MAX_WAIT_SECONDS = 3600.0
"""Longer waits are almost certainly a unit mistake (milliseconds given as seconds)."""
MAX_LEASE_SECONDS = 7 * 86400.0
RECHECK_SECONDS = 1.0
"""SQL waits also re-check this often, so a lost cross-process wake-up costs at most this delay."""


def check_lease_args(
    runner_id: str,
    max_rollouts: int,
    lease_seconds: float,
    wait_seconds: float,
    mode: RolloutMode | str | None,
) -> RolloutMode | None:
    """Refuse bad lease arguments; returns the mode as a RolloutMode (a plain "val" is accepted)."""
    if not isinstance(runner_id, str) or not runner_id or len(runner_id) > 256 or "\x00" in runner_id:
        raise InvalidRequestError(
            "runner_id must be a non-empty string of at most 256 characters, without NUL"
        )
    if not 1 <= max_rollouts <= MAX_LEASE_BATCH:
        raise InvalidRequestError(f"max_rollouts must be between 1 and {MAX_LEASE_BATCH}, got {max_rollouts}")
    check_lease_seconds(lease_seconds)
    check_wait_seconds(wait_seconds)
    if mode is None:
        return None
    try:
        return RolloutMode(mode)
    except ValueError:
        raise InvalidRequestError(
            f"mode must be one of {[m.value for m in RolloutMode]}, got {mode!r}"
        ) from None


def check_lease_seconds(lease_seconds: float) -> None:
    if not math.isfinite(lease_seconds) or not 0 < lease_seconds <= MAX_LEASE_SECONDS:
        raise InvalidRequestError(
            f"lease_seconds must be above 0 and at most {MAX_LEASE_SECONDS:.0f} (heartbeat to hold a "
            f"lease longer), got {lease_seconds}"
        )


def check_version(version: int | None, name: str) -> None:
    if version is not None and (isinstance(version, bool) or not isinstance(version, int)):
        raise InvalidRequestError(f"{name} must be an integer, got {version!r}")
    if version is not None and not 0 <= version <= MAX_STORED_INT:
        raise InvalidRequestError(f"{name} must be between 0 and {MAX_STORED_INT}, got {version}")


def next_version(latest: int | None) -> int:
    """The number an auto-numbered resources version gets after `latest` (None: no version yet)."""
    if latest is None:
        return 0
    if latest >= MAX_STORED_INT:
        raise ConflictError(
            f"resources version {latest} is the largest a store can hold, so there is no next one; "
            "put the new resources under an explicit, unused version"
        )
    return latest + 1


def check_wait_seconds(seconds: float, name: str = "wait_seconds") -> None:
    if not math.isfinite(seconds) or not 0 <= seconds <= MAX_WAIT_SECONDS:
        raise InvalidRequestError(f"{name} must be between 0 and {MAX_WAIT_SECONDS}, got {seconds}")


def check_outcome(outcome: AttemptOutcome) -> AttemptOutcome:
    """The outcome to store: a finite reward, and an error text that every database can hold."""
    if outcome.reward is not None and not math.isfinite(outcome.reward):
        raise InvalidRequestError(f"reward must be a finite number, got {outcome.reward}")
    if outcome.error is not None and "\x00" in outcome.error:
        # Error texts often quote raw process output; PostgreSQL text can't hold NUL.
        return outcome.model_copy(update={"error": outcome.error.replace("\x00", "\ufffd")})
    return outcome


def check_spec(spec: RolloutSpec) -> None:
    check_version(spec.resources_version, "resources_version")
    for name in ("rollout_id", "task_id", "group_id"):
        check_text(getattr(spec, name), name)


def check_span(span: Span) -> None:
    check_text(span.rollout_id, "rollout_id")
    check_text(span.attempt_id, "attempt_id")
    check_text(span.name, "name")


def check_text(value: str | None, name: str) -> None:
    """Ids and names are looked up by equality in every backend, so they can't hold NUL."""
    if value is not None and "\x00" in value:
        raise InvalidRequestError(f"{name} must not contain NUL characters")


def check_ids(ids: Sequence[str], name: str) -> list[str]:
    """Unique ids in the order given; a bare string is refused (it would iterate per character)."""
    if isinstance(ids, str):
        raise InvalidRequestError(f"{name} must be a list of ids, not a string")
    out = list(dict.fromkeys(ids))
    for i in out:
        if not isinstance(i, str) or not i:
            raise InvalidRequestError(f"{name} must hold non-empty strings, got {i!r}")
    return out


def start_attempt(rollout: Rollout, runner_id: str, now: float, deadline: float) -> Attempt:
    """Mark a just-leased rollout running (in place) and make its new attempt."""
    rollout.attempt_count += 1
    rollout.status = RolloutStatus.running
    rollout.updated_at = now
    return Attempt(
        attempt_id=new_ordered_id(),
        rollout_id=rollout.rollout_id,
        attempt_no=rollout.attempt_count,
        runner_id=runner_id,
        started_at=now,
        lease_deadline=deadline,
        last_heartbeat=now,
    )


def after_finish(outcome: AttemptOutcome, attempt_count: int, max_attempts: int) -> RolloutStatus:
    """The retry policy: where a rollout goes when its current attempt ends with `outcome`."""
    if outcome.status is AttemptStatus.succeeded:
        return RolloutStatus.succeeded
    if outcome.status is AttemptStatus.cancelled:
        return RolloutStatus.cancelled
    if outcome.retryable and attempt_count < max_attempts:
        return RolloutStatus.queued
    return RolloutStatus.failed


def after_expiry(attempt_count: int, max_attempts: int) -> RolloutStatus:
    """A lease that ran out counts as a failed, retryable attempt."""
    return RolloutStatus.queued if attempt_count < max_attempts else RolloutStatus.failed


def expiry_error(attempt_no: int, runner_id: str) -> str:
    return f"attempt {attempt_no} timed out: runner {runner_id!r} stopped heartbeating before its lease ended"


def make_page(items: list[T], total: int, offset: int) -> Page[T]:
    end = offset + len(items)
    return Page(items=items, total=total, next_offset=end if end < total else None)
