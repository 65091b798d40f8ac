"""The OTLP/HTTP trace receiver: protobuf and OTLP/JSON (gzip too) into the SQLite store under the
attempt of the URL, GenAI conventions as reinforge steps, a failed tool as an AIR signal credit sees,
and bad telemetry refused (400/401/404/409/413/415, caps, bad ids) without touching other attempts."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.proto.trace.v1 import trace_pb2
from starlette.applications import Starlette

from reinforge import semconv
from reinforge.credit import CreditConfig, build_transitions
from reinforge.gateway import Gateway, create_gateway_app
from reinforge.gateway.otlp import OtlpLimits
from reinforge.gateway.routes import GatewayRoutes
from reinforge.inference import ScriptedBackend
from reinforge.net.background import BackgroundServer
from reinforge.store.memory import MemoryStore
from reinforge.store.protocol import Store
from reinforge.store.sql.store import SqlStore
from reinforge.types import (
    AttemptOutcome,
    AttemptQuery,
    AttemptStatus,
    LeasedRollout,
    Span,
    SpanKind,
    SpanQuery,
    SpanStatusCode,
)

from .conftest import SECRET, finished_attempt, running_attempt

status_pb2 = pytest.importorskip("google.rpc.status_pb2", reason="googleapis-common-protos decodes errors")

TRACE = bytes.fromhex("5b8efff798038103d269b633813fc60c")
AGENT_SPAN = bytes.fromhex("eee19b7ec3c1b174")
TOOL_SPAN = bytes.fromhex("eee19b7ec3c1b175")
OTHER_SPAN = bytes.fromhex("eee19b7ec3c1b176")
PROTOBUF = {"Content-Type": "application/x-protobuf"}


@dataclass
class Served:
    url: str
    store: SqlStore
    gateway: Gateway

    def headers(self, attempt_id: str, **more: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.gateway.keys.token_for(attempt_id)}", **more}

    def post(self, attempt_id: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
        return httpx.post(f"{self.url}/r/{attempt_id}/v1/traces", content=body, headers=headers, timeout=10)

    async def spans(self, attempt_id: str) -> dict[str, Span]:
        await self.gateway.flush(attempt_id)
        page = await self.store.query_spans(SpanQuery(attempt_id=attempt_id, limit=1000))
        return {s.span_id: s for s in page.items}


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> AsyncIterator[SqlStore]:
    store = await SqlStore.open(f"sqlite:///{tmp_path / 'store.db'}")
    yield store
    await store.close()


@pytest.fixture
def served(sqlite_store: SqlStore, tokenizer: Any) -> Iterator[Served]:
    """The gateway as a trainer serves it (`create_gateway_app`), over a real SQLite store."""
    app = create_gateway_app(sqlite_store, ScriptedBackend(tokenizer, ["The answer is 5."]), SECRET)
    with BackgroundServer(app) as server:
        yield Served(server.url, sqlite_store, app.state.gateway)


def serve_with_limits(
    store: Store, backend: ScriptedBackend, limits: OtlpLimits, max_body: int, **options: Any
) -> Any:
    """The same routes with other receiver limits (create_gateway_app keeps the defaults)."""
    gateway = Gateway(store, backend, SECRET, **options)
    table = GatewayRoutes(gateway, otlp_limits=limits).table(max_body)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        gateway.bind()
        yield
        await gateway.close()

    app = Starlette(routes=table.starlette_routes(), lifespan=lifespan)
    app.state.gateway, app.state.route_table = gateway, table
    return app


def kv(key: str, value: Any) -> KeyValue:
    return KeyValue(key=key, value=any_value(value))


def any_value(value: Any) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, bytes):
        return AnyValue(bytes_value=value)
    if isinstance(value, list):
        return AnyValue(array_value=ArrayValue(values=[any_value(v) for v in value]))
    if isinstance(value, dict):
        return AnyValue(kvlist_value=KeyValueList(values=[kv(k, v) for k, v in value.items()]))
    return AnyValue(string_value=value)


def otlp_span(span_id: bytes, name: str, start: float, **fields: Any) -> trace_pb2.Span:
    attributes = fields.pop("attributes", {})
    return trace_pb2.Span(
        trace_id=fields.pop("trace_id", TRACE),
        span_id=span_id,
        name=name,
        start_time_unix_nano=int(start * 1e9),
        end_time_unix_nano=int((start + 0.5) * 1e9),
        attributes=[kv(k, v) for k, v in attributes.items()],
        **fields,
    )


def export(*spans: trace_pb2.Span, service: str = "calc-agent") -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    resource = request.resource_spans.add()
    resource.resource.attributes.append(kv("service.name", service))
    scope = resource.scope_spans.add()
    scope.scope.name, scope.scope.version = "calc.instrumentation", "1.2"
    scope.spans.extend(spans)
    return request


def agent_and_tool(start: float) -> ExportTraceServiceRequest:
    """An agent run and, inside it, a tool call that failed (the GenAI conventions' shape)."""
    tool = otlp_span(
        TOOL_SPAN,
        "execute_tool calculator",
        start + 0.1,
        parent_span_id=AGENT_SPAN,
        kind=trace_pb2.Span.SPAN_KIND_INTERNAL,
        attributes={
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "calculator",
            "gen_ai.tool.call.id": "call_1",
        },
        status=trace_pb2.Status(code=trace_pb2.Status.STATUS_CODE_ERROR, message="division by zero"),
        events=[
            trace_pb2.Span.Event(
                name="exception",
                time_unix_nano=int((start + 0.2) * 1e9),
                attributes=[kv("exception.type", "ZeroDivisionError")],
            )
        ],
    )
    agent = otlp_span(
        AGENT_SPAN,
        "invoke_agent solver",
        start,
        kind=trace_pb2.Span.SPAN_KIND_CLIENT,
        attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "solver"},
    )
    return export(tool, agent)  # children end, and are exported, before their parents


