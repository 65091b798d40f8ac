"""The data model shared by every layer: tasks, rollouts, attempts, spans, resources.

These pydantic models are the boundary types: the store persists them, the HTTP server and client
exchange them as JSON, and the trainer reads them back. Timestamps are float seconds since the epoch.
"""

from __future__ import annotations

import itertools
import os
import time
import uuid
from enum import Enum
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

T = TypeVar("T")

MAX_PAGE_SIZE = 1000
"""The most items one query returns; larger limits are rejected, not truncated silently."""

MAX_STORED_INT = 2**63 - 1
"""The largest integer a column can hold (SQL BIGINT); larger ids and offsets are bad input."""


NO_NUL = r"^[^\x00]*$"
"""Ids and names are looked up by equality in every backend, and PostgreSQL text can't hold NUL:
the published schema says so, so that a client generated from it never sends one."""
_NO_NUL_DOC: dict[str, Any] = {"pattern": NO_NUL}
"""The same, in the schema only, where the store refuses NUL itself with a clearer message
(`store.rules.check_text`)."""


def _integral(value: object) -> object:
    """JSON Schema's integer is any number without a fraction, `3.0` included (Python's `json`
    writes integral floats that way); anything else, booleans and strings too, is left for the
    strict int check to refuse."""
    if type(value) is float and value.is_integer():
        return int(value)
    return value


INTEGRAL = BeforeValidator(_integral)
JsonInt = Annotated[int, INTEGRAL]
"""An integer field read as JSON Schema reads one: `3` and `3.0` pass, `true` and `"3"` don't (with
`strict=True` on the field). Optional ones spell it `Annotated[int, Field(...), INTEGRAL] | None`,
the bounds inside: pydantic would otherwise write them into the JSON schema as `ge`/`le`."""


def new_id() -> str:
    """A random 32-hex-character id (the same shape as an OpenTelemetry trace id)."""
    return uuid.uuid4().hex


def new_ordered_id() -> str:
    """A 32-hex-character id that sorts by creation time: 48 bits of milliseconds since the epoch,
    then 80 random bits (UUIDv7's layout, without the version bits).

    The store keys rollouts, attempts and traces by these ids. Random ids insert at random places in
    every index over them, so each span batch dirties one index page per span per index, and each
    dirty page is a page written to SQLite's WAL; ids made at about the same time land next to each
    other instead, so a commit writes fewer bytes for less CPU (docs/store.md). 80 random bits keep
    ids made in one millisecond as unlikely to collide as random ones. Not for prefixes that must
    differ (the leading characters are the time).
    """
    return f"{time.time_ns() // 1_000_000 & 0xFFFF_FFFF_FFFF:012x}{os.urandom(10).hex()}"


class CountingIds:
    """Hex ids of `nbytes` bytes as a counter from a random start, one counter per process.

    For span ids (64 bits: too few to split into a time and enough randomness for ids from many
    processes not to collide) and the gateway's response ids (which need only be unique, and would
    otherwise cost a getrandom syscall per call). Consecutive ids from one process are adjacent
    (their index entries go to the same few pages, as with `new_ordered_id`), and two processes
    collide only if their ranges of ids overlap: about as unlikely as two random ids being equal,
    per id used. A forked child starts a range of its own, so parent and child never hand out the
    same ids. Not for anything that must be unguessable.
    """

    def __init__(self, nbytes: int) -> None:
        self._nbytes = nbytes
        self._mask = (1 << (8 * nbytes)) - 1
        self._format = f"0{2 * nbytes}x"
        self._reseed()
        os.register_at_fork(after_in_child=self._reseed)

    def _reseed(self) -> None:
        self._counter = itertools.count(int.from_bytes(os.urandom(self._nbytes), "big"))

    def __call__(self) -> str:
        # `next` on itertools.count is atomic under the GIL: threads never share an id.
        while True:
            value = next(self._counter) & self._mask
            if value:  # all zeros is OpenTelemetry's invalid span id
                return format(value, self._format)


new_span_id = CountingIds(8)
"""A 16-hex-character span id; see `CountingIds`."""


def now() -> float:
    return time.time()


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", use_enum_values=False)


class RolloutStatus(str, Enum):
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"

    @property
    def is_final(self) -> bool:
        return self in (RolloutStatus.succeeded, RolloutStatus.failed, RolloutStatus.cancelled)


