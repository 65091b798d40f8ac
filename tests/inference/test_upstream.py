"""UpstreamBackend against a local server that replays responses in vLLM's and SGLang's real formats
(tests/fixtures/upstream), and end to end through the gateway with the openai client."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from reinforge import semconv
from reinforge.errors import InvalidRequestError, UpstreamError
from reinforge.gateway import create_gateway_app
from reinforge.inference import GenerationRequest, ResponseFormat, SamplingParams, UpstreamBackend
from reinforge.net.background import BackgroundServer
from reinforge.store.memory import MemoryStore
from reinforge.types import SpanQuery

from .conftest import SECRET, Served, running_attempt

FIXTURES = Path(__file__).parent.parent / "fixtures" / "upstream"


def fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


class FakeUpstream:
    """Replays recorded responses and keeps every payload it was sent."""

    def __init__(self) -> None:
        self.payloads: list[dict[str, Any]] = []
        self.chat = "vllm_chat.json"
        self.sglang = "sglang_generate.json"
        self.fail: tuple[int, dict[str, Any]] | None = None
        self.override: dict[str, Any] | None = None
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self.chat_route, methods=["POST"]),
                Route("/v1/completions", self.completions_route, methods=["POST"]),
                Route("/generate", self.generate_route, methods=["POST"]),
            ]
        )

    async def _payload(self, request: Request) -> dict[str, Any]:
        payload = await request.json()
        self.payloads.append(payload)
        return payload  # type: ignore[no-any-return]

    async def chat_route(self, request: Request) -> Response:
        payload = await self._payload(request)
        if self.fail is not None:
            return JSONResponse(self.fail[1], status_code=self.fail[0])
        if payload.get("stream"):
            events = (FIXTURES / "vllm_chat_stream.sse").read_bytes().split(b"\n\n")
            return StreamingResponse(iter([e + b"\n\n" for e in events if e]), media_type="text/event-stream")
        if self.override is not None:
            return JSONResponse(self.override)
        return JSONResponse(fixture("vllm_chat_tool.json" if payload.get("tools") else self.chat))

    async def completions_route(self, request: Request) -> Response:
        await self._payload(request)
        return JSONResponse(fixture("vllm_completion.json"))

    async def generate_route(self, request: Request) -> Response:
        await self._payload(request)
        return JSONResponse(fixture(self.sglang))


@pytest.fixture(scope="module")
def upstream() -> Iterator[tuple[FakeUpstream, str]]:
    fake = FakeUpstream()
    with BackgroundServer(fake.app) as server:
        yield fake, server.url


@pytest.fixture
def fake(upstream: tuple[FakeUpstream, str]) -> FakeUpstream:
    upstream[0].payloads.clear()
    upstream[0].chat, upstream[0].sglang, upstream[0].fail = "vllm_chat.json", "sglang_generate.json", None
    upstream[0].override = None
    return upstream[0]


def chat_request(**kwargs: Any) -> GenerationRequest:
    return GenerationRequest(
        messages=[{"role": "user", "content": "What is 2+3?"}],
        sampling=SamplingParams(temperature=0.6, top_p=0.9, max_tokens=32, seed=7),
        **kwargs,
    )


async def test_vllm_chat_reads_token_ids_fields(
    upstream: tuple[FakeUpstream, str], fake: FakeUpstream
) -> None:
    backend = UpstreamBackend(
        upstream[1] + "/v1", "Qwen/Qwen2.5-1.5B-Instruct", api_key="k", policy_version=2
    )
    result = await backend.generate(chat_request())
    recorded = fixture("vllm_chat.json")
    choice = recorded["choices"][0]
    assert result.prompt_token_ids == recorded["prompt_token_ids"]
    assert result.completion_token_ids == choice["token_ids"]
    assert result.logprobs == [e["logprob"] for e in choice["logprobs"]["content"]]
    assert (result.text, result.finish_reason, result.policy_version) == ("2 + 3 = 5.", "stop", 2)
    sent = fake.payloads[-1]
    assert (
        sent["return_token_ids"] is True
        and sent["return_tokens_as_token_ids"] is True
        and sent["logprobs"] is True
    )
    assert (sent["temperature"], sent["top_p"], sent["max_tokens"], sent["seed"]) == (0.6, 0.9, 32, 7)
    assert sent["model"] == "Qwen/Qwen2.5-1.5B-Instruct"
    await backend.aclose()


async def test_vllm_token_id_strings_fallback(upstream: tuple[FakeUpstream, str], fake: FakeUpstream) -> None:
    fake.chat = "vllm_chat_token_id_strings.json"
    result = await UpstreamBackend(upstream[1], "m").generate(chat_request())
    assert result.completion_token_ids == fixture("vllm_chat.json")["choices"][0]["token_ids"]


async def test_vllm_tool_calls(upstream: tuple[FakeUpstream, str], fake: FakeUpstream) -> None:
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
    result = await UpstreamBackend(upstream[1], "m").generate(chat_request(tools=tools, tool_choice="auto"))
    recorded = fixture("vllm_chat_tool.json")
    assert result.finish_reason == "tool_calls"
    assert [(c.name, json.loads(c.arguments)) for c in result.tool_calls] == [("calc", {"expression": "2+3"})]
    assert result.completion_token_ids == recorded["choices"][0]["token_ids"]
    assert result.text == "" and not result.malformed_tool_call
    assert fake.payloads[-1]["tools"] == tools and fake.payloads[-1]["tool_choice"] == "auto"


async def test_structured_output_and_shaping_reach_vllm_as_its_own_fields(
    upstream: tuple[FakeUpstream, str], fake: FakeUpstream
) -> None:
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}}
    sampling = SamplingParams(
        presence_penalty=0.5, frequency_penalty=-0.25, logit_bias={7: -100.0}, max_tokens=8
    )
    request = GenerationRequest(
        messages=[{"role": "user", "content": "2+3?"}],
        tools=tools,
        tool_choice={"type": "function", "function": {"name": "calc"}},
        parallel_tool_calls=False,
        response_format=ResponseFormat(type="json_schema", json_schema=schema, name="Answer"),
        sampling=sampling,
    )
    await UpstreamBackend(upstream[1], "m").generate(request)
    sent = fake.payloads[-1]
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "calc"}}
    assert sent["parallel_tool_calls"] is False
    assert sent["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "Answer", "schema": schema},
    }
    assert (sent["presence_penalty"], sent["frequency_penalty"], sent["logit_bias"]) == (
        0.5,
        -0.25,
        {"7": -100.0},
    )


async def test_sglang_gets_json_schemas_and_refuses_forced_tool_calls(
    upstream: tuple[FakeUpstream, str], fake: FakeUpstream
) -> None:
    backend = UpstreamBackend(upstream[1], "m", flavor="sglang")
    fmt = ResponseFormat(type="json_object")
    await backend.generate(
        GenerationRequest(prompt=[1, 2, 3], response_format=fmt, sampling=SamplingParams(presence_penalty=1))
    )
    params = fake.payloads[-1]["sampling_params"]
    assert json.loads(params["json_schema"]) == {"type": "object"} and params["presence_penalty"] == 1
    with pytest.raises(InvalidRequestError, match="tool_choice"):
        await backend.generate(GenerationRequest(prompt=[1, 2], tool_choice="required"))


async def test_vllm_stream(upstream: tuple[FakeUpstream, str], fake: FakeUpstream) -> None:
    items = [item async for item in UpstreamBackend(upstream[1], "m").stream(chat_request())]
    *deltas, result = items
    assert "".join(d.text for d in deltas) == "2 + 3 = 5."  # type: ignore[union-attr]
    recorded = fixture("vllm_chat.json")
    assert result.prompt_token_ids == recorded["prompt_token_ids"]  # type: ignore[union-attr]
    assert result.completion_token_ids == recorded["choices"][0]["token_ids"]  # type: ignore[union-attr]
    assert fake.payloads[-1]["stream"] is True


async def test_vllm_completions(upstream: tuple[FakeUpstream, str], fake: FakeUpstream) -> None:
    request = GenerationRequest(prompt="The capital of France is", sampling=SamplingParams(max_tokens=9))
    result = await UpstreamBackend(upstream[1], "m").generate(request)
    choice = fixture("vllm_completion.json")["choices"][0]
    assert result.prompt_token_ids == choice["prompt_token_ids"]
    assert result.completion_token_ids == choice["token_ids"]
    assert result.logprobs == choice["logprobs"]["token_logprobs"]
    assert result.finish_reason == "length"
    assert fake.payloads[-1]["logprobs"] == 0


async def test_sglang_text_prompt_reads_input_ids_back(
    upstream: tuple[FakeUpstream, str], fake: FakeUpstream
) -> None:
    request = GenerationRequest(prompt="What is 2+3?", sampling=SamplingParams(max_tokens=16, top_k=0))
    result = await UpstreamBackend(upstream[1], "m", flavor="sglang").generate(request)
    meta = fixture("sglang_generate.json")["meta_info"]
    assert result.prompt_token_ids == [e[1] for e in meta["input_token_logprobs"]]
    assert result.completion_token_ids == [e[1] for e in meta["output_token_logprobs"]]
    assert result.logprobs == [e[0] for e in meta["output_token_logprobs"]]
    assert result.policy_version == 3  # from meta_info.weight_version
    sent = fake.payloads[-1]
    assert (
        sent["return_logprob"] is True and sent["logprob_start_len"] == 0 and sent["text"] == "What is 2+3?"
    )
    assert sent["sampling_params"] == {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 16}


async def test_sglang_chat_sends_template_ids_and_parses_tool_calls(
    upstream: tuple[FakeUpstream, str], fake: FakeUpstream, tokenizer: Any
) -> None:
    fake.sglang = "sglang_generate_tool.json"
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
    backend = UpstreamBackend(upstream[1], "m", flavor="sglang", tokenizer=tokenizer)
    result = await backend.generate(chat_request(tools=tools))
    template = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2+3?"}], tools=tools, add_generation_prompt=True, tokenize=False
    )
    ids = tokenizer.encode(template, add_special_tokens=False)
    assert fake.payloads[-1]["input_ids"] == ids == result.prompt_token_ids
    assert result.finish_reason == "tool_calls"
    assert [(c.name, json.loads(c.arguments)) for c in result.tool_calls] == [("calc", {"expression": "2+3"})]
    assert result.completion_token_ids == fixture("sglang_generate_tool.json")["output_ids"]
    with pytest.raises(UpstreamError, match="tokenizer"):
        await UpstreamBackend(upstream[1], "m", flavor="sglang").generate(chat_request())


async def test_upstream_errors_are_mapped(upstream: tuple[FakeUpstream, str], fake: FakeUpstream) -> None:
    backend = UpstreamBackend(upstream[1], "m")
    fake.fail = (
        400,
        {"object": "error", "message": "This model's maximum context length is 32 tokens", "code": 400},
    )
    with pytest.raises(InvalidRequestError, match="maximum context length") as caught:
        await backend.generate(chat_request())
    assert caught.value.http_status == 400
    fake.fail = (500, {"message": "engine dead"})
    with pytest.raises(UpstreamError, match="500"):
        await backend.generate(chat_request())
    fake.fail = None
    # An old vLLM that ignores return_token_ids: no prompt ids, so nothing can be recorded.
    fake.override = fixture("vllm_chat_token_id_strings.json")
    fake.override.pop("prompt_token_ids")
    with pytest.raises(UpstreamError, match="no prompt token ids"):
        await backend.generate(chat_request())
    fake.override = fixture("vllm_chat.json")
    fake.override["choices"][0]["token_ids"].append(7)
    with pytest.raises(UpstreamError, match="10 token ids but 9 logprobs"):
        await backend.generate(chat_request())
    # Logprob tokens as text (no return_tokens_as_token_ids) are refused, never re-tokenised.
    fake.override = fixture("vllm_chat_token_id_strings.json")
    for entry in fake.override["choices"][0]["logprobs"]["content"]:
        entry["token"] = "x"
    with pytest.raises(UpstreamError, match="as text, not token ids"):
        await backend.generate(chat_request())
    with pytest.raises(UpstreamError, match="failed"):
        await UpstreamBackend("http://127.0.0.1:9", "m").generate(chat_request())


async def test_gateway_over_vllm_records_upstream_ids(
    upstream: tuple[FakeUpstream, str], fake: FakeUpstream
) -> None:
    store = MemoryStore()
    app = create_gateway_app(store, UpstreamBackend(upstream[1], "Qwen/Qwen2.5-1.5B-Instruct"), SECRET)
    with BackgroundServer(app) as server:
        served = Served(server.url, store, None, app)  # type: ignore[arg-type]
        attempt_id = (await running_attempt(store)).attempt.attempt_id
        client = served.client(attempt_id)
        response = await client.chat.completions.create(
            model="Qwen/Qwen2.5-1.5B-Instruct",
            messages=[{"role": "user", "content": "What is 2+3?"}],
            logprobs=True,
        )
        assert response.choices[0].message.content == "2 + 3 = 5."
        assert response.choices[0].logprobs is not None and response.choices[0].logprobs.content is not None
        assert response.choices[0].logprobs.content[0].token == "token_id:17"
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "What is 2+3?"}], stream=True
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        assert text == "2 + 3 = 5."
        await app.state.gateway.flush(attempt_id)
        spans = (await store.query_spans(SpanQuery(attempt_id=attempt_id))).items
        recorded = fixture("vllm_chat.json")
        assert len(spans) == 2
        for span in spans:
            assert span.attributes[semconv.ATTR_PROMPT_TOKEN_IDS] == recorded["prompt_token_ids"]
            assert span.attributes[semconv.ATTR_COMPLETION_TOKEN_IDS] == recorded["choices"][0]["token_ids"]
            assert span.attributes[semconv.ATTR_MODEL] == "Qwen/Qwen2.5-1.5B-Instruct"
        fake.fail = (503, {"message": "engine overloaded"})
        with pytest.raises(openai.InternalServerError, match="engine overloaded") as caught:
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        assert caught.value.status_code == 502
