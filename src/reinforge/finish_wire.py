"""The body of the gateway's finish route, shared by the gateway that serves it and the runner that
calls it (runners batch their finishes up to `MAX_FINISH_BATCH`, the most one request may carry).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from reinforge.types import AttemptOutcome, Span

MAX_FINISH_SPANS = 10_000


class FinishBody(BaseModel):
    """What a runner sends to end an attempt: its outcome, plus the attempt's spans it still holds."""

    model_config = ConfigDict(extra="forbid", strict=True)  # the types the gateway's schema states

    outcome: AttemptOutcome
    spans: list[Span] = Field(default_factory=list, max_length=MAX_FINISH_SPANS)

    @field_validator("spans")
    @classmethod
    def _no_nul(cls, spans: list[Span]) -> list[Span]:
        """The store refuses NUL in ids and names (its schema says so); a batch finish answers per
        item, so the whole request is refused here instead, as the gateway's schema says."""
        for i, span in enumerate(spans):
            for name in ("rollout_id", "attempt_id", "name"):
                if "\x00" in getattr(span, name):
                    raise ValueError(f"spans.{i}.{name} must not contain NUL characters")
        return spans


MAX_FINISH_BATCH = 1024
"""Attempts one `POST /finish` may end."""


class FinishItem(FinishBody):
    """One attempt of a batched finish, with the runner's finish token for it."""

    attempt_id: str = Field(min_length=1, max_length=128)
    token: str


class FinishManyBody(BaseModel):
    """`POST /finish`: several attempts ended in one request (a runner's finishes that queued up
    while its previous request was in flight)."""

    model_config = ConfigDict(extra="forbid", strict=True)  # the types the gateway's schema states

    items: list[FinishItem] = Field(min_length=1, max_length=MAX_FINISH_BATCH)
