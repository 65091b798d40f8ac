"""The bare HTTP/1.1 server under the benchmarks' fake upstreams: keep-alive, no framework.

A request is parsed just enough to find its end (Content-Length bodies only) and handed to a
`respond(method, path, body) -> bytes` function that returns the whole response, so an upstream adds
as little as possible to the latencies the benchmarks compare.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

Respond = Callable[[str, str, bytes], bytes]


def http_response(status: str, body: bytes) -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
        "connection: keep-alive\r\n\r\n"
    )
    return head.encode() + body


class RawHttpProtocol(asyncio.Protocol):
    def __init__(self, respond: Respond) -> None:
        self.respond = respond

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            if len(self.buffer) < end + 4 + length:
                return
            body, self.buffer = self.buffer[end + 4 : end + 4 + length], self.buffer[end + 4 + length :]
            method, path = head.split(" ", 2)[:2]
            self.transport.write(self.respond(method, path, body))


async def serve(port: int, respond: Respond) -> None:
    server = await asyncio.get_running_loop().create_server(
        lambda: RawHttpProtocol(respond), "127.0.0.1", port
    )
    async with server:
        await server.serve_forever()
