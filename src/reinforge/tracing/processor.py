"""Turn OpenTelemetry spans into reinforge spans and hand them to their attempt's writer.

A span belongs to the attempt that was current when it *started* (it may end on another thread or
after the scope was left). Spans started outside any attempt are not exported: they have no rollout
to belong to.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace import Span as OtelSpan
from opentelemetry.trace import SpanKind as OtelSpanKind
from opentelemetry.trace import StatusCode

from reinforge.semconv import ATTR_SEQUENCE_IN_ATTEMPT
from reinforge.tracing.context import AttemptContext, current_attempt
from reinforge.types import Span, SpanEvent, SpanKind, SpanStatus, SpanStatusCode

log = logging.getLogger(__name__)

ATTR_JSON_KEYS = "reinforge.internal.json_keys"
"""OpenTelemetry attributes hold only scalars and flat lists; richer values travel as JSON text and
this attribute lists their keys, so the conversion restores them."""

_KINDS = {
    OtelSpanKind.INTERNAL: SpanKind.internal,
    OtelSpanKind.SERVER: SpanKind.server,
    OtelSpanKind.CLIENT: SpanKind.client,
    OtelSpanKind.PRODUCER: SpanKind.producer,
    OtelSpanKind.CONSUMER: SpanKind.consumer,
}
_STATUS = {
    StatusCode.UNSET: SpanStatusCode.unset,
    StatusCode.OK: SpanStatusCode.ok,
    StatusCode.ERROR: SpanStatusCode.error,
}


def _is_otel_value(value: Any) -> bool:
    scalar = (str, bool, int, float)
    if isinstance(value, scalar):
        return True
    if isinstance(value, list | tuple) and value:
        first = type(value[0])
        return first in scalar and all(type(v) is first for v in value)
    return False


def encode_attributes(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """Make any JSON-able attributes acceptable to OpenTelemetry (see ATTR_JSON_KEYS)."""
    out: dict[str, Any] = {}
    json_keys: list[str] = []
    for key, value in attrs.items():
        if _is_otel_value(value):
            out[key] = value
        else:
            out[key] = json.dumps(value, default=str)
            json_keys.append(key)
    if json_keys:
        out[ATTR_JSON_KEYS] = json_keys
    return out


def decode_attributes(attrs: Mapping[str, Any] | None) -> dict[str, Any]:
    out = dict(attrs or {})
    json_keys = out.pop(ATTR_JSON_KEYS, ())
    for key, value in out.items():
        if isinstance(value, tuple):
            out[key] = list(value)
    for key in json_keys:
        if isinstance(out.get(key), str):
            with contextlib.suppress(ValueError):
                out[key] = json.loads(out[key])
    return out


def _seconds(ns: int | None) -> float | None:
    return None if ns is None else ns / 1e9


def to_reinforge_span(span: ReadableSpan, rollout_id: str, attempt_id: str) -> Span:
    """One finished OpenTelemetry span as a reinforge span of the given attempt."""
    ctx = span.get_span_context()
    assert ctx is not None, "SDK spans always carry a span context"
    status = span.status
    return Span(
        span_id=format(ctx.span_id, "016x"),
        trace_id=format(ctx.trace_id, "032x"),
        parent_id=format(span.parent.span_id, "016x") if span.parent is not None else None,
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        name=span.name,
        kind=_KINDS.get(span.kind, SpanKind.internal),
        start_time=_seconds(span.start_time) or 0.0,
        end_time=_seconds(span.end_time),
        attributes=decode_attributes(span.attributes),
        status=SpanStatus(code=_STATUS[status.status_code], message=status.description),
        events=[
            SpanEvent(name=e.name, timestamp=e.timestamp / 1e9, attributes=decode_attributes(e.attributes))
            for e in span.events
        ],
    )


SpanTranslator = Callable[[Span], Span]
"""Rewrites a converted span before it is stored (a framework's telemetry into reinforge steps)."""


class AttemptSpanProcessor(SpanProcessor):
    """Routes each span to the writer of the attempt it started in.

    Translators run only for attempts with `framework_telemetry` on, so a runner that turned framework
    instrumentation off stores other instrumentation's spans unchanged.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owners: dict[tuple[int, int], AttemptContext] = {}
        self._translators: tuple[SpanTranslator, ...] = ()

    def add_translator(self, translator: SpanTranslator) -> None:
        """Apply `translator` to every span of a framework-instrumented attempt (idempotent)."""
        with self._lock:
            if translator not in self._translators:
                self._translators += (translator,)

    def on_start(self, span: OtelSpan, parent_context: Context | None = None) -> None:
        attempt = current_attempt()
        if attempt is None:
            return
        span.set_attribute(ATTR_SEQUENCE_IN_ATTEMPT, attempt.next_sequence())
        ctx = span.get_span_context()
        with self._lock:
            self._owners[(ctx.trace_id, ctx.span_id)] = attempt

    def on_end(self, span: ReadableSpan) -> None:
        ctx = span.get_span_context()
        if ctx is None:
            return
        with self._lock:
            attempt = self._owners.pop((ctx.trace_id, ctx.span_id), None)
        if attempt is None:
            return
        converted = to_reinforge_span(span, attempt.rollout_id, attempt.attempt_id)
        if attempt.framework_telemetry:
            for translate in self._translators:
                try:
                    converted = translate(converted)
                except Exception:  # a span ends inside the agent's code: never fail it for this
                    log.exception("span translator %r failed; the span is stored as it was", translate)
        attempt.sink.submit(converted)

    def shutdown(self) -> None:
        with self._lock:
            self._owners.clear()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        # Spans are already with their writers; the runner flushes those (they are async).
        return True
