"""The real `anthropic` SDK against the gateway's Messages route on 127.0.0.1 (real store, tokenizer).

The backend follows the script of the recorded fixtures (tests/fixtures/frameworks/): a calculator
call that fails (`1/0`), a text + a retried call, then the answer, picked by how many tool results the
conversation holds, so a thread and a resent history get the same replies.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from reinforge import semconv
from reinforge.access import attempt_token
from reinforge.errors import InvalidRequestError
from reinforge.gateway.anthropic_bodies import messages_request, parse_messages_body
from reinforge.gateway.errors import GatewayHTTPError
from reinforge.gateway.formats import FormatContext
from reinforge.gateway.formats.anthropic_messages import AnthropicMessages, Threads
from reinforge.inference import ScriptedBackend, ScriptedReply, ScriptedToolCall
from reinforge.inference.contract import GenerationRequest, GenerationResult
from reinforge.types import AttemptOutcome, AttemptStatus, Span, SpanQuery

from .conftest import SECRET, Served, running_attempt, serve

anthropic = pytest.importorskip("anthropic")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "frameworks" / "anthropic"
QUESTION = "What is 6*7? Use the calculator."
TOOLS = [
    {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression and round the result.",
        "input_schema": {
            "type": "object",
            "properties": {"expression": {"type": "string"}, "precision": {"type": "integer"}},
            "required": ["expression"],
        },
    }
]
SCRIPT = [
    ScriptedReply(tool_calls=[ScriptedToolCall(name="calculator", arguments='{"expression":"1/0"}')]),
    ScriptedReply(
        text="Retrying with a valid expression.",
        tool_calls=[ScriptedToolCall(name="calculator", arguments={"precision": 2, "expression": "6*7"})],
    ),
    ScriptedReply(text="6*7 = 42."),
]


def by_tool_results(request: GenerationRequest) -> ScriptedReply:
    results = sum(1 for m in request.messages or [] if m["role"] == "tool")
    return SCRIPT[min(results, len(SCRIPT) - 1)]


@pytest.fixture
def calc(tokenizer: Any) -> Iterator[Served]:
    yield from serve(ScriptedBackend(tokenizer, by_tool_results))


Connect = Callable[..., Any]


@pytest.fixture
async def connect() -> AsyncIterator[Connect]:
    """`connect(served, attempt_id, agent=None, key=None)`: an SDK client on the attempt's base URL
    (`/r/<attempt>`, the SDK adds `/v1/messages`), closed after the test."""
    made: list[Any] = []

    def make(served: Served, attempt_id: str, agent: str | None = None, key: str | None = None) -> Any:
        base = f"{served.url}/r/{attempt_id}" + (f"/agents/{agent}" if agent else "")
        api_key = key if key is not None else attempt_token(SECRET, attempt_id)
        made.append(anthropic.AsyncAnthropic(base_url=base, api_key=api_key, max_retries=0))
        return made[-1]

    yield make
    for sdk in made:
        await sdk.close()


def post(served: Served, attempt_id: str, body: dict[str, Any], key: str | None = None) -> httpx.Response:
    headers = {"x-api-key": key if key is not None else attempt_token(SECRET, attempt_id)}
    return httpx.post(f"{served.url}/r/{attempt_id}/v1/messages", json=body, headers=headers, timeout=10)


async def llm_spans(served: Served, attempt_id: str) -> list[Span]:
    await served.gateway.flush(attempt_id)
    page = await served.store.query_spans(SpanQuery(attempt_id=attempt_id, name=semconv.SPAN_LLM_CALL))
    return page.items


def calculate(expression: str, precision: int = 2) -> str:
    a, op, b = expression.partition("/") if "/" in expression else expression.partition("*")
    value = int(a) / int(b) if op == "/" else int(a) * int(b)
    return str(round(value, precision))


async def tool_loop(anthropic_client: Any, stream: bool) -> tuple[str, list[Any]]:
    """The recorded agent: call, run each tool_use (a failure is an `is_error` result), repeat."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    replies = []
    for _ in range(5):
        options = {"model": "policy", "max_tokens": 256, "tools": TOOLS, "messages": messages}
        if stream:
            async with anthropic_client.messages.stream(**options) as events:
                reply = await events.get_final_message()
        else:
            reply = await anthropic_client.messages.create(**options)
        replies.append(reply)
        messages.append({"role": "assistant", "content": reply.content})
        if reply.stop_reason != "tool_use":
            return reply.content[0].text, replies
        results = []
        for block in reply.content:
            if block.type == "tool_use":
                try:
                    results.append(
                        {"type": "tool_result", "tool_use_id": block.id, "content": calculate(**block.input)}
                    )
                except Exception as exc:
                    results.append(
                        {
                            "type": "tool_result",
                            "tool_use_id": block.id,
                            "content": repr(exc),
                            "is_error": True,
                        }
                    )
        messages.append({"role": "user", "content": results})
    raise AssertionError("the loop did not end")


