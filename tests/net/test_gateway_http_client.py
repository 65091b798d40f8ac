"""`gateway_http_client` / `KeepAliveTransport`: the real OpenAI SDK (on httpx2) and httpx over
reinforge's own HTTP/1.1 transport, against the real gateway on 127.0.0.1 and a few raw asyncio
servers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest

from reinforge import semconv
from reinforge.access import attempt_token
from reinforge.inference import ScriptedBackend, ScriptedReply, ScriptedToolCall
from reinforge.runner import KeepAliveTransport, gateway_http_client
from reinforge.types import SpanQuery

from .conftest import SECRET, Served, running_attempt, serve

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "Evaluate an arithmetic expression",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]


def fast_client(served: Served, attempt_id: str, **kw: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"{served.url}/r/{attempt_id}/v1",
        api_key=attempt_token(SECRET, attempt_id),
        max_retries=0,
        http_client=gateway_http_client(),
        **kw,
    )


def pooled(transport: KeepAliveTransport) -> int:
    pool = transport._pools[asyncio.get_running_loop()]
    return sum(len(origin.idle) for origin in pool.origins.values())


async def test_chat_through_the_transport_matches_the_default_client(served: Served) -> None:
    leased = await running_attempt(served.store)
    attempt_id = leased.attempt.attempt_id
    messages = [{"role": "user", "content": "What is 2+3?"}]
    fast = await fast_client(served, attempt_id).chat.completions.create(
        model="policy",
        messages=messages,
        max_tokens=32,
        seed=1,  # type: ignore[arg-type]
    )
    plain = await served.client(attempt_id).chat.completions.create(
        model="policy",
        messages=messages,
        max_tokens=32,
        seed=1,  # type: ignore[arg-type]
    )
    assert fast.choices[0].message.content == plain.choices[0].message.content == "The answer is 5."
    assert fast.usage is not None and plain.usage is not None
    assert fast.usage.completion_tokens == plain.usage.completion_tokens > 0
    await served.gateway.flush(attempt_id)
    spans = await served.store.query_spans(SpanQuery(attempt_id=attempt_id, name=semconv.SPAN_LLM_CALL))
    assert len(spans.items) == 2  # both calls recorded, whichever transport carried them


async def test_connections_are_kept_alive_and_shared(served: Served) -> None:
    leased = await running_attempt(served.store)
    attempt_id = leased.attempt.attempt_id
    client = fast_client(served, attempt_id)
    for _ in range(5):
        await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
    transport = gateway_http_client()._transport
    assert isinstance(transport, KeepAliveTransport)
    assert pooled(transport) == 1  # five sequential calls, one connection
    # Concurrent calls open more connections, and all of them go back to the pool.
    await asyncio.gather(
        *(
            client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
            for _ in range(4)
        )
    )
    assert pooled(transport) == 4
    assert gateway_http_client() is gateway_http_client()  # one client per event loop


async def test_tool_calls_and_streaming(tokenizer: Any) -> None:
    reply = ScriptedReply(
        text="", tool_calls=[ScriptedToolCall(name="calc", arguments={"expression": "2+3"})]
    )
    for served in serve(ScriptedBackend(tokenizer, [reply, "The answer is 5."])):
        leased = await running_attempt(served.store)
        client = fast_client(served, leased.attempt.attempt_id)
        first = await client.chat.completions.create(
            model="policy",
            messages=[{"role": "user", "content": "2+3?"}],
            tools=TOOLS,  # type: ignore[arg-type]
        )
        calls = first.choices[0].message.tool_calls or []
        assert [(c.function.name, c.function.arguments) for c in calls] == [("calc", '{"expression": "2+3"}')]
        stream = await client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "again"}], stream=True
        )
        chunks = [chunk async for chunk in stream]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == "The answer is 5."
        assert chunks[-1].choices[-1].finish_reason == "stop"


async def test_gateway_errors_keep_their_status_and_message(served: Served) -> None:
    leased = await running_attempt(served.store)
    client = openai.AsyncOpenAI(
        base_url=f"{served.url}/r/{leased.attempt.attempt_id}/v1",
        api_key="wrong-key",
        max_retries=0,
        http_client=gateway_http_client(),
    )
    with pytest.raises(openai.AuthenticationError) as caught:
        await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 401
    assert "token" in str(caught.value).lower()


async def test_plain_httpx_clients_work_too(served: Served) -> None:
    async with httpx.AsyncClient(transport=KeepAliveTransport()) as client:
        response = await client.get(f"{served.url}/health")
        assert response.status_code == 200
        assert response.json()["status"] == "ok"
        assert response.headers["content-type"].startswith("application/json")
        head = await client.head(f"{served.url}/health")  # no body follows: httpx's transport reads it
        assert head.status_code == 200 and head.content == b""


async def raw_server(handler: Any) -> AsyncIterator[str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        ),
        0,
    )
    return head + (await reader.readexactly(length) if length else b"")


async def test_a_connection_the_server_closed_is_replaced() -> None:
    served_requests: list[bytes] = []

    async def answer_once_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        served_requests.append(await read_request(reader))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()  # without "Connection: close": the client learns only from the socket

    async for url in raw_server(answer_once_then_close):
        async with httpx.AsyncClient(transport=KeepAliveTransport()) as client:
            for _ in range(3):
                response = await client.post(url + "/x", content=b"body")
                assert (response.status_code, response.text) == (200, "ok")
    assert len(served_requests) == 3
    assert all(r.endswith(b"\r\n\r\nbody") and r.startswith(b"POST /x HTTP/1.1\r\n") for r in served_requests)


async def test_chunked_bodies_stream_as_they_arrive() -> None:
    release = asyncio.Event()

    async def chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()
        await release.wait()
        writer.write(b"6\r\nsecond\r\n0\r\n\r\n")
        await writer.drain()

    async for url in raw_server(chunked):
        async with (
            httpx.AsyncClient(transport=KeepAliveTransport()) as client,
            client.stream("GET", url) as response,
        ):
            parts = response.aiter_bytes()
            assert await parts.__anext__() == b"first"  # before the rest was even sent
            release.set()
            assert b"".join([chunk async for chunk in parts]) == b"second"


async def test_timeouts_and_refused_connections_raise_httpx_errors() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(5)

    async for url in raw_server(silent):
        async with httpx.AsyncClient(transport=KeepAliveTransport(), timeout=0.2) as client:
            with pytest.raises(httpx.ReadTimeout):
                await client.get(url)
    async with httpx.AsyncClient(transport=KeepAliveTransport()) as client:
        with pytest.raises(httpx.ConnectError):
            await client.get("http://127.0.0.1:9/")  # the discard port: nothing listens
