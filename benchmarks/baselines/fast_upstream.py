"""A minimal, fast OpenAI-compatible upstream that answers every chat completion with one fixed reply.

`python benchmarks/baselines/fast_upstream.py PORT` serves 127.0.0.1:PORT. The reply carries vLLM's
token fields (`prompt_token_ids`, each choice's `token_ids`, `logprobs.content` with
`return_tokens_as_token_ids`-style tokens), so a gateway that records token ids accepts it. It is a
bare asyncio protocol with a pre-serialised response, so it adds as little as possible to the
latency that the gateways under test are compared on. GET /health answers 200.
"""

from __future__ import annotations

import asyncio
import json
import sys

PROMPT_IDS = list(range(100, 124))
COMPLETION_IDS = [11, 12, 13, 14, 15, 16, 17, 2]


def _response_body() -> bytes:
    body = {
        "id": "chatcmpl-fast",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "policy",
        "prompt_token_ids": PROMPT_IDS,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "The answer is 4."},
                "finish_reason": "stop",
                "token_ids": COMPLETION_IDS,
                "logprobs": {
                    "content": [
                        {"token": f"token_id:{t}", "logprob": -0.25, "bytes": None, "top_logprobs": []}
                        for t in COMPLETION_IDS
                    ]
                },
            }
        ],
        "usage": {
            "prompt_tokens": len(PROMPT_IDS),
            "completion_tokens": len(COMPLETION_IDS),
            "total_tokens": len(PROMPT_IDS) + len(COMPLETION_IDS),
        },
    }
    return json.dumps(body).encode()


def _http(status: str, body: bytes) -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
        "connection: keep-alive\r\n\r\n"
    )
    return head.encode() + body


CHAT = _http("200 OK", _response_body())
HEALTH = _http("200 OK", b'{"status":"ok"}')
NOT_FOUND = _http("404 Not Found", b'{"error":{"message":"not found"}}')


class _Upstream(asyncio.Protocol):
    """HTTP/1.1 with keep-alive; requests are parsed just enough to find their end."""

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
            self.buffer = self.buffer[end + 4 + length :]
            method, path = head.split(" ", 2)[:2]
            if method == "POST" and path.endswith("/chat/completions"):
                self.transport.write(CHAT)
            elif path.startswith("/health"):
                self.transport.write(HEALTH)
            else:
                self.transport.write(NOT_FOUND)


async def serve(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(_Upstream, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1])))