async def check_recorded(served: Served, attempt_id: str, replies: list[Any]) -> list[Span]:
    """Each call is a span with the backend's exact token ids and logprobs, and usage counts them."""
    spans = await llm_spans(served, attempt_id)
    requests = list(served.backend.requests)
    assert len(spans) == len(replies) == len(requests)
    for span, reply, request in zip(spans, replies, requests, strict=True):
        attrs = span.attributes
        expected = await served.backend.generate(request)  # deterministic for the same request
        assert attrs[semconv.ATTR_PROMPT_TOKEN_IDS] == expected.prompt_token_ids
        assert attrs[semconv.ATTR_COMPLETION_TOKEN_IDS] == expected.completion_token_ids
        assert attrs[semconv.ATTR_COMPLETION_LOGPROBS] == expected.logprobs
        assert attrs[semconv.ATTR_LLM_ENDPOINT] == "anthropic.messages"
        assert attrs[semconv.ATTR_LLM_RESPONSE]["id"] == reply.id
        assert reply.usage.input_tokens == len(expected.prompt_token_ids)
        assert reply.usage.output_tokens == len(expected.completion_token_ids)
    return spans


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
async def test_a_tool_loop_with_an_error_result(
    calc: Served, tokenizer: Any, stream: bool, connect: Connect
) -> None:
    attempt_id = (await running_attempt(calc.store)).attempt.attempt_id
    answer, replies = await tool_loop(connect(calc, attempt_id), stream)
    assert answer == "6*7 = 42."
    first, second, third = replies
    assert [r.stop_reason for r in replies] == ["tool_use", "tool_use", "end_turn"]
    assert all(r.id.startswith("msg_") and r.type == "message" and r.role == "assistant" for r in replies)
    [call] = first.content
    assert (call.type, call.name, call.input) == ("tool_use", "calculator", {"expression": "1/0"})
    text, retry = second.content
    assert (text.type, text.text) == ("text", "Retrying with a valid expression.")
    assert list(retry.input) == ["precision", "expression"]  # the model's key order
    assert [b.type for b in third.content] == ["text"]

    # What the backend got: OpenAI-style chat with tool calls and tool messages.
    final = calc.backend.requests[2]
    assert final.tools is not None and final.tools[0]["function"]["name"] == "calculator"
    user, made, failed, retried, result = final.messages or []
    assert user == {"role": "user", "content": QUESTION}
    assert made["role"] == "assistant" and made["content"] == ""
    [made_call] = made["tool_calls"]
    assert made_call["id"] == call.id and made_call["function"]["name"] == "calculator"
    assert json.loads(made_call["function"]["arguments"]) == {"expression": "1/0"}
    assert failed == {
        "role": "tool",
        "tool_call_id": call.id,
        "content": "ZeroDivisionError('division by zero')",
    }
    assert retried["content"] == "Retrying with a valid expression."
    assert list(json.loads(retried["tool_calls"][0]["function"]["arguments"])) == ["precision", "expression"]
    assert result == {"role": "tool", "tool_call_id": retry.id, "content": "42"}

    spans = await check_recorded(calc, attempt_id, replies)
    sent = spans[1].attributes[semconv.ATTR_LLM_REQUEST]["messages"][2]["content"][0]
    assert sent["is_error"] is True  # recorded as sent
    # The failed result is an AIR tool_error once (the third request repeats it), charged to the call
    # that made the tool call: recorded after it, before the call the result came with.
    page = await calc.store.query_spans(SpanQuery(attempt_id=attempt_id, name=semconv.SPAN_TOOL_RESULT))
    [failure] = page.items
    assert failure.attributes[semconv.ATTR_AIR_SIGNAL] == semconv.AIR_TOOL_ERROR
    assert (failure.attributes[semconv.ATTR_TOOL_NAME], failure.attributes[semconv.ATTR_TOOL_CALL_ID]) == (
        "calculator",
        call.id,
    )
    assert spans[0].start_time <= failure.start_time <= spans[1].start_time
    eos = tokenizer.eos_token_id
    assert spans[2].attributes[semconv.ATTR_COMPLETION_TOKEN_IDS] == [*tokenizer.encode("6*7 = 42."), eos]


