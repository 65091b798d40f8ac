"""Hypothesis properties of OTLP ingestion (`gateway/otlp.py`, `gateway/otlp_wire.py`): whatever an
agent's OpenTelemetry SDK (or anything posing as one) sends, each span is stored within the limits
or refused with a reason, every span is accounted for, and a bad body is a 4xx, never a crash."""

from __future__ import annotations

import gzip
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1 import trace_pb2

from reinforge.gateway.errors import GatewayHTTPError
from reinforge.gateway.otlp import OtlpLimits, to_spans
from reinforge.gateway.otlp_wire import Encoding, decode_request
from reinforge.types import Span

PROPERTIES = settings(max_examples=40, deadline=None, derandomize=True, database=None)
LIMITS = OtlpLimits(max_attributes=8, max_events=3, max_key_chars=16, max_value_chars=24, max_array_items=4)

text = st.text(max_size=40)
scalars = st.one_of(
    text.map(lambda s: AnyValue(string_value=s)),
    st.booleans().map(lambda b: AnyValue(bool_value=b)),
    st.integers(-(2**63), 2**63 - 1).map(lambda i: AnyValue(int_value=i)),
    st.floats(allow_nan=True, allow_infinity=True).map(lambda f: AnyValue(double_value=f)),
    st.binary(max_size=40).map(lambda b: AnyValue(bytes_value=b)),
)


def _nest(inner: st.SearchStrategy[AnyValue]) -> st.SearchStrategy[AnyValue]:
    arrays = st.lists(inner, max_size=6).map(lambda vs: AnyValue(array_value={"values": vs}))
    maps = st.lists(st.tuples(text, inner), max_size=6).map(
        lambda kvs: AnyValue(kvlist_value={"values": [KeyValue(key=k, value=v) for k, v in kvs]})
    )
    return arrays | maps


values = st.recursive(scalars, _nest, max_leaves=6)
attributes = st.lists(st.builds(KeyValue, key=text, value=values), max_size=10)
ids = st.one_of(st.binary(min_size=0, max_size=17), st.just(b"\x00" * 8), st.binary(min_size=8, max_size=8))


def _spans(trace_ids: st.SearchStrategy[bytes], span_ids: st.SearchStrategy[bytes]) -> st.SearchStrategy[Any]:
    return st.builds(
        trace_pb2.Span,
        trace_id=trace_ids,
        span_id=span_ids,
        parent_span_id=span_ids,
        name=text,
        kind=st.integers(0, 6),
        start_time_unix_nano=st.integers(0, 2**64 - 1),
        end_time_unix_nano=st.integers(0, 2**64 - 1),
        attributes=attributes,
        events=st.lists(st.builds(trace_pb2.Span.Event, name=text, attributes=attributes), max_size=5),
        status=st.builds(trace_pb2.Status, code=st.integers(0, 2), message=text),
    )


def _requests(spans: st.SearchStrategy[Any]) -> st.SearchStrategy[ExportTraceServiceRequest]:
    return st.lists(st.lists(spans, max_size=4), max_size=3).map(
        lambda groups: ExportTraceServiceRequest(
            resource_spans=[
                {"scope_spans": [{"scope": {"name": "agent"}, "spans": group}]} for group in groups
            ]
        )
    )


requests = _requests(_spans(st.one_of(ids, st.binary(min_size=16, max_size=16)), ids))
right_sized = _requests(
    _spans(
        st.just(b"") | st.binary(min_size=16, max_size=16), st.just(b"") | st.binary(min_size=8, max_size=8)
    )
)
"""Ids of the right size or none: the JSON mapping writes a wrong-sized id in base64, and base64
that happens to be all hex digits of a right-sized id reads as hex (OTLP/JSON's spelling)."""


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [k, *_strings(v)]]
    return []


@PROPERTIES
@given(request=requests, budget=st.integers(0, 12))
def test_every_span_is_stored_within_the_limits_or_refused_with_a_reason(
    request: ExportTraceServiceRequest, budget: int
) -> None:
    sent = sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
    out = to_spans(request, rollout_id="r1", attempt_id="a1", limits=LIMITS, budget=budget)
    assert len(out.spans) + out.invalid + out.over_budget == sent
    assert len(out.spans) <= budget
    assert (out.invalid > 0) == bool(out.reasons)
    for span in out.spans:
        again = Span.model_validate_json(span.model_dump_json())  # what the store will accept
        assert (again.rollout_id, again.attempt_id) == ("r1", "a1")
        assert "\x00" not in span.name and span.name != "reinforge.llm_call"
        assert len(span.events) <= LIMITS.max_events
        for attrs in [span.attributes, *(event.attributes for event in span.events)]:
            json.dumps(attrs, allow_nan=False)  # JSON without NaN or infinity
            assert not any(key.startswith("reinforge.llm.") for key in attrs)
            for s in _strings(attrs):
                assert len(s) <= max(LIMITS.max_value_chars, LIMITS.max_key_chars) * 2 + 1


@PROPERTIES
@given(body=st.binary(max_size=300), encoding=st.sampled_from(list(Encoding)), gzipped=st.booleans())
def test_any_body_decodes_or_is_a_client_error(body: bytes, encoding: Encoding, gzipped: bool) -> None:
    payload = gzip.compress(body) if gzipped else body
    try:
        decode_request(payload, encoding, "gzip" if gzipped else None, max_bytes=200)
    except GatewayHTTPError as exc:
        assert 400 <= exc.http_status < 500


@PROPERTIES
@given(request=right_sized)
def test_protobuf_and_its_json_mapping_store_the_same_spans(request: ExportTraceServiceRequest) -> None:
    from google.protobuf.json_format import MessageToJson

    as_proto = decode_request(request.SerializeToString(), Encoding.protobuf, None, max_bytes=10**7)
    as_json = decode_request(MessageToJson(request).encode(), Encoding.json, None, max_bytes=10**7)
    assert as_proto == request
    # The JSON mapping writes ids as base64 where OTLP/JSON wants hex; the receiver takes either,
    # and an id of the wrong size is refused whichever way it came.
    one = to_spans(as_proto, rollout_id="r1", attempt_id="a1", limits=LIMITS, budget=100)
    other = to_spans(as_json, rollout_id="r1", attempt_id="a1", limits=LIMITS, budget=100)
    assert [(s.span_id, s.trace_id, s.name, s.attributes) for s in one.spans] == [
        (s.span_id, s.trace_id, s.name, s.attributes) for s in other.spans
    ]
    assert one.invalid == other.invalid