def assert_agent_and_tool(spans: dict[str, Span], leased: LeasedRollout, start: float) -> None:
    agent, tool = spans[AGENT_SPAN.hex()], spans[TOOL_SPAN.hex()]
    for span in (agent, tool):
        assert (span.rollout_id, span.attempt_id) == (leased.rollout.rollout_id, leased.attempt.attempt_id)
        assert span.trace_id == TRACE.hex()
        assert span.attributes["service.name"] == "calc-agent"
        assert span.attributes["otel.scope.name"] == "calc.instrumentation"
        assert span.attributes["otel.scope.version"] == "1.2"
    assert agent.parent_id is None and tool.parent_id == AGENT_SPAN.hex()
    assert agent.kind is SpanKind.client and tool.kind is SpanKind.internal
    assert agent.start_time == pytest.approx(start, abs=1e-6)
    assert agent.end_time == pytest.approx(start + 0.5, abs=1e-6)
    assert agent.attributes[semconv.ATTR_STEP_KIND] == semconv.STEP_AGENT
    assert agent.attributes[semconv.ATTR_AGENT_NAME] == "solver"
    assert semconv.ATTR_AIR_SIGNAL not in agent.attributes
    assert tool.attributes[semconv.ATTR_STEP_KIND] == semconv.STEP_TOOL
    assert tool.attributes[semconv.ATTR_TOOL_NAME] == "calculator"
    assert tool.attributes[semconv.ATTR_AIR_SIGNAL] == semconv.AIR_TOOL_ERROR
    assert tool.attributes["gen_ai.tool.call.id"] == "call_1"
    assert (tool.status.code, tool.status.message) == (SpanStatusCode.error, "division by zero")
    [event] = tool.events
    assert event.name == "exception" and event.timestamp == pytest.approx(start + 0.2, abs=1e-6)
    assert event.attributes == {"exception.type": "ZeroDivisionError"}
    # Stamped in start order, whatever order they came in.
    agent_seq = agent.attributes[semconv.ATTR_SEQUENCE_IN_ATTEMPT]
    assert tool.attributes[semconv.ATTR_SEQUENCE_IN_ATTEMPT] == agent_seq + 1


