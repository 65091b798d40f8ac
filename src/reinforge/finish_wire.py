"""The body of the gateway's finish route, shared by the gateway that serves it and the runner that
calls it (runners batch their finishes up to `MAX_FINISH_BATCH`, the most one request may carry).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from reinforge.types import AttemptOutcome, Span

MAX_FINISH_SPANS = 10_000


class FinishBody(BaseModel):
    """What a runner sends to end an attempt: its outcome, plus the attempt's spans it still holds."""

    model_config = ConfigDict(extra="forbid")

    outcome: AttemptOutcome
    spans: list[Span] = Field(default_factory=list, max_length=MAX_FINISH_SPANS)


MAX_FINISH_BATCH = 1024
"""Attempts one `POST /finish` may end."""


class FinishItem(FinishBody):
    """One attempt of a batched finish, with the runner's finish token for it."""

    attempt_id: str = Field(min_length=1, max_length=128)
    token: str


class FinishManyBody(BaseModel):
    """`POST /finish`: several attempts ended in one request (a runner's finishes that queued up
    while its previous request was in flight)."""

    model_config = ConfigDict(extra="forbid")

    items: list[FinishItem] = Field(min_length=1, max_length=MAX_FINISH_BATCH)