class RolloutMode(str, Enum):
    train = "train"
    val = "val"


class AttemptStatus(str, Enum):
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    timeout = "timeout"
    """The lease expired without a heartbeat; the attempt is superseded."""
    cancelled = "cancelled"


class RolloutSpec(_Model):
    """What a caller gives to enqueue one rollout. Giving `rollout_id` makes enqueueing idempotent."""

    rollout_id: str | None = Field(default=None, min_length=1, max_length=128, json_schema_extra=_NO_NUL_DOC)
    task: dict[str, Any] = Field(default_factory=dict, description="The dataset item, as JSON.")
    task_id: str | None = Field(default=None, max_length=128, json_schema_extra=_NO_NUL_DOC)
    mode: RolloutMode = RolloutMode.train
    group_id: str | None = Field(default=None, max_length=128, json_schema_extra=_NO_NUL_DOC)
    resources_version: Annotated[int, Field(ge=0, le=MAX_STORED_INT, strict=True), INTEGRAL] | None = None
    max_attempts: JsonInt = Field(default=3, ge=1, le=100, strict=True)
    metadata: dict[str, Any] = Field(default_factory=dict)


class Rollout(_Model):
    """One run of the agent on a task; it may take several attempts."""

    rollout_id: str
    task: dict[str, Any] = Field(default_factory=dict)
    task_id: str | None = None
    mode: RolloutMode = RolloutMode.train
    group_id: str | None = None
    resources_version: int | None = None
    status: RolloutStatus = RolloutStatus.queued
    max_attempts: int = 3
    attempt_count: int = 0
    reward: float | None = None
    error: str | None = None
    created_at: float = Field(default_factory=now)
    updated_at: float = Field(default_factory=now)
    finished_at: float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class Attempt(_Model):
    """One try of a rollout by one runner, held by a lease that heartbeats extend."""

    attempt_id: str
    rollout_id: str
    attempt_no: int = Field(ge=1, description="1 for the first try of the rollout, 2 for the retry, ...")
    runner_id: str
    status: AttemptStatus = AttemptStatus.running
    started_at: float = Field(default_factory=now)
    lease_deadline: float
    last_heartbeat: float = Field(default_factory=now)
    finished_at: float | None = None
    reward: float | None = None
    error: str | None = None


class LeasedRollout(_Model):
    """What a runner receives from a lease: the rollout and the attempt it now owns."""

    rollout: Rollout
    attempt: Attempt


class AttemptOutcome(_Model):
    """How a runner reports the end of an attempt."""

    status: Literal[AttemptStatus.succeeded, AttemptStatus.failed, AttemptStatus.cancelled]
    reward: float | None = Field(default=None, strict=True)  # `true` is not a reward
    error: str | None = Field(default=None, max_length=65536)
    retryable: bool = Field(
        default=True,
        strict=True,  # `0` is not a yes or no
        description="A failed attempt is retried (up to max_attempts) only when retryable.",
    )


class SpanKind(str, Enum):
    """The OpenTelemetry span kinds."""

    internal = "internal"
    server = "server"
    client = "client"
    producer = "producer"
    consumer = "consumer"


class SpanStatusCode(str, Enum):
    unset = "unset"
    ok = "ok"
    error = "error"


class SpanStatus(_Model):
    code: SpanStatusCode = SpanStatusCode.unset
    message: str | None = None


class SpanEvent(_Model):
    name: str
    timestamp: float = Field(strict=True)
    attributes: dict[str, Any] = Field(default_factory=dict)


class Span(_Model):
    """One traced operation inside an attempt, shaped like an OpenTelemetry span.

    `attributes` may hold JSON values (lists of token ids, nested request bodies); the keys that
    reinforge itself reads are listed in `reinforge.semconv`.
    """

    span_id: str = Field(default_factory=new_span_id, pattern=r"^[0-9a-f]{16}$")
    trace_id: str = Field(default_factory=new_ordered_id, pattern=r"^[0-9a-f]{32}$")
    parent_id: str | None = Field(default=None, pattern=r"^[0-9a-f]{16}$")
    rollout_id: str = Field(min_length=1, max_length=128, json_schema_extra=_NO_NUL_DOC)
    attempt_id: str = Field(min_length=1, max_length=128, json_schema_extra=_NO_NUL_DOC)
    name: str = Field(min_length=1, max_length=512, json_schema_extra=_NO_NUL_DOC)
    kind: SpanKind = SpanKind.internal
    start_time: float = Field(default_factory=now, strict=True)
    end_time: float | None = Field(default=None, strict=True)
    attributes: dict[str, Any] = Field(default_factory=dict)
    status: SpanStatus = Field(default_factory=SpanStatus)
    events: list[SpanEvent] = Field(default_factory=list)
    sequence: Annotated[int, Field(ge=0, strict=True), INTEGRAL] | None = Field(
        default=None, description="Order of arrival within the store, assigned by the store on insert."
    )