async def test_the_stream_is_anthropics_event_sequence(calc: Served) -> None:
    attempt_id = (await running_attempt(calc.store)).attempt.attempt_id
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": QUESTION},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "calculator", "input": {}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "error"}]},
    ]
    body = {"model": "policy", "max_tokens": 64, "tools": TOOLS, "messages": messages, "stream": True}
    response = post(calc, attempt_id, body)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    frames = [f for f in response.text.split("\n\n") if f]
    events = []
    for frame in frames:
        name_line, data_line = frame.split("\n")
        event = json.loads(data_line.removeprefix("data: "))
        assert name_line == f"event: {event['type']}"
        events.append(event)
    kinds = [(e["type"], e.get("index"), (e.get("delta") or {}).get("type")) for e in events]
    text_deltas = [k for k in kinds if k[2] == "text_delta"]
    assert len(text_deltas) > 1, "the text should arrive in several deltas"
    assert kinds == [
        ("message_start", None, None),
        ("content_block_start", 0, None),
        *text_deltas,
        ("content_block_stop", 0, None),
        ("content_block_start", 1, None),
        ("content_block_delta", 1, "input_json_delta"),
        ("content_block_stop", 1, None),
        ("message_delta", None, None),
        ("message_stop", None, None),
    ]
    start = events[0]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["id"].startswith("msg_")
    assert "".join(e["delta"]["text"] for e in events if e.get("delta", {}).get("type") == "text_delta") == (
        "Retrying with a valid expression."
    )
    tool = events[-5]["content_block"]
    assert (tool["type"], tool["name"], tool["input"]) == ("tool_use", "calculator", {})
    assert events[-4]["delta"]["partial_json"] == '{"precision": 2, "expression": "6*7"}'
    delta = events[-2]
    assert delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    [span] = await llm_spans(calc, attempt_id)
    assert delta["usage"] == {
        "input_tokens": len(span.attributes[semconv.ATTR_PROMPT_TOKEN_IDS]),
        "output_tokens": len(span.attributes[semconv.ATTR_COMPLETION_TOKEN_IDS]),
    }
    assert span.attributes[semconv.ATTR_LLM_RESPONSE]["id"] == start["id"]
    assert calc.gateway.in_flight == 0


