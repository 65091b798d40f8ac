"""The store rules every backend shares: argument checks, the retry policy, paging.

Keeping them in one place is what lets the memory and SQL backends (and, through the server, the
HTTP client) pass one conformance suite without drifting apart.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeVar

from reinforge.errors import InvalidRequestError
from reinforge.types import AttemptOutcome, AttemptStatus, Page, RolloutMode, RolloutStatus

T = TypeVar("T")

MAX_LEASE_BATCH = 1000
"""The most rollouts one lease call may ask for."""
MAX_WAIT_SECONDS = 3600.0
"""Longer waits are almost certainly a unit mistake (milliseconds given as seconds)."""
RECHECK_SECONDS = 1.0
"""SQL waits also re-check this often, so a lost cross-process wake-up costs at most this delay."""


def check_lease_args(
    runner_id: str, max_rollouts: int, lease_seconds: float, wait_seconds: float, mode: RolloutMode | None
) -> None:
    if not isinstance(runner_id, str) or not runner_id or len(runner_id) > 256:
        raise InvalidRequestError("runner_id must be a non-empty string of at most 256 characters")
    if not 1 <= max_rollouts <= MAX_LEASE_BATCH:
        raise InvalidRequestError(f"max_rollouts must be between 1 and {MAX_LEASE_BATCH}, got {max_rollouts}")
    check_lease_seconds(lease_seconds)
    check_wait_seconds(wait_seconds)
    if mode is not None and not isinstance(mode, RolloutMode):
        raise InvalidRequestError(f"mode must be one of {[m.value for m in RolloutMode]}, got {mode!r}")


def check_lease_seconds(lease_seconds: float) -> None:
    if not math.isfinite(lease_seconds) or lease_seconds <= 0:
        raise InvalidRequestError(f"lease_seconds must be a positive number, got {lease_seconds}")


def check_wait_seconds(seconds: float, name: str = "wait_seconds") -> None:
    if not math.isfinite(seconds) or not 0 <= seconds <= MAX_WAIT_SECONDS:
        raise InvalidRequestError(f"{name} must be between 0 and {MAX_WAIT_SECONDS}, got {seconds}")


def check_outcome(outcome: AttemptOutcome) -> None:
    if outcome.reward is not None and not math.isfinite(outcome.reward):
        raise InvalidRequestError(f"reward must be a finite number, got {outcome.reward}")


def check_ids(ids: Sequence[str], name: str) -> list[str]:
    """Unique ids in the order given; a bare string is refused (it would iterate per character)."""
    if isinstance(ids, str):
        raise InvalidRequestError(f"{name} must be a list of ids, not a string")
    out = list(dict.fromkeys(ids))
    for i in out:
        if not isinstance(i, str) or not i:
            raise InvalidRequestError(f"{name} must hold non-empty strings, got {i!r}")
    return out


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
