"""Spans as the SQL store keeps them: the columns queries filter on, plus the span as JSON text.

Validating a span batch with pydantic builds every token id and logprob as a Python object, and
storing it serialises them all again: about three quarters of the store server's time per LLM span.
`parse_span_batch` is the fast path for the shape clients actually send (the one `Span` dumps):
msgspec checks the JSON and the top-level fields against the same bounds as `reinforge.types.Span`,
and keeps `attributes` as the raw JSON text it arrived in (never turned into Python objects), which
goes into the stored body verbatim. Anything outside that shape (a string where a number goes, an
unknown key, deep nesting, bytes that are not UTF-8) returns `None`, and the caller validates with
pydantic, so bad input gets exactly the errors it always got.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from typing import Annotated

import msgspec
from pydantic import TypeAdapter, ValidationError

from reinforge.types import Span, SpanEvent, SpanKind, SpanStatus, new_ordered_id, new_span_id

_SPAN_ID = re.compile(r"[0-9a-f]{16}")
_TRACE_ID = re.compile(r"[0-9a-f]{32}")
_KINDS = frozenset(k.value for k in SpanKind)
_MAX_OPENERS = 150
"""Brackets in one span's attributes above which nesting could pass pydantic's recursion limit
(200, counted from the stored body) on the way back out; such spans take pydantic's path."""
_UNSET_STATUS = b'{"code":"unset","message":null}'
_STATUS = TypeAdapter(SpanStatus)
_EVENTS = TypeAdapter(list[SpanEvent])


class _SpanIn(msgspec.Struct, forbid_unknown_fields=True):
    """A span as the wire carries it; a field absent from the body stays UNSET (its default
    comes from the model), a null where the model forbids one fails here."""

    rollout_id: str
    attempt_id: str
    name: str
    span_id: str | msgspec.UnsetType = msgspec.UNSET
    trace_id: str | msgspec.UnsetType = msgspec.UNSET
    parent_id: str | None = None
    kind: str = SpanKind.internal.value
    start_time: float | msgspec.UnsetType = msgspec.UNSET
    end_time: float | None = None
    attributes: msgspec.Raw = msgspec.Raw(b"{}")
    status: msgspec.Raw = msgspec.Raw(_UNSET_STATUS)
    events: msgspec.Raw = msgspec.Raw(b"[]")
    sequence: Annotated[int, msgspec.Meta(ge=0)] | None = None  # bounded as `Span.sequence` is


class _BatchIn(msgspec.Struct, forbid_unknown_fields=True):
    spans: list[_SpanIn]


_DECODE_BATCH = msgspec.json.Decoder(_BatchIn).decode
_ENCODE = msgspec.json.Encoder().encode


@dataclass(frozen=True, slots=True)
class SpanRecord:
    """One span ready to insert: `body` is the span's JSON without `sequence` (the store assigns it)."""

    span_id: str
    trace_id: str
    rollout_id: str
    attempt_id: str
    name: str
    body: str

    @classmethod
    def from_span(cls, span: Span) -> SpanRecord:
        """Raises pydantic_core.PydanticSerializationError when an attribute is not JSON."""
        body = span.__pydantic_serializer__.to_json(span, exclude={"sequence"}).decode()
        return cls(span.span_id, span.trace_id, span.rollout_id, span.attempt_id, span.name, body)


def parse_span_batch(raw: bytes, max_spans: int) -> list[SpanRecord] | None:
    """The `{"spans": [...]}` body as records, or `None` when it needs pydantic's full validation."""
    try:
        raw.decode("utf-8")  # msgspec passes invalid UTF-8 inside strings it only skips over
        batch = _DECODE_BATCH(raw)
    except (UnicodeDecodeError, msgspec.DecodeError):
        return None
    if len(batch.spans) > max_spans:
        return None
    records = []
    for item in batch.spans:
        record = _record(item)
        if record is None:
            return None
        records.append(record)
    return records


def _record(item: _SpanIn) -> SpanRecord | None:
    attributes = bytes(item.attributes)
    if (
        not _text_ok(item.rollout_id, 128)
        or not _text_ok(item.attempt_id, 128)
        or not _text_ok(item.name, 512)
        or item.kind not in _KINDS
        or attributes[:1] != b"{"
        or attributes.count(b"{") + attributes.count(b"[") > _MAX_OPENERS
    ):
        return None
    span_id = new_span_id() if item.span_id is msgspec.UNSET else item.span_id
    trace_id = new_ordered_id() if item.trace_id is msgspec.UNSET else item.trace_id
    start_time = time.time() if item.start_time is msgspec.UNSET else item.start_time
    if (
        not _SPAN_ID.fullmatch(span_id)
        or not _TRACE_ID.fullmatch(trace_id)
        or (item.parent_id is not None and not _SPAN_ID.fullmatch(item.parent_id))
        or not math.isfinite(start_time)
        or (item.end_time is not None and not math.isfinite(item.end_time))
    ):
        return None
    status = bytes(item.status)
    events = bytes(item.events)
    try:
        # Both are small and usually the defaults; when not, pydantic decides what they hold.
        if status != _UNSET_STATUS:
            status = _STATUS.dump_json(_STATUS.validate_json(status))
        if events != b"[]":
            events = _EVENTS.dump_json(_EVENTS.validate_json(events))
    except ValidationError:
        return None
    head = _ENCODE(
        {
            "span_id": span_id,
            "trace_id": trace_id,
            "parent_id": item.parent_id,
            "rollout_id": item.rollout_id,
            "attempt_id": item.attempt_id,
            "name": item.name,
            "kind": item.kind,
            "start_time": start_time,
            "end_time": item.end_time,
        }
    )
    # The span's JSON without `sequence`: the checked head, then attributes exactly as they came.
    body = b"".join(
        (head[:-1], b',"attributes":', attributes, b',"status":', status, b',"events":', events, b"}")
    )
    return SpanRecord(span_id, trace_id, item.rollout_id, item.attempt_id, item.name, body.decode())


def _text_ok(value: str, max_length: int) -> bool:
    # NUL is refused by the store with its own message; leave that to the validated path.
    return 1 <= len(value) <= max_length and "\x00" not in value