async def test_protobuf_spans_land_under_the_attempt_with_genai_mapped(served: Served) -> None:
    leased = await running_attempt(served.store)
    attempt_id = leased.attempt.attempt_id
    start = time.time()
    response = served.post(
        attempt_id, agent_and_tool(start).SerializeToString(), served.headers(attempt_id, **PROTOBUF)
    )
    assert response.status_code == 200 and response.headers["content-type"] == "application/x-protobuf"
    answer = ExportTraceServiceResponse.FromString(response.content)
    assert not answer.HasField("partial_success")
    spans = await served.spans(attempt_id)
    assert set(spans) == {AGENT_SPAN.hex(), TOOL_SPAN.hex()}
    assert_agent_and_tool(spans, leased, start)


async def test_attributes_are_flattened_and_the_gateway_s_own_keys_are_not_the_agent_s(
    served: Served,
) -> None:
    attempt_id = (await running_attempt(served.store)).attempt.attempt_id
    span = otlp_span(
        OTHER_SPAN,
        "plan",
        time.time(),
        attributes={
            "http": {"request": {"method": "POST"}, "status_code": 200},
            "tags": ["a", "b"],
            "ratio": 0.25,
            "ok": True,
            "blob": b"\x00\x01",
            "messages": [{"role": "user", "content": "2+3?"}],
            # An agent can't make its telemetry pass for an LLM call (training data) or reorder it.
            semconv.ATTR_STEP_KIND: semconv.STEP_LLM,
            semconv.ATTR_COMPLETION_TOKEN_IDS: [1, 2, 3],
            semconv.ATTR_COMPLETION_LOGPROBS: [-0.1, -0.2, -0.3],
            semconv.ATTR_SEQUENCE_IN_ATTEMPT: 99,
        },
    )
    assert (
        served.post(
            attempt_id, export(span).SerializeToString(), served.headers(attempt_id, **PROTOBUF)
        ).status_code
        == 200
    )
    [stored] = (await served.spans(attempt_id)).values()
    attrs = dict(stored.attributes)
    assert attrs.pop(semconv.ATTR_SEQUENCE_IN_ATTEMPT) == 0
    assert attrs == {
        "http.request.method": "POST",
        "http.status_code": 200,
        "tags": ["a", "b"],
        "ratio": 0.25,
        "ok": True,
        "blob": "AAE=",
        "messages": [{"role": "user", "content": "2+3?"}],
        "service.name": "calc-agent",
        "otel.scope.name": "calc.instrumentation",
        "otel.scope.version": "1.2",
        semconv.ATTR_STEP_KIND: semconv.STEP_CUSTOM,
    }


def otlp_json(start: float) -> dict[str, Any]:
    """`agent_and_tool` as the OTLP/JSON spec writes it: hex ids, lowerCamelCase, enum ints,
    int64 as strings, AnyValue unions."""
    ns = int(start * 1e9)
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "calc-agent"}}]},
                "scopeSpans": [
                    {
                        "scope": {"name": "calc.instrumentation", "version": "1.2"},
                        "spans": [
                            {
                                "traceId": TRACE.hex(),
                                "spanId": TOOL_SPAN.hex(),
                                "parentSpanId": AGENT_SPAN.hex(),
                                "name": "execute_tool calculator",
                                "kind": 1,
                                "startTimeUnixNano": str(ns + 100_000_000),
                                "endTimeUnixNano": str(ns + 600_000_000),
                                "attributes": [
                                    {
                                        "key": "gen_ai.operation.name",
                                        "value": {"stringValue": "execute_tool"},
                                    },
                                    {"key": "gen_ai.tool.name", "value": {"stringValue": "calculator"}},
                                    {"key": "gen_ai.tool.call.id", "value": {"stringValue": "call_1"}},
                                ],
                                "events": [
                                    {
                                        "timeUnixNano": str(ns + 200_000_000),
                                        "name": "exception",
                                        "attributes": [
                                            {
                                                "key": "exception.type",
                                                "value": {"stringValue": "ZeroDivisionError"},
                                            }
                                        ],
                                    }
                                ],
                                "status": {"code": 2, "message": "division by zero"},
                                "someFieldFromTheFuture": {"ignored": True},
                            },
                            {
                                "traceId": TRACE.hex(),
                                "spanId": AGENT_SPAN.hex(),
                                "parentSpanId": "",
                                "name": "invoke_agent solver",
                                "kind": 3,
                                "startTimeUnixNano": ns,
                                "endTimeUnixNano": ns + 500_000_000,
                                "attributes": [
                                    {
                                        "key": "gen_ai.operation.name",
                                        "value": {"stringValue": "invoke_agent"},
                                    },
                                    {"key": "gen_ai.agent.name", "value": {"stringValue": "solver"}},
                                ],
                            },
                        ],
                    }
                ],
            }
        ]
    }


