"""Pydantic TypeAdapters for the store's HTTP bodies, built once and shared by server and client."""

from __future__ import annotations

from pydantic import TypeAdapter

from reinforge.store.http.wire import AddSpansResponse
from reinforge.types import Attempt, LeasedRollout, Page, ResourcesVersion, Rollout, Span, StoreCounters

ROLLOUT = TypeAdapter(Rollout)
ROLLOUTS = TypeAdapter(list[Rollout])
ATTEMPT = TypeAdapter(Attempt)
LEASED = TypeAdapter(list[LeasedRollout])
ROLLOUT_PAGE = TypeAdapter(Page[Rollout])
ATTEMPT_PAGE = TypeAdapter(Page[Attempt])
SPAN_PAGE = TypeAdapter(Page[Span])
RESOURCES = TypeAdapter(ResourcesVersion)
COUNTERS = TypeAdapter(StoreCounters)
ADDED = TypeAdapter(AddSpansResponse)
