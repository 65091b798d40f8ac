"""The recorded LLM call both stores ingest: a vLLM-style chat completion of about 7.7 KB.

Both sides get the same conversation, token ids and logprobs; only the envelope differs (an
agentlightning `model_request` event vs. a reinforge LLM-call span), and each envelope is padded to
the same serialised size, so neither store is timed on a smaller body.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

SPAN_BYTES = 7700
"""Serialised size of one recorded LLM call (the issue's "~7.7 KB")."""

PROMPT_TOKENS = 256
COMPLETION_TOKENS = 80


def _words(rng: random.Random, n: int) -> str:
    vocab = [
        "the",
        "agent",
        "calls",
        "a",
        "tool",
        "with",
        "arguments",
        "and",
        "reads",
        "result",
        "answer",
        "is",
        "42",
        "step",
        "plan",
        "next",
        "query",
        "table",
        "rows",
        "sum",
    ]
    return " ".join(rng.choice(vocab) for _ in range(n))


def llm_call(seed: int = 0, pad_words: int = 0) -> dict[str, Any]:
    """The parts of one call: request body, response body (vLLM fields), token ids, logprobs."""
    rng = random.Random(seed)
    prompt_ids = [rng.randrange(5, 32000) for _ in range(PROMPT_TOKENS)]
    completion_ids = [rng.randrange(5, 32000) for _ in range(COMPLETION_TOKENS)]
    logprobs = [round(-rng.random() * 3, 6) for _ in range(COMPLETION_TOKENS)]
    request = {
        "model": "policy",
        "messages": [
            {"role": "system", "content": "You are a careful assistant. Use tools when needed."},
            {"role": "user", "content": _words(rng, 60 + pad_words)},
        ],
        "temperature": 1.0,
        "max_tokens": 256,
    }
    response = {
        "id": f"chatcmpl-{seed:08d}",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "policy",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": _words(rng, 40)},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": PROMPT_TOKENS,
            "completion_tokens": COMPLETION_TOKENS,
            "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
        },
    }
    return {
        "request": request,
        "response": response,
        "prompt_token_ids": prompt_ids,
        "completion_token_ids": completion_ids,
        "logprobs": logprobs,
    }


def agl_model_request(pad_words: int) -> dict[str, Any]:
    """An agentlightning 1.0.2 `model_request` event body, shaped as its gateway records one."""
    call = llm_call(pad_words=pad_words)
    response = json.loads(json.dumps(call["response"]))
    response["prompt_token_ids"] = call["prompt_token_ids"]
    choice = response["choices"][0]
    choice["token_ids"] = call["completion_token_ids"]
    choice["logprobs"] = {
        "content": [
            {"token": str(t), "logprob": lp}
            for t, lp in zip(call["completion_token_ids"], call["logprobs"], strict=True)
        ]
    }
    data = {
        "model": "policy",
        "model_version": 0,
        "request": call["request"],
        "response": response,
        "server": {"model": "policy", "endpoint": "http://127.0.0.1:1/v1", "version": 0},
        "latency_ms": 12.5,
        "http_status": 200,
        "status": "ok",
        "retry_count": 0,
        "usage": response["usage"],
        "finish_reason": "stop",
    }
    return {"event_type": "model_request", "data": data}


def padded(size_of: Callable[[int], int], target: int = SPAN_BYTES) -> tuple[int, int]:
    """The padding (in words) that makes `size_of(pad)`, a serialised size, reach `target` bytes."""
    pad = 0
    size = size_of(pad)
    while size < target:
        pad += 1
        size = size_of(pad)
    return pad, size
