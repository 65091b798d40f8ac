"""A minimal, fast OpenAI-compatible upstream that answers every chat completion with one fixed reply.

`python benchmarks/baselines/fast_upstream.py PORT` serves 127.0.0.1:PORT. The reply carries vLLM's
token fields (`prompt_token_ids`, each choice's `token_ids`, `logprobs.content` with
`return_tokens_as_token_ids`-style tokens), so a gateway that records token ids accepts it. It is a
bare asyncio protocol (`raw_http.py`) with a pre-serialised response, so it adds as little as possible to the
latency that the gateways under test are compared on. GET /health answers 200.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from raw_http import http_response, serve

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


CHAT = http_response("200 OK", _response_body())
HEALTH = http_response("200 OK", b'{"status":"ok"}')
NOT_FOUND = http_response("404 Not Found", b'{"error":{"message":"not found"}}')


def respond(method: str, path: str, body: bytes) -> bytes:
    if method == "POST" and path.endswith("/chat/completions"):
        return CHAT
    if path.startswith("/health"):
        return HEALTH
    return NOT_FOUND


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1]), respond))