class ResourcesVersion(_Model):
    """A numbered, immutable set of resources an agent is given (LLM endpoint, prompt templates...)."""

    version: int = Field(ge=0)
    resources: dict[str, Any] = Field(default_factory=dict)
    created_at: float = Field(default_factory=now)


class Reward(_Model):
    """A reward value, final (the attempt's outcome) or intermediate (emitted during the run)."""

    value: float
    name: str | None = None


class Page(_Model, Generic[T]):
    """One page of a query; `next_offset` is None on the last page."""

    items: list[T]
    total: int
    next_offset: int | None = None


class _Query(_Model):
    # Strict: pydantic's lax mode reads `true` as 1, and a boolean page offset is bad input.
    limit: JsonInt = Field(default=100, ge=1, le=MAX_PAGE_SIZE, strict=True)
    offset: JsonInt = Field(default=0, ge=0, le=MAX_STORED_INT, strict=True)


Filter = Annotated[str, Field(pattern=NO_NUL)]
"""A text filter: compared by equality, so it holds what a stored id or name can hold."""


class RolloutQuery(_Query):
    rollout_ids: list[Filter] | None = None
    statuses: list[RolloutStatus] | None = None
    mode: RolloutMode | None = None
    group_id: Filter | None = None
    task_id: Filter | None = None


class AttemptQuery(_Query):
    rollout_id: Filter | None = None
    runner_id: Filter | None = None
    statuses: list[AttemptStatus] | None = None


class SpanQuery(_Query):
    rollout_id: Filter | None = None
    rollout_ids: list[Filter] | None = Field(default=None, max_length=MAX_PAGE_SIZE)
    """Spans of any of these rollouts (with `rollout_id` too, of both): one read for a batch."""
    attempt_id: Filter | None = None
    name: Filter | None = Field(default=None, min_length=1)
    trace_id: Filter | None = None

    @field_validator("name")
    @classmethod
    def _non_empty(cls, v: str | None) -> str | None:
        if v is not None and not v:
            raise ValueError("name filter must not be empty")
        return v


class StoreCounters(_Model):
    """Numbers for `reinforge store status` and the dashboard."""

    rollouts_by_status: dict[RolloutStatus, int] = Field(default_factory=dict)
    attempts_by_status: dict[AttemptStatus, int] = Field(default_factory=dict)
    spans: int = 0
    resources_versions: int = 0
    latest_resources_version: int | None = None


class Transition(_Model):
    """One training sample: an LLM call (or several merged along exact token prefixes) with its credit.

    `response_ids` are the tokens the policy is trained on; positions with `response_mask` 0 (tool
    results and observations inside a merged trajectory) are context only. `behaviour_logprobs` are
    the gateway's recorded logprobs, aligned with `response_ids` (0.0 where the mask is 0).
    """

    rollout_id: str
    attempt_id: str
    group_id: str | None = None
    task_id: str | None = None
    agent_name: str | None = None
    index: int = Field(default=0, ge=0, description="Position of this transition in its trajectory.")
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    behaviour_logprobs: list[float]
    policy_version: int = 0
    reward: float = 0.0
    """The credit assigned to this transition."""
    final_reward: float = 0.0
    """The rollout's final reward, whatever credit assignment gave this transition."""
    reward_sources: dict[str, float] = Field(default_factory=dict)
    """How much of `reward` came from each credit source ('equal', 'discounted', 'emitted', 'air')."""
    advantage: float | None = None
    """Filled in by the algorithm's advantage estimator."""
    num_calls: int = Field(default=1, ge=1, description="How many LLM calls were merged into it.")
