"""The floor under any Python gateway: a proxy that forwards each HTTP/1.1 message's bytes and nothing more.

`python benchmarks/baselines/forwarding_proxy.py UPSTREAM_PORT PORT` serves 127.0.0.1:PORT. Each
client connection gets its own keep-alive connection to the upstream; a request is framed (Content-
Length bodies only), written to the upstream as it came, and the upstream's response written back as
it came. No parsing, no JSON, no recording, no tasks: what is left is the event loop and the two extra
socket hops a gateway cannot avoid. `gateway_bench.py --floor` measures it beside the gateways, so the
figures say how much of a gateway's added latency is its own work.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from event_loop import run


def _message_end(buffer: bytes) -> int:
    """The end of the first whole message in `buffer` (Content-Length framing), or -1."""
    head_end = buffer.find(b"\r\n\r\n")
    if head_end < 0:
        return -1
    length = 0
    for line in buffer[:head_end].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    end = head_end + 4 + length
    return end if len(buffer) >= end else -1


class _Framed(asyncio.Protocol):
    """A connection that writes each whole message it reads to its peer connection, as it came."""

    def __init__(self) -> None:
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.peer: _Framed | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.peer is None or self.peer.transport is None:
            return  # a client's first bytes, before its upstream connection is open: kept for then
        while (end := _message_end(self.buffer)) >= 0:
            message, self.buffer = self.buffer[:end], self.buffer[end:]
            self.peer.transport.write(message)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()


class _Client(_Framed):
    """A downstream connection, with its own upstream connection."""

    def __init__(self, upstream_port: int) -> None:
        super().__init__()
        self.upstream_port = upstream_port

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        _, upstream = await asyncio.get_running_loop().create_connection(
            _Framed, "127.0.0.1", self.upstream_port
        )
        upstream.peer, self.peer = self, upstream
        self.data_received(b"")  # what arrived while connecting


async def serve(upstream_port: int, port: int) -> None:
    server = await asyncio.get_running_loop().create_server(lambda: _Client(upstream_port), "127.0.0.1", port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    run(lambda: serve(int(sys.argv[1]), int(sys.argv[2])))