def calculator_tool() -> Any:
    @anthropic.beta_async_tool
    async def calculator(expression: str, precision: int = 2) -> str:
        """Evaluate an arithmetic expression and round the result."""
        return calculate(expression, precision)

    return calculator


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
async def test_the_tool_runner_on_server_held_threads(calc: Served, stream: bool, connect: Connect) -> None:
    leased = await running_attempt(calc.store)
    attempt_id = leased.attempt.attempt_id
    runner = connect(calc, attempt_id).beta.messages.tool_runner(
        model="policy",
        max_tokens=256,
        tools=[calculator_tool()],
        messages=[{"role": "user", "content": QUESTION}],
        stream=stream,
    )
    replies = []
    async for item in runner:
        replies.append(await item.get_final_message() if stream else item)
    assert replies[-1].content[0].text == "6*7 = 42."
    spans = await check_recorded(calc, attempt_id, replies)

    # The wire: one create with the tools, then continues that send only the new turn.
    sent = [s.attributes[semconv.ATTR_LLM_REQUEST] for s in spans]
    assert sent[0]["thread"] == {"type": "create"} and sent[0]["tools"][0]["name"] == "calculator"
    for before, request in zip(replies, sent[1:], strict=False):
        assert request["thread"] == {"type": "continue", "previous_message_id": before.id}
        assert "tools" not in request and [m["role"] for m in request["messages"]] == ["user"]
    assert sent[1]["messages"][0]["content"][0]["is_error"] is True

    # The backend saw the whole conversation each time, the replies as they were generated.
    final = calc.backend.requests[2].messages or []
    assert [m["role"] for m in final] == ["user", "assistant", "tool", "assistant", "tool"]
    assert calc.backend.requests[2].tools == calc.backend.requests[0].tools
    assert final[1]["content"] == "" and final[1]["tool_calls"][0]["function"]["arguments"] == (
        '{"expression":"1/0"}'
    )
    assert final[2] == {
        "role": "tool",
        "tool_call_id": replies[0].content[0].id,
        "content": "ZeroDivisionError('division by zero')",
    }
    assert final[3]["content"] == "Retrying with a valid expression."
    assert final[3]["tool_calls"][0]["function"]["arguments"] == '{"precision": 2, "expression": "6*7"}'
    assert final[4] == {"role": "tool", "tool_call_id": replies[1].content[1].id, "content": "42"}

    # One live thread, held in the attempt's memory; gone when the attempt is forgotten.
    state = await calc.gateway.attempts.state(attempt_id)
    assert len(Threads.of(state.extra)) == 1
    last = {"type": "continue", "previous_message_id": replies[-1].id}
    body = {"model": "p", "max_tokens": 16, "thread": last, "messages": [{"role": "user", "content": "ok?"}]}
    assert post(calc, attempt_id, body).status_code == 200
    other = (await running_attempt(calc.store)).attempt.attempt_id
    stranger = post(calc, other, body)
    assert (
        stranger.status_code == 404
        and stranger.json()["error"]["details"]["error_code"] == "thread_not_found"
    )
    again = post(calc, attempt_id, body)
    assert again.status_code == 400
    assert again.json()["error"]["details"]["error_code"] == "thread_already_continued"
    await calc.gateway.finish_attempt(attempt_id, AttemptOutcome(status=AttemptStatus.succeeded, reward=1.0))
    assert "anthropic.threads" not in (await calc.gateway.attempts.state(attempt_id)).extra


async def test_the_tool_runner_without_threads(calc: Served, connect: Connect) -> None:
    attempt_id = (await running_attempt(calc.store)).attempt.attempt_id
    runner = connect(calc, attempt_id).beta.messages.tool_runner(
        model="policy",
        max_tokens=256,
        tools=[calculator_tool()],
        messages=[{"role": "user", "content": QUESTION}],
        thread=False,
    )
    replies = [reply async for reply in runner]
    assert replies[-1].content[0].text == "6*7 = 42."
    spans = await check_recorded(calc, attempt_id, replies)
    sent = [s.attributes[semconv.ATTR_LLM_REQUEST] for s in spans]
    assert all("thread" not in r and r["tools"] for r in sent)
    assert [len(r["messages"]) for r in sent] == [1, 3, 5]
    state = await calc.gateway.attempts.state(attempt_id)
    assert "anthropic.threads" not in state.extra


