"""`Gateway` without HTTP: admit a caller, generate, record; and a new API format is one adapter."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from reinforge import semconv
from reinforge.gateway import Gateway, create_gateway_app
from reinforge.gateway.errors import GatewayHTTPError
from reinforge.gateway.formats import ApiFormat, FormatContext
from reinforge.gateway.formats.base import Event
from reinforge.inference import ScriptedBackend
from reinforge.inference.contract import GenerationRequest, GenerationResult
from reinforge.net.background import BackgroundServer
from reinforge.store.memory import MemoryStore
from reinforge.types import SpanQuery

from .conftest import SECRET, running_attempt

PARENT = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"


async def test_the_domain_object_takes_values_not_requests(tokenizer: Any) -> None:
    store = MemoryStore()
    gateway = Gateway(store, ScriptedBackend(tokenizer, ["It is 5."]), SECRET)
    attempt_id = (await running_attempt(store)).attempt.attempt_id
    token = gateway.keys.token_for(attempt_id)
    with pytest.raises(GatewayHTTPError) as refused:
        await gateway.admit(attempt_id, "wrong")
    assert refused.value.http_status == 401 and refused.value.code == "invalid_api_key"
    with pytest.raises(GatewayHTTPError) as unknown:
        await gateway.admit("no-such-attempt", gateway.keys.token_for("no-such-attempt"))
    assert unknown.value.http_status == 404

    caller = await gateway.admit(attempt_id, token, agent="planner", traceparent=PARENT)
    await gateway.wait_for_policy(caller)
    result = await gateway.generate(GenerationRequest(messages=[{"role": "user", "content": "2+3?"}]))
    assert result.text == "It is 5."
    span_id = await gateway.record_call(
        caller,
        endpoint="chat.completions",
        request_body={"messages": []},
        response_body={"ok": True},
        result=result,
        started=1.0,
        latency_ms=2.0,
    )
    await gateway.flush(attempt_id)
    [stored] = (await store.query_spans(SpanQuery(attempt_id=attempt_id))).items
    assert stored.span_id == span_id and stored.parent_id == "cd" * 8 and stored.trace_id == "ab" * 16
    assert stored.attributes[semconv.ATTR_AGENT_NAME] == "planner"
    assert stored.attributes[semconv.ATTR_COMPLETION_TOKEN_IDS] == result.completion_token_ids
    assert gateway.calls == 1
    await gateway.close()


async def test_prepare_copies_the_request_only_when_it_changes(tokenizer: Any) -> None:
    store = MemoryStore()
    gateway = Gateway(store, ScriptedBackend(tokenizer, ["It is 5."]), SECRET)
    attempt_id = (await running_attempt(store)).attempt.attempt_id
    caller = await gateway.admit(attempt_id, gateway.keys.token_for(attempt_id))
    request = GenerationRequest(messages=[{"role": "user", "content": "2+3?"}])
    same, restored = gateway.prepare(caller, request)
    assert same is request and restored is not None and restored.unmatched == 0
    result = await gateway.generate(request)
    await gateway.record_call(
        caller,
        endpoint="chat.completions",
        request_body={},
        response_body={},
        result=result,
        started=1.0,
        latency_ms=1.0,
    )
    # A history the attempt did not write is sent on as it came; one it wrote is restored.
    foreign = GenerationRequest(messages=[*(request.messages or []), {"role": "assistant", "content": "7"}])
    kept, restored = gateway.prepare(caller, foreign)
    assert kept is foreign and restored is not None and restored.unmatched == 1
    own = GenerationRequest(
        messages=[*(request.messages or []), {"role": "assistant", "content": " It is 5. "}]
    )
    copied, restored = gateway.prepare(caller, own)
    assert copied is not own and restored is not None and restored.matched == 1
    assert copied.messages is not None and copied.messages[-1]["content"] == "It is 5."
    assert copied.generated_turns == {1: result.completion_token_ids}
    named, _ = gateway.prepare(
        await gateway.admit(attempt_id, gateway.keys.token_for(attempt_id), agent="solver"), request
    )
    assert named is not request and named.adapter == "solver" and request.adapter is None
    await gateway.close()


class _Echo(ApiFormat):
    """A toy format: `{"say": ...}` in, `{"said": ...}` out; streams `{"piece": ...}` events."""

    path = "/echo"
    endpoint = "echo"
    named_events = False
    ends_with_done = True

    def __init__(self, say: str, stream: bool) -> None:
        self.request = GenerationRequest(prompt=say)
        self.stream = stream

    @classmethod
    def parse(cls, data: dict[str, Any], context: FormatContext) -> _Echo:
        return cls(str(data["say"]), bool(data.get("stream")))

    def body(self, result: GenerationResult) -> dict[str, Any]:
        return {"said": result.text}

    def stream_start(self) -> list[Event]:
        return []

    def stream_text(self, text: str) -> list[Event]:
        return [{"piece": text}]

    def stream_end(self, result: GenerationResult, rest: str) -> tuple[list[Event], dict[str, Any]]:
        return ([{"piece": rest}] if rest else []), self.body(result)


class _PreparingBackend(ScriptedBackend):
    """A scripted backend that notes the requests prepared ahead of generation."""

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer, ["ok"])
        self.prepared: list[GenerationRequest] = []

    def prepare_ahead(self, request: GenerationRequest) -> None:
        self.prepared.append(request)


async def test_a_held_call_is_prepared_before_it_waits_and_a_free_one_is_not(tokenizer: Any) -> None:
    store = MemoryStore()
    backend = _PreparingBackend(tokenizer)
    gateway = Gateway(store, backend, SECRET)
    free, held = await running_attempt(store), await running_attempt(store)
    gateway.hold_rollouts([held.rollout.rollout_id], version=1)
    request = GenerationRequest(messages=[{"role": "user", "content": "2+3?"}])
    caller = await gateway.admit(free.attempt.attempt_id, gateway.keys.token_for(free.attempt.attempt_id))
    await gateway.wait_for_policy(caller, request)
    assert backend.prepared == []
    caller = await gateway.admit(held.attempt.attempt_id, gateway.keys.token_for(held.attempt.attempt_id))
    waiting = asyncio.create_task(gateway.wait_for_policy(caller, request))
    await asyncio.sleep(0.01)
    assert backend.prepared == [request] and not waiting.done()
    gateway.release_version(1)
    await asyncio.wait_for(waiting, 5)


async def test_a_new_format_is_one_adapter_on_the_same_serving_path(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from reinforge.gateway import routes

    monkeypatch.setattr(routes, "API_FORMATS", (*routes.API_FORMATS, _Echo))
    store = MemoryStore()
    app = create_gateway_app(store, ScriptedBackend(tokenizer, ["echoed"]), SECRET)
    assert any(route.path.endswith("/echo") for route in app.state.route_table.routes)
    with BackgroundServer(app) as server:
        attempt_id = (await running_attempt(store)).attempt.attempt_id
        gateway: Gateway = app.state.gateway
        headers = {"Authorization": f"Bearer {gateway.keys.token_for(attempt_id)}"}
        async with httpx.AsyncClient(base_url=f"{server.url}/r/{attempt_id}/v1", headers=headers) as http:
            plain = await http.post("/echo", json={"say": "hi"})
            streamed = await http.post("/echo", json={"say": "hi", "stream": True})
        assert plain.json() == {"said": "echoed"}
        assert streamed.text.endswith("data: [DONE]\n\n") and '"piece"' in streamed.text
        await gateway.flush(attempt_id)
        spans = (await store.query_spans(SpanQuery(attempt_id=attempt_id))).items
        assert [s.attributes[semconv.ATTR_LLM_ENDPOINT] for s in spans] == ["echo", "echo"]
