"""OTLP trace data → reinforge spans: ids, times, status, events, flattened attributes, and the
OpenTelemetry GenAI conventions mapped onto reinforge's (`semconv`).

Why a conversion and not the spans as sent: credit reads reinforge's conventions, while an agent in
any language speaks OpenTelemetry's. The data comes from the agent's process, so it is checked like
any other input: a span with bad ids is refused on its own (the rest of the request still counts),
oversized values are cut, and the attributes only the gateway writes (an LLM call's token ids and
logprobs, which become training data) are dropped, so telemetry can never pass for a sampled call.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1 import trace_pb2
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from reinforge import semconv
from reinforge.types import Span, SpanEvent, SpanKind, SpanStatus, SpanStatusCode

# OpenTelemetry's GenAI semantic conventions (the keys this module reads)
GEN_AI_OPERATION = "gen_ai.operation.name"
GEN_AI_TOOL_NAME = "gen_ai.tool.name"
GEN_AI_AGENT_NAME = "gen_ai.agent.name"
OP_EXECUTE_TOOL = "execute_tool"
OP_INVOKE_AGENT = "invoke_agent"
ERROR_TYPE = "error.type"
"""Set on a span whose operation failed (OpenTelemetry's general conventions)."""

# What the receiver adds from the request's resource and scope (OpenTelemetry's names for them)
ATTR_SERVICE_NAME = "service.name"
ATTR_SCOPE_NAME = "otel.scope.name"
ATTR_SCOPE_VERSION = "otel.scope.version"

MAX_NAME_CHARS = 512
"""`Span.name`'s bound."""

_SENDER_STEP_KINDS = frozenset(
    {semconv.STEP_TOOL, semconv.STEP_CUSTOM, semconv.STEP_REWARD, semconv.STEP_AGENT}
)
"""The step kinds an agent may give its own spans: "llm" is the gateway's alone."""
_GATEWAY_ONLY_PREFIXES = ("reinforge.llm.", "reinforge.internal.")

_KINDS = {
    trace_pb2.Span.SPAN_KIND_INTERNAL: SpanKind.internal,
    trace_pb2.Span.SPAN_KIND_SERVER: SpanKind.server,
    trace_pb2.Span.SPAN_KIND_CLIENT: SpanKind.client,
    trace_pb2.Span.SPAN_KIND_PRODUCER: SpanKind.producer,
    trace_pb2.Span.SPAN_KIND_CONSUMER: SpanKind.consumer,
}
_STATUS = {
    trace_pb2.Status.STATUS_CODE_OK: SpanStatusCode.ok,
    trace_pb2.Status.STATUS_CODE_ERROR: SpanStatusCode.error,
}


class OtlpLimits(BaseModel):
    """What one attempt may send; past these a span is refused or its values are cut."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_body_bytes: int = Field(default=16 * 1024 * 1024, ge=1)
    """The request body, before and after decompression (413 beyond)."""
    max_spans_per_request: int = Field(default=2048, ge=1)
    max_spans_per_attempt: int = Field(default=20_000, ge=1)
    max_queued_spans: int = Field(default=1024, ge=1)
    """While the gateway's span recorder holds this many spans (keep it under the gateway's
    `max_queued_spans`), an attempt's telemetry waits for its own spans to be written before it queues
    more, so a flood leaves the shared queue room for every attempt's LLM calls."""
    max_attributes: int = Field(default=128, ge=0)
    """Per span and per event, counted after flattening; the rest are dropped."""
    max_events: int = Field(default=128, ge=0)
    max_key_chars: int = Field(default=256, ge=1)
    max_value_chars: int = Field(default=32_768, ge=1)
    """A longer string (attribute value, status message) is cut to this many characters."""
    max_array_items: int = Field(default=1024, ge=0)
    max_depth: int = Field(default=4, ge=1)
    """Nesting of array and map values; deeper values are stored as null."""


class InvalidSpanError(ValueError):
    """One span can't be stored (bad ids, no name, no start time); the others still are."""