@pytest.mark.parametrize("gzipped", [False, True])
async def test_otlp_json_is_read_like_protobuf_and_answered_in_json(served: Served, gzipped: bool) -> None:
    leased = await running_attempt(served.store)
    attempt_id = leased.attempt.attempt_id
    start = time.time()
    body = json.dumps(otlp_json(start)).encode()
    headers = served.headers(attempt_id, **{"Content-Type": "application/json; charset=utf-8"})
    if gzipped:
        body, headers["Content-Encoding"] = gzip.compress(body), "gzip"
    response = served.post(attempt_id, body, headers)
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    assert response.json() == {}
    assert_agent_and_tool(await served.spans(attempt_id), leased, start)


async def test_gzipped_protobuf(served: Served) -> None:
    leased = await running_attempt(served.store)
    attempt_id = leased.attempt.attempt_id
    start = time.time()
    body = gzip.compress(agent_and_tool(start).SerializeToString())
    response = served.post(
        attempt_id, body, served.headers(attempt_id, **PROTOBUF, **{"Content-Encoding": "gzip"})
    )
    assert response.status_code == 200
    assert_agent_and_tool(await served.spans(attempt_id), leased, start)


async def test_a_failed_tool_span_is_an_air_signal_for_the_llm_call_before_it(served: Served) -> None:
    leased = await running_attempt(served.store)
    attempt_id = leased.attempt.attempt_id
    async with openai.AsyncOpenAI(
        base_url=f"{served.url}/r/{attempt_id}/v1",
        api_key=served.gateway.keys.token_for(attempt_id),
        max_retries=0,
    ) as client:
        await client.chat.completions.create(model="p", messages=[{"role": "user", "content": "2+3?"}])
    response = served.post(
        attempt_id, agent_and_tool(time.time()).SerializeToString(), served.headers(attempt_id, **PROTOBUF)
    )
    assert response.status_code == 200
    # Finishing flushes the recorder first: the telemetry is in the store when the attempt ends.
    rollout = await served.gateway.finish_attempt(
        attempt_id, AttemptOutcome(status=AttemptStatus.succeeded, reward=1.0)
    )
    spans = (await served.store.query_spans(SpanQuery(rollout_id=rollout.rollout_id))).items
    assert sorted(s.name for s in spans) == [
        "execute_tool calculator",
        "invoke_agent solver",
        semconv.SPAN_LLM_CALL,
    ]
    attempts = (await served.store.query_attempts(AttemptQuery(rollout_id=rollout.rollout_id))).items
    transitions, metrics = build_transitions(
        rollout, spans, CreditConfig(assignment="equal+air"), attempts=attempts
    )
    assert metrics.air_signals == {semconv.AIR_TOOL_ERROR: 1}
    [transition] = transitions
    assert transition.reward_sources == {"equal": 1.0, "air": pytest.approx(-0.2)}
    assert transition.reward == pytest.approx(0.8)


def status_of(response: httpx.Response) -> tuple[int, str]:
    status = status_pb2.Status.FromString(response.content)
    return status.code, status.message


