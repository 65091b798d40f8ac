"""A process that opens thousands of streaming chat calls and hangs up on each after its first bytes.

    python -m tests.misbehaving.stream_dropper BASE_URL API_KEY STREAMS AT_ONCE

Why a process of its own, on raw sockets: the flood is meant to load the gateway, not the test's
process; run in the test's process (beside the server) an HTTP client's own work would hold the GIL
the server needs, and the test would measure the client. Prints how many streams answered 200.
"""

from __future__ import annotations

import asyncio
import json
import sys
from urllib.parse import urlsplit


async def _drop_one(host: str, port: int, path: str, key: str) -> bool:
    body = json.dumps(
        {"model": "policy", "stream": True, "messages": [{"role": "user", "content": "hello"}]}
    ).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(head + body)
        status = await reader.readline()
        while (await reader.readline()) not in (b"\r\n", b""):
            pass  # the response's headers
        await reader.read(1)  # the first byte of the first event, then hang up mid-stream
        return b" 200 " in status
    finally:
        writer.close()


async def drop_streams(base_url: str, key: str, streams: int, at_once: int) -> int:
    url = urlsplit(base_url.rstrip("/") + "/chat/completions")
    host, port = url.hostname or "127.0.0.1", url.port or 80
    gate = asyncio.Semaphore(at_once)

    async def one() -> bool:
        async with gate:
            return await _drop_one(host, port, url.path, key)

    answered = await asyncio.gather(*(one() for _ in range(streams)))
    return sum(answered)


if __name__ == "__main__":
    base_url, key, streams, at_once = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    print(asyncio.run(drop_streams(base_url, key, streams, at_once)))
