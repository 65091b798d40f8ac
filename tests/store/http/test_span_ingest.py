"""Span ingest's pre-validated records (`span_records`) must store exactly what pydantic's path
stores, and must hand every body outside their narrow shape to pydantic, so bad input keeps its 4xx
errors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from reinforge.net.background import BackgroundServer
from reinforge.store.http.server import create_store_app
from reinforge.store.protocol import Store
from reinforge.store.span_records import SpanRecord, parse_span_batch
from reinforge.types import Span, SpanEvent, SpanKind, SpanQuery, SpanStatus, SpanStatusCode

from .conftest import TOKEN

LLM_ATTRS: dict[str, Any] = {
    "reinforge.step.kind": "llm",
    "gen_ai.prompt.token_ids": list(range(300)),
    "gen_ai.completion.logprobs": [-0.25 * i for i in range(40)],
    "gen_ai.request": {"messages": [{"role": "user", "content": "2+2 = ? ünïcødé \u2028"}], "n": None},
    "flag": True,
}


def _spans() -> list[Span]:
    return [
        Span(rollout_id="r1", attempt_id="a1", name="llm.call", kind=SpanKind.client, attributes=LLM_ATTRS),
        Span(
            rollout_id="r/2",
            attempt_id="a" * 128,
            name="tool",
            parent_id="0123456789abcdef",
            end_time=12.0,
            status=SpanStatus(code=SpanStatusCode.error, message="boom"),
            events=[SpanEvent(name="exception", timestamp=3.5, attributes={"k": [1, 2]})],
            sequence=7,
        ),
    ]


def _body(spans: list[dict[str, Any]]) -> bytes:
    return json.dumps({"spans": spans}).encode()


def test_records_hold_what_pydantic_would_store() -> None:
    spans = _spans()
    raw = _body([s.model_dump(mode="json") for s in spans])
    records = parse_span_batch(raw, 100)
    assert records is not None
    for record, span in zip(records, spans, strict=True):
        expected = span.model_copy(update={"sequence": None})
        assert Span.model_validate_json(record.body) == expected
        assert Span.model_validate_json(SpanRecord.from_span(span).body) == expected
        assert (record.span_id, record.rollout_id, record.attempt_id, record.name) == (
            span.span_id,
            span.rollout_id,
            span.attempt_id,
            span.name,
        )


def test_omitted_fields_get_the_model_defaults() -> None:
    raw = _body([{"rollout_id": "r", "attempt_id": "a", "name": "n", "start_time": 5}])
    [record] = parse_span_batch(raw, 10) or []
    span = Span.model_validate_json(record.body)
    assert span.start_time == 5.0 and isinstance(span.start_time, float)
    assert span.kind is SpanKind.internal and span.status == SpanStatus() and span.events == []
    assert len(span.span_id) == 16 and len(span.trace_id) == 32 and span.attributes == {}


@pytest.mark.parametrize(
    "span",
    [
        {"attempt_id": "a", "name": "n"},  # rollout_id missing
        {"rollout_id": "", "attempt_id": "a", "name": "n"},
        {"rollout_id": "r" * 129, "attempt_id": "a", "name": "n"},
        {"rollout_id": "r\x00", "attempt_id": "a", "name": "n"},
        {"rollout_id": 5, "attempt_id": "a", "name": "n"},
        {"rollout_id": "r", "attempt_id": "a", "name": "n", "span_id": "XYZ"},
        {"rollout_id": "r", "attempt_id": "a", "name": "n", "span_id": None},
        {"rollout_id": "r", "attempt_id": "a", "name": "n", "trace_id": "ab"},
        {"rollout_id": "r", "attempt_id": "a", "name": "n", "kind": "sideways"},
        {"rollout_id": "r", "attempt_id": "a", "name": "n", "kind": ["client"]},
        {"rollout_id": "r", "attempt_id": "a", "name": "n", "start_time": "5"},
        {"rollout_id": "r", "attempt_id": "a", "name": "n", "start_time": True},
        {"rollout_id": "r", "attempt_id": "a", "name": "n", "start_time": None},
        {"rollout_id": "r", "attempt_id": "a", "name": "n", "attributes": []},
        {"rollout_id": "r", "attempt_id": "a", "name": "n", "status": {"code": {}}},
        {"rollout_id": "r", "attempt_id": "a", "name": "n", "events": [{"name": "e"}]},
        {"rollout_id": "r", "attempt_id": "a", "name": "n", "sequence": 1.5},
        {"rollout_id": "r", "attempt_id": "a", "name": "n", "extra": 1},
        {"rollout_id": "r", "attempt_id": "a", "name": "n", "attributes": {"deep": [[[[[[[[]]]]]]]] * 30}},
        {"rollout_id": "r", "attempt_id": "a", "name": "n", "attributes": {"x": float("nan")}},
        {"rollout_id": "r", "attempt_id": "a", "name": "n", "end_time": 1e400},
    ],
)
def test_anything_unusual_goes_to_pydantic(span: dict[str, Any]) -> None:
    assert parse_span_batch(_body([span]), 10) is None


def test_attributes_pass_through_verbatim() -> None:
    """Integers beyond 64 bits, unicode and float spellings come back exactly as sent."""
    attributes = b'{"big": %d, "low": %d, "f": 1.5e-7, "s": "\\u00e9\xc3\xa9"}' % (2**70, -(2**63) - 1)
    raw = b'{"spans": [{"rollout_id": "r", "attempt_id": "a", "name": "n", "attributes": %s}]}' % attributes
    [record] = parse_span_batch(raw, 10) or []
    span = Span.model_validate_json(record.body)
    assert span.attributes == {"big": 2**70, "low": -(2**63) - 1, "f": 1.5e-7, "s": "\u00e9\u00e9"}


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"[]",
        b'{"spans": {}}',
        b'{"spans": [], "x": 1}',
        b"{bad json",
        b'{"spans": [{"rollout_id": "r", "attempt_id": "a", "name": "n", "attributes": {"s": "\xff"}}]}',
    ],
)
def test_bad_envelopes_go_to_pydantic(raw: bytes) -> None:
    assert parse_span_batch(raw, 10) is None


def test_too_many_spans_go_to_pydantic() -> None:
    assert parse_span_batch(_body([{"rollout_id": "r", "attempt_id": "a", "name": "n"}] * 3), 2) is None


@pytest.fixture
def sqlite_server(tmp_path: Path) -> Iterator[BackgroundServer]:
    from reinforge.store.factory import open_store

    async def factory() -> Store:
        return await open_store(f"sqlite:///{tmp_path / 'store.db'}")

    with BackgroundServer(create_store_app(factory, TOKEN)) as srv:
        yield srv


async def test_records_and_validated_paths_store_the_same_over_http(sqlite_server: BackgroundServer) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    spans = _spans()
    async with httpx.AsyncClient(base_url=sqlite_server.url, headers=headers) as http:
        records = await http.post("/store/spans", content=_body([s.model_dump(mode="json") for s in spans]))
        assert records.status_code == 200 and records.json() == {"added": 2}
        again = await http.post("/store/spans", content=_body([s.model_dump(mode="json") for s in spans]))
        assert again.json() == {"added": 0}
        # A float given as a string is off the records path, and refused there: the schema says number.
        lax = {**_spans()[0].model_dump(mode="json"), "start_time": "42.5"}
        refused = await http.post("/store/spans", content=_body([lax]))
        assert refused.status_code == 422 and "start_time" in refused.json()["error"]["message"]
        # Deep nesting is off the records path too; pydantic stores such a span the same way.
        nested: object = 1
        for _ in range(150):
            nested = [nested]
        deep = {**_spans()[0].model_dump(mode="json"), "start_time": 42.5, "attributes": {"d": nested}}
        assert parse_span_batch(_body([deep]), 10) is None
        assert (await http.post("/store/spans", content=_body([deep]))).json() == {"added": 1}
        page = await http.post("/store/spans/query", json=SpanQuery(rollout_id="r1").model_dump(mode="json"))
        stored = [Span.model_validate(s) for s in page.json()["items"]]
        assert [s.model_copy(update={"sequence": None}) for s in stored[:1]] == [spans[0]]
        assert stored[1].start_time == 42.5
        # Integers beyond 64 bits stay exact: attributes are stored as the text they arrived in.
        big = {**_spans()[0].model_dump(mode="json"), "span_id": "f" * 16, "attributes": {"n": 2**70}}
        assert (await http.post("/store/spans", content=_body([big]))).json() == {"added": 1}
        page = await http.post("/store/spans/query", json={"trace_id": big["trace_id"]})
        assert page.json()["items"][-1]["attributes"] == {"n": 2**70}


@pytest.mark.parametrize(
    ("span", "status", "fragment"),
    [
        ({"attempt_id": "a", "name": "n"}, 422, "body.spans.0.rollout_id"),
        ({"rollout_id": "r", "attempt_id": "a", "name": "n", "kind": "sideways"}, 422, "body.spans.0.kind"),
        ({"rollout_id": "r", "attempt_id": "a", "name": "n", "extra": 1}, 422, "body.spans.0.extra"),
        ({"rollout_id": "r\x00", "attempt_id": "a", "name": "n"}, 400, "NUL"),
    ],
)
async def test_bad_spans_keep_their_errors(
    sqlite_server: BackgroundServer, span: dict[str, Any], status: int, fragment: str
) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=sqlite_server.url, headers=headers) as http:
        response = await http.post("/store/spans", content=_body([span]))
    assert response.status_code == status
    assert fragment in response.json()["error"]["message"]


async def test_malformed_json_is_400_on_the_spans_route(sqlite_server: BackgroundServer) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=sqlite_server.url, headers=headers) as http:
        response = await http.post("/store/spans", content=b'{"spans": [')
        wrong_type = await http.post("/store/spans", content=b"{}", headers={"Content-Type": "text/plain"})
    assert response.status_code == 400 and "malformed JSON" in response.json()["error"]["message"]
    assert wrong_type.status_code == 400 and "application/json" in wrong_type.json()["error"]["message"]