async def test_wrong_key_unknown_and_finished_attempts(served: Served) -> None:
    attempt_id = (await running_attempt(served.store)).attempt.attempt_id
    other = (await running_attempt(served.store)).attempt.attempt_id
    body = agent_and_tool(time.time()).SerializeToString()

    missing = served.post(attempt_id, body, PROTOBUF)
    assert missing.status_code == 401 and missing.headers["content-type"] == "application/x-protobuf"
    assert status_of(missing) == (16, "missing bearer token: send the attempt's token as the API key")
    wrong = served.post(attempt_id, body, served.headers(other, **PROTOBUF))
    assert wrong.status_code == 401 and "not valid for attempt" in status_of(wrong)[1]

    unknown = served.post("no-such-attempt", body, served.headers("no-such-attempt", **PROTOBUF))
    assert unknown.status_code == 404 and status_of(unknown) == (5, "unknown attempt 'no-such-attempt'")
    done = (await finished_attempt(served.store)).attempt.attempt_id
    finished = served.post(done, body, served.headers(done, **{"Content-Type": "application/json"}))
    assert finished.status_code == 409 and finished.headers["content-type"] == "application/json"
    assert "succeeded, not running" in finished.json()["message"]
    assert await served.spans(attempt_id) == {} and await served.spans(other) == {}


@pytest.mark.parametrize(
    ("body", "headers", "status", "says"),
    [
        (b"\xff\xff\xff", PROTOBUF, 400, "not a protobuf ExportTraceServiceRequest"),
        (b'{"resourceSpans": [', {"Content-Type": "application/json"}, 400, "not valid JSON"),
        (b"[1, 2]", {"Content-Type": "application/json"}, 400, "must be a JSON object"),
        (b'{"resourceSpans": {"a": 1}}', {"Content-Type": "application/json"}, 400, "not an OTLP/JSON"),
        (b"\x1f\x8b\x08garbage", {**PROTOBUF, "Content-Encoding": "gzip"}, 400, "not valid gzip"),
        (gzip.compress(b"x" * 100)[:-6], {**PROTOBUF, "Content-Encoding": "gzip"}, 400, "truncated"),
        (b"", {**PROTOBUF, "Content-Encoding": "br"}, 415, "unsupported Content-Encoding"),
        (b"", {"Content-Type": "text/plain"}, 415, "unsupported Content-Type"),
    ],
)
async def test_malformed_bodies_are_refused_with_a_message(
    served: Served, body: bytes, headers: dict[str, str], status: int, says: str
) -> None:
    attempt_id = (await running_attempt(served.store)).attempt.attempt_id
    response = served.post(attempt_id, body, served.headers(attempt_id, **headers))
    assert response.status_code == status
    if response.headers["content-type"] == "application/json":
        message = response.json()["message"]
    else:
        message = status_of(response)[1]
    assert says in message