async def test_a_lost_thread_is_replayed_by_the_sdk(calc: Served, connect: Connect) -> None:
    """`thread_not_found` (here: the attempt's memory was dropped) makes the SDK resend everything."""
    attempt_id = (await running_attempt(calc.store)).attempt.attempt_id
    runner = connect(calc, attempt_id).beta.messages.tool_runner(
        model="policy",
        max_tokens=256,
        tools=[calculator_tool()],
        messages=[{"role": "user", "content": QUESTION}],
    )
    replies = []
    async for reply in runner:
        replies.append(reply)
        calc.gateway.attempts.forget(attempt_id)
    assert replies[-1].content[0].text == "6*7 = 42."
    spans = await llm_spans(calc, attempt_id)
    sent = [s.attributes[semconv.ATTR_LLM_REQUEST] for s in spans]
    assert [len(r["messages"]) for r in sent] == [1, 3, 5]  # the whole history, each time
    assert sent[1]["thread"] == {"type": "create"}  # the replay of the continue that was refused


async def test_the_recorded_sdk_requests_are_all_accepted(calc: Served) -> None:
    for fixture in sorted(FIXTURES.glob("*.json")):
        recorded = json.loads(fixture.read_text())
        attempt_id = (await running_attempt(calc.store)).attempt.attempt_id
        ours: dict[str, str] = {}  # the recorded reply ids -> the ids this gateway answered with
        sent = []
        for exchange in recorded["requests"]:
            assert exchange["path"] == "/v1/messages"
            body = json.loads(json.dumps(exchange["body"]))
            thread = body.get("thread") or {}
            if thread.get("type") == "continue":
                thread["previous_message_id"] = ours[thread["previous_message_id"]]
            sent.append(body)
            headers = {
                k: v for k, v in exchange["headers"].items() if k in ("anthropic-version", "anthropic-beta")
            }
            headers["x-api-key"] = attempt_token(SECRET, attempt_id)
            response = httpx.post(
                f"{calc.url}/r/{attempt_id}/v1/messages", json=body, headers=headers, timeout=10
            )
            assert response.status_code == 200, (fixture.name, response.text)
            if body.get("stream"):
                assert response.text.rstrip().endswith('data: {"type":"message_stop"}')
                message_id = json.loads(response.text.split("\n")[1].removeprefix("data: "))["message"]["id"]
            else:
                message_id = response.json()["id"]
            ours[exchange["response"]["id"]] = message_id
        spans = await llm_spans(calc, attempt_id)
        assert [s.attributes[semconv.ATTR_LLM_REQUEST] for s in spans] == sent
        assert [s.attributes[semconv.ATTR_LLM_RESPONSE]["stop_reason"] for s in spans] == [
            r["response"]["stop_reason"] for r in recorded["requests"]
        ]


BASE = {"model": "policy", "max_tokens": 32, "messages": [{"role": "user", "content": "hi"}]}
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}