@dataclass
class Converted:
    """The spans of one request that may be stored, and what was refused and why."""

    spans: list[Span] = field(default_factory=list)
    invalid: int = 0
    over_budget: int = 0
    """Spans past the budget the caller gave (its per-request and per-attempt caps)."""
    reasons: list[str] = field(default_factory=list)
    """The first few distinct reasons for invalid spans."""

    def refuse(self, reason: str) -> None:
        self.invalid += 1
        if len(self.reasons) < 3 and reason not in self.reasons:
            self.reasons.append(reason)


def to_spans(
    request: ExportTraceServiceRequest,
    *,
    rollout_id: str,
    attempt_id: str,
    limits: OtlpLimits,
    budget: int,
) -> Converted:
    """The request's spans as reinforge spans of the attempt, at most `budget` of them (in order)."""
    out = Converted()
    for resource_spans in request.resource_spans:
        service = _service_name(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            scope = scope_spans.scope
            context: dict[str, Any] = {}
            if service:
                context[ATTR_SERVICE_NAME] = _text(service, limits.max_value_chars)
            if scope.name:
                context[ATTR_SCOPE_NAME] = _text(scope.name, limits.max_value_chars)
            if scope.version:
                context[ATTR_SCOPE_VERSION] = _text(scope.version, limits.max_value_chars)
            for otlp_span in scope_spans.spans:
                if len(out.spans) >= budget:
                    out.over_budget += 1
                    continue
                try:
                    out.spans.append(_span(otlp_span, rollout_id, attempt_id, context, limits))
                except InvalidSpanError as exc:
                    out.refuse(str(exc))
    return out


def map_genai(attributes: dict[str, Any], name: str, status: SpanStatusCode) -> None:
    """Give a span reinforge's step attributes from OpenTelemetry's GenAI ones (in place).

    A tool execution (`gen_ai.operation.name == "execute_tool"`, or any span naming `gen_ai.tool.name`)
    is a tool step, and one that failed carries the `tool_error` AIR signal; an `invoke_agent` span is
    an agent step; `gen_ai.agent.name` names the agent. What the agent set itself wins.
    """
    operation = attributes.get(GEN_AI_OPERATION)
    tool = _non_empty(attributes.get(GEN_AI_TOOL_NAME))
    agent = _non_empty(attributes.get(GEN_AI_AGENT_NAME))
    kind = attributes.get(semconv.ATTR_STEP_KIND)
    if kind not in _SENDER_STEP_KINDS:
        if operation == OP_EXECUTE_TOOL or tool is not None:
            kind = semconv.STEP_TOOL
        elif operation == OP_INVOKE_AGENT:
            kind = semconv.STEP_AGENT
        else:
            kind = semconv.STEP_CUSTOM
    attributes[semconv.ATTR_STEP_KIND] = kind
    if kind == semconv.STEP_TOOL:
        attributes.setdefault(semconv.ATTR_TOOL_NAME, tool or name.removeprefix(OP_EXECUTE_TOOL + " "))
        if status is SpanStatusCode.error or ERROR_TYPE in attributes:
            attributes.setdefault(semconv.ATTR_AIR_SIGNAL, semconv.AIR_TOOL_ERROR)
    if agent is not None:
        attributes.setdefault(semconv.ATTR_AGENT_NAME, agent)


def _span(
    otlp: trace_pb2.Span, rollout_id: str, attempt_id: str, context: dict[str, Any], limits: OtlpLimits
) -> Span:
    span_id = _id(otlp.span_id, 8, "span_id", None)
    trace_id = _id(otlp.trace_id, 16, "trace_id", span_id)
    parent_id = _parent_id(otlp.parent_span_id, span_id)
    name = _text(otlp.name, MAX_NAME_CHARS)
    if not name:
        raise InvalidSpanError(f"span {span_id} has no name")
    if name == semconv.SPAN_LLM_CALL:
        raise InvalidSpanError(f"span {span_id}: the name {name!r} is reserved for the gateway's LLM calls")
    if not otlp.start_time_unix_nano:
        raise InvalidSpanError(f"span {span_id} has no start time")
    attributes = _attributes(otlp.attributes, limits)
    for key in [k for k in attributes if k.startswith(_GATEWAY_ONLY_PREFIXES)]:
        del attributes[key]
    attributes.pop(semconv.ATTR_SEQUENCE_IN_ATTEMPT, None)  # the receiver stamps its own
    for key, value in context.items():
        attributes.setdefault(key, value)
    status = SpanStatus(
        code=_STATUS.get(otlp.status.code, SpanStatusCode.unset),
        message=_text(otlp.status.message, limits.max_value_chars) or None,
    )
    map_genai(attributes, name, status.code)
    start_ns = otlp.start_time_unix_nano
    events = [
        SpanEvent(
            name=_text(event.name, MAX_NAME_CHARS) or "event",
            timestamp=(event.time_unix_nano or start_ns) / 1e9,
            attributes=_attributes(event.attributes, limits),
        )
        for event in otlp.events[: limits.max_events]
    ]
    try:
        return Span(
            span_id=span_id,
            trace_id=trace_id,
            parent_id=parent_id,
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            name=name,
            kind=_KINDS.get(otlp.kind, SpanKind.internal),
            start_time=start_ns / 1e9,
            end_time=otlp.end_time_unix_nano / 1e9 if otlp.end_time_unix_nano else None,
            attributes=attributes,
            status=status,
            events=events,
        )
    except ValidationError as exc:
        raise InvalidSpanError(f"span {span_id}: {exc.errors()[0]['msg']}") from None


def _id(raw: bytes, size: int, what: str, span_id: str | None) -> str:
    if len(raw) != size or not any(raw):
        which = f"span {span_id}" if span_id else "a span"
        raise InvalidSpanError(f"{which} has an invalid {what}: it must be {size} bytes, not all zero")
    return raw.hex()


def _parent_id(raw: bytes, span_id: str) -> str | None:
    if not any(raw):  # absent, or all zeros: a root span
        return None
    if len(raw) != 8:
        raise InvalidSpanError(f"span {span_id} has an invalid parent_span_id: it must be 8 bytes")
    return raw.hex()


def _service_name(attributes: Iterable[KeyValue]) -> str | None:
    for kv in attributes:
        if kv.key == ATTR_SERVICE_NAME and kv.value.WhichOneof("value") == "string_value":
            return kv.value.string_value or None
    return None


def _attributes(kvs: Iterable[KeyValue], limits: OtlpLimits) -> dict[str, Any]:
    """Key-value pairs as one flat dict: a map value's entries become `key.subkey` entries."""
    out: dict[str, Any] = {}
    _flatten(kvs, "", out, limits, 0)
    return out


def _flatten(
    kvs: Iterable[KeyValue], prefix: str, out: dict[str, Any], limits: OtlpLimits, depth: int
) -> None:
    for kv in kvs:
        if len(out) >= limits.max_attributes:
            return
        if not kv.key:
            continue
        key = _text(prefix + kv.key, limits.max_key_chars)
        value = kv.value
        if value.WhichOneof("value") == "kvlist_value" and depth + 1 < limits.max_depth:
            _flatten(value.kvlist_value.values, key + ".", out, limits, depth + 1)
        else:
            out[key] = _value(value, limits, depth)


def _value(value: AnyValue, limits: OtlpLimits, depth: int) -> Any:
    which = value.WhichOneof("value")
    if which == "string_value":
        return _text(value.string_value, limits.max_value_chars)
    if which == "bool_value":
        return value.bool_value
    if which == "int_value":
        return value.int_value
    if which == "double_value":
        number = value.double_value
        return number if math.isfinite(number) else None
    if which == "bytes_value":
        return base64.b64encode(value.bytes_value[: limits.max_value_chars]).decode()
    if depth + 1 >= limits.max_depth:
        return None
    if which == "array_value":
        return [_value(v, limits, depth + 1) for v in value.array_value.values[: limits.max_array_items]]
    if which == "kvlist_value":
        return {
            _text(kv.key, limits.max_key_chars): _value(kv.value, limits, depth + 1)
            for kv in value.kvlist_value.values[: limits.max_attributes]
        }
    return None


def _text(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, without NUL (which no store backend can index)."""
    if len(text) > limit:
        text = text[:limit]
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    return text


def _non_empty(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
