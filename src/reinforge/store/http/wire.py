"""Request and response bodies of the store's HTTP API, shared by the server and the client.

Every bound here is what keeps a bad request a 4xx: a lease of a billion seconds or a wait of a day
is refused at the boundary instead of overflowing a timestamp or pinning a connection.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from reinforge.types import (
    INTEGRAL,
    MAX_PAGE_SIZE,
    MAX_STORED_INT,
    NO_NUL,
    JsonInt,
    RolloutMode,
    RolloutSpec,
    Span,
)

MAX_WAIT_SECONDS = 60.0
"""The longest one HTTP call may wait; the client splits longer waits into several calls."""
MAX_LEASE_SECONDS = 7 * 24 * 3600.0
"""A lease longer than a week is a mistake, not a plan."""
MAX_BATCH = 100_000
"""The most rollouts, spans or ids one call may carry (the body-size limit usually bites first)."""


RolloutId = Annotated[str, Field(min_length=1, max_length=128, pattern=NO_NUL)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EnqueueRequest(_Body):
    specs: list[RolloutSpec] = Field(max_length=MAX_BATCH)


class LeaseRequest(_Body):
    runner_id: str = Field(min_length=1, max_length=128, pattern=NO_NUL)
    max_rollouts: JsonInt = Field(default=1, ge=1, le=MAX_PAGE_SIZE, strict=True)
    lease_seconds: float = Field(default=60.0, gt=0, le=MAX_LEASE_SECONDS, strict=True)
    wait_seconds: float = Field(default=0.0, ge=0, le=MAX_WAIT_SECONDS, strict=True)
    mode: RolloutMode | None = None


class HeartbeatRequest(_Body):
    lease_seconds: float = Field(default=60.0, gt=0, le=MAX_LEASE_SECONDS, strict=True)


class RolloutIdsRequest(_Body):
    rollout_ids: list[RolloutId] = Field(max_length=MAX_BATCH)


class WaitRequest(_Body):
    rollout_ids: list[RolloutId] = Field(max_length=MAX_BATCH)
    timeout_seconds: float = Field(default=MAX_WAIT_SECONDS, ge=0, le=MAX_WAIT_SECONDS, strict=True)


class AddSpansRequest(_Body):
    spans: list[Span] = Field(max_length=MAX_BATCH)


class AddSpansResponse(_Body):
    added: int = Field(ge=0, description="How many of the spans were new (the rest were already stored).")


class PutResourcesRequest(_Body):
    resources: dict[str, Any] = Field(default_factory=dict)
    version: Annotated[int, Field(ge=0, le=MAX_STORED_INT, strict=True), INTEGRAL] | None = None


class ErrorDetail(_Body):
    type: str = Field(description="The reinforge.errors class name, e.g. NotFoundError.")
    message: str


class ErrorBody(_Body):
    error: ErrorDetail


def error_responses(descriptions: dict[int, str]) -> dict[int | str, dict[str, Any]]:
    """A router's OpenAPI `responses`: each error status with its description and `ErrorBody`."""
    return {status: {"model": ErrorBody, "description": text} for status, text in descriptions.items()}


class Health(_Body):
    status: str = "ok"