async def test_caps_cut_a_flood_report_it_and_log_it_once(
    sqlite_store: SqlStore, tokenizer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    limits = OtlpLimits(max_spans_per_request=3, max_spans_per_attempt=5, max_body_bytes=4096)
    app = serve_with_limits(sqlite_store, ScriptedBackend(tokenizer, ["ok"]), limits, max_body=8192)
    with BackgroundServer(app) as server:
        served = Served(server.url, sqlite_store, app.state.gateway)
        flood = (await running_attempt(sqlite_store)).attempt.attempt_id
        calm = (await running_attempt(sqlite_store)).attempt.attempt_id
        start = time.time()

        def batch(first: int, count: int) -> bytes:
            ids = [(first + n).to_bytes(8, "big") for n in range(count)]
            return export(
                *(otlp_span(i, f"step {i.hex()}", start + n) for n, i in enumerate(ids))
            ).SerializeToString()

        def send(attempt_id: str, body: bytes) -> tuple[int, str]:
            response = served.post(attempt_id, body, served.headers(attempt_id, **PROTOBUF))
            assert response.status_code == 200
            partial = ExportTraceServiceResponse.FromString(response.content).partial_success
            return partial.rejected_spans, partial.error_message

        with caplog.at_level(logging.WARNING, logger="reinforge.gateway.otlp_receiver"):
            assert send(flood, batch(1, 4)) == (1, "1 spans over the cap of 3 spans per request")
            assert send(flood, batch(11, 3)) == (1, "1 spans over this attempt's cap of 5 spans")
            assert send(flood, batch(21, 2)) == (2, "2 spans over this attempt's cap of 5 spans")
            assert send(calm, batch(31, 3)) == (0, "")
        warnings = [r.getMessage() for r in caplog.records if r.name == "reinforge.gateway.otlp_receiver"]
        assert len(warnings) == 1 and flood in warnings[0] and "not logged" in warnings[0]

        kept = await served.spans(flood)
        expected = [(1 + n).to_bytes(8, "big").hex() for n in range(3)] + [
            (11 + n).to_bytes(8, "big").hex() for n in range(2)
        ]
        assert sorted(kept) == sorted(expected)
        assert sorted(s.attributes[semconv.ATTR_SEQUENCE_IN_ATTEMPT] for s in kept.values()) == [
            0,
            1,
            2,
            3,
            4,
        ]
        assert len(await served.spans(calm)) == 3

        # Too large, as sent (the route table's limit) and once decompressed (the receiver's).
        big = served.post(calm, b"\x00" * 9000, served.headers(calm, **PROTOBUF))
        assert big.status_code == 413
        bomb = gzip.compress(b"\x00" * 100_000)
        inflated = served.post(calm, bomb, served.headers(calm, **PROTOBUF, **{"Content-Encoding": "gzip"}))
        assert (
            inflated.status_code == 413 and "decompresses to more than 4096 bytes" in status_of(inflated)[1]
        )
        assert len(await served.spans(calm)) == 3


async def test_invalid_spans_are_refused_alone_and_values_are_bounded(
    sqlite_store: SqlStore, tokenizer: Any
) -> None:
    limits = OtlpLimits(max_attributes=4, max_key_chars=8, max_value_chars=5, max_array_items=2, max_depth=2)
    app = serve_with_limits(sqlite_store, ScriptedBackend(tokenizer, ["ok"]), limits, max_body=1 << 20)
    with BackgroundServer(app) as server:
        served = Served(server.url, sqlite_store, app.state.gateway)
        attempt_id = (await running_attempt(sqlite_store)).attempt.attempt_id
        now = time.time()
        good = otlp_span(
            OTHER_SPAN,
            "na\x00me",
            now,
            attributes={
                "long": "abcdefghij",
                "very_long_key": 1,
                "list": [1, 2, 3],
                "deep": [[["x"]]],
                "fifth": 5,
            },
        )
        bad = [
            otlp_span(b"\x01" * 7, "short id", now),
            otlp_span(b"\x02" * 8, "zero trace", now, trace_id=b"\x00" * 16),
            otlp_span(b"\x03" * 8, "bad parent", now, parent_span_id=b"\x01\x02\x03"),
            otlp_span(b"\x04" * 8, "", now),
            otlp_span(b"\x05" * 8, semconv.SPAN_LLM_CALL, now),
            otlp_span(b"\x06" * 8, "no start", 0.0),
        ]
        response = served.post(
            attempt_id, export(good, *bad).SerializeToString(), served.headers(attempt_id, **PROTOBUF)
        )
        assert response.status_code == 200
        partial = ExportTraceServiceResponse.FromString(response.content).partial_success
        assert partial.rejected_spans == 6
        assert partial.error_message == (
            "a span has an invalid span_id: it must be 8 bytes, not all zero; "
            "span 0202020202020202 has an invalid trace_id: it must be 16 bytes, not all zero; "
            "span 0303030303030303 has an invalid parent_span_id: it must be 8 bytes"
        )
        [stored] = (await served.spans(attempt_id)).values()
        assert stored.name == "na\ufffdme"
        # Four attributes (the rest dropped), keys and strings cut, arrays cut, nesting bounded.
        assert {
            k: v
            for k, v in stored.attributes.items()
            if not k.startswith(("reinforge.", "otel.", "service."))
        } == {
            "long": "abcde",
            "very_lon": 1,
            "list": [1, 2],
            "deep": [None],
        }


async def test_a_large_export_is_decoded_off_the_loop_and_kept_in_start_order(served: Served) -> None:
    attempt_id = (await running_attempt(served.store)).attempt.attempt_id
    start = time.time()
    # Sent newest first, 1000 spans with a 100-character attribute each: well over 64 KiB.
    spans = [
        otlp_span((n + 1).to_bytes(8, "big"), f"step {n}", start + n / 1000, attributes={"note": "x" * 100})
        for n in reversed(range(1000))
    ]
    body = export(*spans).SerializeToString()
    assert len(body) > 128 * 1024
    response = served.post(attempt_id, body, served.headers(attempt_id, **PROTOBUF))
    assert response.status_code == 200
    assert not ExportTraceServiceResponse.FromString(response.content).HasField("partial_success")
    stored = sorted((await served.spans(attempt_id)).values(), key=lambda s: s.start_time)
    assert [s.name for s in stored] == [f"step {n}" for n in range(1000)]
    assert [s.attributes[semconv.ATTR_SEQUENCE_IN_ATTEMPT] for s in stored] == list(range(1000))


class GatedStore(MemoryStore):
    """A real store whose span writes wait until the test opens the gate (a store falling behind)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.stuck = threading.Event()

    async def add_spans(self, spans: Any) -> int:
        self.stuck.set()
        await asyncio.to_thread(self.gate.wait)
        return await super().add_spans(spans)


async def test_a_flood_waits_for_its_own_spans_and_leaves_the_queue_to_llm_calls(tokenizer: Any) -> None:
    store = GatedStore()
    limits = OtlpLimits(max_queued_spans=50)
    app = serve_with_limits(store, ScriptedBackend(tokenizer, ["ok"]), limits, 1 << 22, max_queued_spans=120)
    with BackgroundServer(app) as server:
        served = Served(server.url, store, app.state.gateway)  # type: ignore[arg-type]
        flood = (await running_attempt(store)).attempt.attempt_id
        calm = (await running_attempt(store)).attempt.attempt_id
        start = time.time()
        body = export(*(otlp_span((n + 1).to_bytes(8, "big"), f"s{n}", start) for n in range(400)))
        sending = asyncio.create_task(
            asyncio.to_thread(served.post, flood, body.SerializeToString(), served.headers(flood, **PROTOBUF))
        )
        assert await asyncio.to_thread(store.stuck.wait, 10), "the flood never reached the store"
        await asyncio.sleep(0.2)  # the flood has all the time it needs to fill the queue, if it could
        # The store is stuck and the flood is waiting; another attempt's LLM call still gets through.
        async with openai.AsyncOpenAI(
            base_url=f"{served.url}/r/{calm}/v1",
            api_key=served.gateway.keys.token_for(calm),
            max_retries=0,
            timeout=5,
        ) as client:
            reply = await client.chat.completions.create(
                model="p", messages=[{"role": "user", "content": "hi"}]
            )
        assert reply.choices[0].message.content == "ok"
        assert not sending.done() and served.gateway.recorder.queued <= limits.max_queued_spans + 1
        store.gate.set()
        response = await asyncio.wait_for(sending, 30)
        assert response.status_code == 200
        assert len(await served.spans(flood)) == 400
        assert [s.name for s in (await served.spans(calm)).values()] == [semconv.SPAN_LLM_CALL]


async def test_a_final_reward_span_sent_over_otlp_is_the_attempt_s_reward(served: Served) -> None:
    leased = await running_attempt(served.store)
    attempt_id = leased.attempt.attempt_id
    start = time.time()
    final = otlp_span(
        b"\x00\x00\x00\x00\x00\x00\x00\x07",
        semconv.SPAN_FINAL_REWARD,
        start,
        attributes={semconv.ATTR_STEP_KIND: semconv.STEP_REWARD, semconv.ATTR_REWARD_VALUE: 0.8},
    )
    response = served.post(
        attempt_id, export(final).SerializeToString(), served.headers(attempt_id, **PROTOBUF)
    )
    assert response.status_code == 200
    succeeded = AttemptOutcome(status=AttemptStatus.succeeded)
    rollout = await served.gateway.finish_attempt(attempt_id, succeeded)
    assert rollout.reward == 0.8
