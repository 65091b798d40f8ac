"""Spans as the SQL store keeps them: the columns queries filter on, plus the span as JSON text.

Validating a span batch with pydantic builds every token id and logprob as a Python object, and
storing it serialises them all again: about three quarters of the store server's time per LLM span.
`parse_span_batch` is the fast path for the shape clients actually send (the one `Span` dumps):
orjson parses the batch, the top-level fields are checked by hand against the same bounds as
`reinforge.types.Span`, and `attributes` pass through untouched to orjson's serialiser. Anything
outside that shape (a string where a number goes, an unknown key, a huge integer) returns `None`,
and the caller validates with pydantic, so bad input gets exactly the errors it always got.
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

import orjson

from reinforge.types import MAX_STORED_INT, Span, SpanKind, SpanStatusCode

_SPAN_ID = re.compile(r"[0-9a-f]{16}")
_TRACE_ID = re.compile(r"[0-9a-f]{32}")
_KINDS = frozenset(k.value for k in SpanKind)
_STATUS_CODES = frozenset(c.value for c in SpanStatusCode)
_SPAN_KEYS = frozenset(Span.model_fields)
_STATUS_KEYS = frozenset(("code", "message"))
_EVENT_KEYS = frozenset(("name", "timestamp", "attributes"))
_DIGITS_AS_NINES = bytes.maketrans(b"0123456789", b"9999999999")
_LONG_NUMBER = b"9" * 19
_UNSET_STATUS: dict[str, Any] = {"code": SpanStatusCode.unset.value, "message": None}


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
    if raw.translate(_DIGITS_AS_NINES).find(_LONG_NUMBER) >= 0:
        # orjson turns an integer beyond 64 bits into a float, pydantic keeps it exact. A run of
        # 19 digits may be one (floats print at most 17), so such a body takes pydantic's path.
        return None
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if type(doc) is not dict or len(doc) != 1:
        return None
    items = doc.get("spans")
    if type(items) is not list or len(items) > max_spans:
        return None
    records = []
    for item in items:
        record = _record(item)
        if record is None:
            return None
        records.append(record)
    return records


def _record(item: Any) -> SpanRecord | None:
    if type(item) is not dict or not _SPAN_KEYS.issuperset(item):
        return None
    rollout_id = _text(item.get("rollout_id"), 128)
    attempt_id = _text(item.get("attempt_id"), 128)
    name = _text(item.get("name"), 512)
    if rollout_id is None or attempt_id is None or name is None:
        return None
    span_id = item.get("span_id")
    if span_id is None and "span_id" not in item:
        span_id = uuid.uuid4().hex[:16]
    elif type(span_id) is not str or not _SPAN_ID.fullmatch(span_id):
        return None
    trace_id = item.get("trace_id")
    if trace_id is None and "trace_id" not in item:
        trace_id = uuid.uuid4().hex
    elif type(trace_id) is not str or not _TRACE_ID.fullmatch(trace_id):
        return None
    parent_id = item.get("parent_id")
    if parent_id is not None and (type(parent_id) is not str or not _SPAN_ID.fullmatch(parent_id)):
        return None
    kind = item.get("kind", SpanKind.internal.value)
    start_time = _number(item["start_time"]) if "start_time" in item else time.time()
    end_raw = item.get("end_time")
    end_time = None if end_raw is None else _number(end_raw)
    attributes = item.get("attributes", {})
    status = item.get("status", _UNSET_STATUS)
    events = item.get("events", [])
    sequence = item.get("sequence")
    if (
        type(kind) is not str
        or kind not in _KINDS
        or start_time is None
        or (end_raw is not None and end_time is None)
        or type(attributes) is not dict
        or not _status_ok(status)
        or type(events) is not list
        or not all(_event_ok(e) for e in events)
        or (sequence is not None and (type(sequence) is not int or abs(sequence) > MAX_STORED_INT))
    ):
        return None
    body = orjson.dumps(
        {
            "span_id": span_id,
            "trace_id": trace_id,
            "parent_id": parent_id,
            "rollout_id": rollout_id,
            "attempt_id": attempt_id,
            "name": name,
            "kind": kind,
            "start_time": start_time,
            "end_time": end_time,
            "attributes": attributes,
            "status": {"code": status.get("code", _UNSET_STATUS["code"]), "message": status.get("message")},
            "events": [
                {"name": e["name"], "timestamp": float(e["timestamp"]), "attributes": e.get("attributes", {})}
                for e in events
            ],
        }
    ).decode()
    return SpanRecord(span_id, trace_id, rollout_id, attempt_id, name, body)


def _text(value: Any, max_length: int) -> str | None:
    # NUL is refused by the store with its own message; leave that to the validated path.
    if type(value) is not str or not 1 <= len(value) <= max_length or "\x00" in value:
        return None
    return value


def _number(value: Any) -> float | None:
    """A JSON number as pydantic's float field takes it (an int becomes a float; bool is not one)."""
    if type(value) is float:
        return value
    if type(value) is int and abs(value) <= 2**53:
        return float(value)
    return None


def _status_ok(status: Any) -> bool:
    if type(status) is not dict or not _STATUS_KEYS.issuperset(status):
        return False
    code = status.get("code", SpanStatusCode.unset.value)
    message = status.get("message")
    return type(code) is str and code in _STATUS_CODES and (message is None or type(message) is str)


def _event_ok(event: Any) -> bool:
    return (
        type(event) is dict
        and _EVENT_KEYS.issuperset(event)
        and type(event.get("name")) is str
        and _number(event.get("timestamp")) is not None
        and type(event.get("attributes", {})) is dict
    )