async def test_claude_codes_request_is_accepted(served: Served) -> None:
    """The fields and headers Claude Code 2.1 sends on every call (tests/harnesses runs the CLI itself):
    its warm-up HEAD on the base URL, `?beta=true`, beta headers, adaptive thinking, clear_thinking,
    effort, metadata, cache_control on system and message blocks."""
    attempt_id = (await running_attempt(served.store)).attempt.attempt_id
    assert httpx.head(f"{served.url}/r/{attempt_id}", timeout=10).status_code == 200
    cached = {"cache_control": {"type": "ephemeral"}}
    body = {
        **BASE,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1"},
            {"type": "text", "text": "You are Claude Code.", **cached},
        ],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi", **cached}]}],
        "metadata": {"user_id": '{"device_id":"d","session_id":"s"}'},
        "thinking": {"type": "adaptive"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
        "stream": True,
    }
    headers = {
        "x-api-key": attempt_token(SECRET, attempt_id),
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,effort-2025-11-24",
    }
    url = f"{served.url}/r/{attempt_id}/v1/messages?beta=true"
    response = httpx.post(url, json=body, headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    events = [line.split(": ", 1)[1] for line in response.text.splitlines() if line.startswith("event: ")]
    assert events[0] == "message_start" and events[-1] == "message_stop"
    [request] = served.backend.requests
    assert (request.messages or [])[0]["content"].endswith("You are Claude Code.")


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        ({**BASE, "frobnicate": 1}, "frobnicate", "unknown field"),
        ({k: v for k, v in BASE.items() if k != "max_tokens"}, "max_tokens", "required"),
        (
            {**BASE, "messages": [{"role": "user", "content": [IMAGE]}]},
            "messages.0.content.0.type",
            "'image'",
        ),
        (
            {**BASE, "messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
            "messages.0.content.0.type",
            "'document'",
        ),
        (
            {
                **BASE,
                "messages": [
                    {"role": "user", "content": "hi"},
                    {
                        "role": "assistant",
                        "content": [{"type": "thinking", "thinking": "hm", "signature": "s"}],
                    },
                ],
            },
            "messages.1.content.0.type",
            "'thinking'",
        ),
        ({**BASE, "thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking.type", "'enabled'"),
        (
            {**BASE, "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}},
            "context_management.edits.0.type",
            "'clear_tool_uses_20250919'",
        ),
        (
            {**BASE, "output_config": {"format": {"type": "json_schema"}}},
            "output_config.format",
            "unknown field",
        ),
        (
            {**BASE, "messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "x": 1}]}]},
            "messages.0.content.0.x",
            "unknown field",
        ),
        (
            {
                **BASE,
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "t", "content": [IMAGE]}],
                    }
                ],
            },
            "messages.0.content.0.content.0.type",
            "'image'",
        ),
        (
            {
                **BASE,
                "messages": [
                    {"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}
                ],
            },
            "messages.0.content.0.type",
            "assistant messages",
        ),
        ({**BASE, "messages": [{"role": "system", "content": "hi"}]}, "messages.0.role", "'system'"),
        (
            {**BASE, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
            "tools.0.type",
            "web_search",
        ),
        ({**BASE, "tools": [{"name": "f"}]}, "tools.0.input_schema", "required"),
        ({**BASE, "tool_choice": {"type": "tool"}}, "tool_choice.name", "names the tool"),
        ({**BASE, "temperature": 11}, "temperature", "less than or equal"),
        ({**BASE, "max_tokens": 0}, "max_tokens", "greater than or equal"),
        ({**BASE, "messages": []}, "messages", "at least one"),
        ({**BASE, "thread": {"type": "continue"}}, "thread.previous_message_id", "names the reply"),
        (
            {**BASE, "tools": TOOLS, "thread": {"type": "continue", "previous_message_id": "msg_x"}},
            "tools",
            "created with",
        ),
    ],
)
async def test_bad_bodies_are_400s_naming_the_field(
    served: Served, body: dict[str, Any], param: str, fragment: str
) -> None:
    attempt_id = (await running_attempt(served.store)).attempt.attempt_id
    response = post(served, attempt_id, body)
    assert response.status_code == 400, response.text
    envelope = response.json()
    assert envelope["type"] == "error" and envelope["error"]["type"] == "invalid_request_error"
    assert envelope["error"]["message"].startswith(f"{param}: ")
    assert fragment in envelope["error"]["message"]
    assert served.backend.requests == []


async def test_the_sdk_raises_its_typed_errors(served: Served, connect: Connect) -> None:
    attempt_id = (await running_attempt(served.store)).attempt.attempt_id
    sdk = connect(served, attempt_id)
    with pytest.raises(anthropic.BadRequestError, match=r"messages\.0\.content\.0\.type") as bad:
        await sdk.messages.create(model="p", max_tokens=8, messages=[{"role": "user", "content": [IMAGE]}])
    assert bad.value.type == "invalid_request_error"
    thread = {"type": "continue", "previous_message_id": "msg_nowhere"}
    with pytest.raises(anthropic.NotFoundError, match="msg_nowhere") as lost:
        await sdk.beta.messages.create(model="p", max_tokens=8, messages=BASE["messages"], thread=thread)
    assert lost.value.error_code == "thread_not_found"
    assert type(lost.value).__name__ == "ThreadNotFoundError"


async def test_a_wrong_key_is_401_in_anthropics_envelope(served: Served, connect: Connect) -> None:
    attempt_id = (await running_attempt(served.store)).attempt.attempt_id
    other = (await running_attempt(served.store)).attempt.attempt_id
    wrong = post(served, attempt_id, BASE, key=attempt_token(SECRET, other))
    assert wrong.status_code == 401
    assert wrong.json()["type"] == "error"
    assert wrong.json()["error"]["type"] == "authentication_error"
    assert "not valid for attempt" in wrong.json()["error"]["message"]
    assert post(served, attempt_id, BASE, key="").status_code == 401
    right = post(served, attempt_id, BASE)  # the key in x-api-key
    assert right.status_code == 200 and right.json()["content"] == [
        {"type": "text", "text": "The answer is 5."}
    ]
    sdk = connect(served, attempt_id, key=attempt_token(SECRET, other))
    with pytest.raises(anthropic.AuthenticationError, match="not valid for attempt"):
        await sdk.messages.create(model="p", max_tokens=8, messages=BASE["messages"])
    # Other routes keep OpenAI's envelope, and take the key from x-api-key as well.
    chat = httpx.post(
        f"{served.url}/r/{attempt_id}/v1/chat/completions",
        json={"messages": BASE["messages"]},
        headers={"x-api-key": "nope"},
        timeout=10,
    )
    assert chat.status_code == 401 and chat.json()["error"]["type"] == "authentication_error"


async def test_sampling_options_reach_the_backend_and_stop_reasons(served: Served, connect: Connect) -> None:
    leased = await running_attempt(served.store)
    attempt_id = leased.attempt.attempt_id
    sdk = connect(served, attempt_id, agent="planner")
    reply = await sdk.messages.create(
        model="p",
        max_tokens=3,
        system=[{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Use digits."}],
        messages=BASE["messages"],
        metadata={"user_id": "u1"},
        extra_body={"temperature": 0.5, "top_p": 0.9, "top_k": 7},  # older SDKs' own parameters
    )
    assert reply.stop_reason == "max_tokens" and reply.usage.output_tokens == 3
    request = served.backend.requests[-1]
    assert request.messages == [
        {"role": "system", "content": "Be brief.\nUse digits."},
        {"role": "user", "content": "hi"},
    ]
    sampling = request.sampling
    assert (sampling.max_tokens, sampling.temperature, sampling.top_p, sampling.top_k) == (3, 0.5, 0.9, 7)
    stopped = await sdk.messages.create(
        model="p", max_tokens=64, messages=BASE["messages"], stop_sequences=[" is"]
    )
    assert served.backend.requests[-1].sampling.stop == [" is"]
    assert stopped.content[0].text == "The answer"
    spans = await llm_spans(served, attempt_id)
    assert [s.attributes[semconv.ATTR_AGENT_NAME] for s in spans] == ["planner", "planner"]
    assert [s.attributes[semconv.ATTR_FINISH_REASON] for s in spans] == ["length", "stop"]


def test_content_blocks_become_chat_messages_in_their_order() -> None:
    body = parse_messages_body(
        {
            **BASE,
            "system": "Be brief.",
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "Two calls."},
                        {"type": "tool_use", "id": "a", "name": "f", "input": {"z": 1, "a": "é"}},
                        {"type": "tool_use", "id": "b", "name": "g", "input": {}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "a",
                            "content": [{"type": "text", "text": "1"}],
                        },
                        {"type": "tool_result", "tool_use_id": "b", "is_error": True},
                        {"type": "text", "text": "and?"},
                    ],
                },
            ],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        }
    )
    request = messages_request(body)
    assert request.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "Two calls.",
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "f", "arguments": '{"z": 1, "a": "é"}'}},
                {"id": "b", "type": "function", "function": {"name": "g", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": "1"},
        {"role": "tool", "tool_call_id": "b", "content": ""},
        {"role": "user", "content": "and?"},
    ]
    assert (request.tool_choice, request.parallel_tool_calls) == ("required", False)
    cited = {
        **BASE,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "x", "citations": [{}]}]}],
    }
    with pytest.raises(GatewayHTTPError, match=r"^messages\.0\.content\.0\.citations: .*not supported"):
        parse_messages_body(cited)


