"""A prompt longer than the served model's context: each API's own error, so agents' own handling
fires (Anthropic's "prompt is too long", OpenAI's `context_length_exceeded`, litellm's
`ContextWindowExceededError`), and a span that says so."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from reinforge import semconv
from reinforge.access import attempt_token
from reinforge.inference import ScriptedBackend
from reinforge.types import SpanQuery, SpanStatusCode

from .conftest import SECRET, Served, running_attempt, serve

LIMIT = 16
LONG = "Hello there, how are you today? " * 8


@pytest.fixture
def short(tokenizer: Any) -> Iterator[Served]:
    yield from serve(ScriptedBackend(tokenizer, ["The answer is 5."], max_seq_len=LIMIT))


def _sse_data(text: str) -> list[str]:
    return [line[len("data: ") :] for line in text.splitlines() if line.startswith("data: ")]


async def test_anthropic_and_openai_shapes_and_the_span(short: Served) -> None:
    attempt_id = (await running_attempt(short.store)).attempt.attempt_id
    key = attempt_token(SECRET, attempt_id)
    base = f"{short.url}/r/{attempt_id}/v1"
    anthropic_body = {"model": "p", "max_tokens": 8, "messages": [{"role": "user", "content": LONG}]}
    plain = httpx.post(f"{base}/messages", json=anthropic_body, headers={"x-api-key": key}, timeout=10)
    assert plain.status_code == 400
    error = plain.json()
    prompt_tokens = int(error["error"]["message"].split()[4])
    assert prompt_tokens > LIMIT
    assert error == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": f"prompt is too long: {prompt_tokens} tokens > {LIMIT} maximum",
        },
    }
    streamed = httpx.post(
        f"{base}/messages", json={**anthropic_body, "stream": True}, headers={"x-api-key": key}, timeout=10
    )
    assert "event: error" in streamed.text and f"{prompt_tokens} tokens > {LIMIT} maximum" in streamed.text

    chat = {"model": "p", "messages": [{"role": "user", "content": LONG}]}
    headers = {"Authorization": f"Bearer {key}"}
    refused = httpx.post(f"{base}/chat/completions", json=chat, headers=headers, timeout=10)
    assert refused.status_code == 400
    openai_error = refused.json()["error"]
    assert (openai_error["type"], openai_error["code"], openai_error["param"]) == (
        "invalid_request_error",
        "context_length_exceeded",
        "messages",
    )
    assert openai_error["message"].startswith(f"This model's maximum context length is {LIMIT} tokens.")

    await short.gateway.flush(attempt_id)
    spans = (await short.store.query_spans(SpanQuery(attempt_id=attempt_id))).items
    assert len(spans) == 3 and short.backend.requests and short.gateway.calls == 0
    for span in spans:
        assert span.name == semconv.SPAN_LLM_CALL and span.status.code == SpanStatusCode.error
        assert span.attributes[semconv.ATTR_FINISH_REASON] == "context_length_exceeded"
        assert semconv.ATTR_COMPLETION_TOKEN_IDS not in span.attributes
        assert f"{LIMIT}" in (span.status.message or "")


@pytest.mark.skipif(importlib.util.find_spec("litellm") is None, reason="litellm is not installed")
async def test_litellm_reads_it_as_context_window_exceeded(short: Served) -> None:
    import litellm

    attempt_id = (await running_attempt(short.store)).attempt.attempt_id
    with pytest.raises(litellm.ContextWindowExceededError):
        await litellm.acompletion(
            model="openai/p",
            messages=[{"role": "user", "content": LONG}],
            api_base=f"{short.url}/r/{attempt_id}/v1",
            api_key=attempt_token(SECRET, attempt_id),
            num_retries=0,
        )