def test_a_stop_sequence_the_tokens_show_is_named(tokenizer: Any) -> None:
    """vLLM and the engine cut a matched stop string from the text but keep its tokens."""
    backend = ScriptedBackend(tokenizer, ["unused"])
    body = {**BASE, "stop_sequences": ["Stop", " thank"]}
    call = AnthropicMessages.parse(body, FormatContext("policy", backend.token_texts))
    ids = tokenizer.encode("Hello there, how are you today? I am fine, thank you", add_special_tokens=False)
    text = "Hello there, how are you today? I am fine,"
    result = GenerationResult(
        text=text,
        prompt_token_ids=[1],
        completion_token_ids=ids,
        logprobs=[-0.1] * len(ids),
        finish_reason="stop",
    )
    message = call.body(result)
    assert (message["stop_reason"], message["stop_sequence"]) == ("stop_sequence", " thank")
    eos = [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]
    plain = call.body(result.model_copy(update={"completion_token_ids": eos, "logprobs": [-0.1] * len(eos)}))
    assert (plain["stop_reason"], plain["stop_sequence"]) == ("end_turn", None)


async def test_a_backend_refusal_is_an_error_event_mid_stream(tokenizer: Any, connect: Connect) -> None:
    def refuse(request: Any) -> str:
        raise InvalidRequestError("the prompt is longer than the model's 2048-token context")

    for served in serve(ScriptedBackend(tokenizer, refuse)):
        attempt_id = (await running_attempt(served.store)).attempt.attempt_id
        sdk = connect(served, attempt_id)
        with pytest.raises(anthropic.BadRequestError, match="2048-token context"):
            await sdk.messages.create(model="p", max_tokens=8, messages=BASE["messages"])
        with pytest.raises(anthropic.APIStatusError, match="2048-token context") as broken:
            async with sdk.messages.stream(model="p", max_tokens=8, messages=BASE["messages"]) as events:
                await events.get_final_message()
        assert broken.value.body["error"]["type"] == "invalid_request_error"  # an `error` event
        assert served.gateway.in_flight == 0


def test_a_reply_sent_back_as_the_sdk_dumps_it_is_accepted() -> None:
    """`ToolUseBlock.model_dump()` adds `caller` and `toolset_name` (None): accepted; a set one is not."""
    dumped = anthropic.types.ToolUseBlock(
        id="toolu_1", input={"x": 1}, name="calc", type="tool_use"
    ).model_dump()
    body = {
        "model": "m",
        "max_tokens": 8,
        "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [dumped]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "1"}]},
        ],
    }
    parsed = parse_messages_body(body)
    assert parsed.messages[1].content[0].id == "toolu_1"  # type: ignore[union-attr]
    body["messages"][1]["content"][0]["caller"] = {"type": "code_execution"}  # type: ignore[index]
    with pytest.raises(GatewayHTTPError, match="caller"):
        parse_messages_body(body)
