"""Bad input gets a clear 4xx in OpenAI's error format: the SDK raises its typed exceptions."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from reinforge.errors import InvalidRequestError
from reinforge.inference import ScriptedBackend
from reinforge.types import SpanQuery

from .conftest import Served, finished_attempt, running_attempt, serve

MESSAGES = [{"role": "user", "content": "hi"}]


def post(served: Served, path: str, **kwargs: Any) -> httpx.Response:
    return httpx.post(served.url + path, timeout=10, **kwargs)


async def test_missing_and_wrong_token_are_401(served: Served) -> None:
    attempt_id = (await running_attempt(served.store)).attempt.attempt_id
    path = f"/r/{attempt_id}/v1/chat/completions"
    response = post(served, path, json={"messages": MESSAGES})
    assert response.status_code == 401
    assert response.json()["error"]["type"] == "authentication_error"
    other = (await running_attempt(served.store)).attempt.attempt_id
    wrong = openai.AsyncOpenAI(
        base_url=f"{served.url}/r/{attempt_id}/v1",
        api_key=served.headers(other)["Authorization"][7:],
        max_retries=0,
    )
    with pytest.raises(openai.AuthenticationError, match="not valid for attempt"):
        await wrong.chat.completions.create(model="p", messages=MESSAGES)  # type: ignore[arg-type]


async def test_unknown_attempt_is_404_and_finished_is_409(served: Served) -> None:
    with pytest.raises(openai.NotFoundError, match="unknown attempt"):
        await served.client("no-such-attempt").chat.completions.create(model="p", messages=MESSAGES)  # type: ignore[arg-type]
    done = (await finished_attempt(served.store)).attempt.attempt_id
    with pytest.raises(openai.ConflictError, match="succeeded, not running"):
        await served.client(done).chat.completions.create(model="p", messages=MESSAGES)  # type: ignore[arg-type]
    response = post(served, f"/r/{done}/reward", json={"reward": 1.0}, headers=served.headers(done))
    assert response.status_code == 409 and response.json()["error"]["code"] == "attempt_not_running"


async def test_finishing_is_seen_after_the_cache_ttl(tokenizer: Any) -> None:
    for served in serve(ScriptedBackend(tokenizer, ["ok"]), attempt_cache_ttl_s=0.0):
        leased = await running_attempt(served.store)
        client = served.client(leased.attempt.attempt_id)
        await client.chat.completions.create(model="p", messages=MESSAGES)  # type: ignore[arg-type]
        await served.store.cancel_rollouts([leased.rollout.rollout_id])
        with pytest.raises(openai.ConflictError, match="cancelled"):
            await client.chat.completions.create(model="p", messages=MESSAGES)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        ({"messages": MESSAGES, "n": 17}, "n", "between 1 and 16"),
        ({"messages": MESSAGES, "n": 2, "stream": True}, "n", "without streaming"),
        ({"messages": MESSAGES, "presence_penalty": 3}, "presence_penalty", "less than or equal"),
        ({"messages": MESSAGES, "logit_bias": {"x": 1}}, "logit_bias", "token ids"),
        ({"messages": MESSAGES, "logit_bias": {"5": 101}}, "logit_bias", "lie in"),
        ({"messages": MESSAGES, "tool_choice": "sometimes"}, "tool_choice", "must be 'auto'"),
        ({"messages": MESSAGES, "temperature": -1}, "temperature", "greater than or equal"),
        ({"messages": MESSAGES, "max_tokens": 0}, "max_tokens", "greater than or equal"),
        ({"messages": MESSAGES, "top_logprobs": 3, "logprobs": True}, "top_logprobs", "not recorded"),
        (
            {"messages": MESSAGES, "response_format": {"type": "json_schema", "json_schema": {"name": "A"}}},
            "response_format.json_schema.schema",
            "JSON Schema object",
        ),
        ({"messages": MESSAGES, "response_format": {"type": "yaml"}}, "response_format.type", "json_schema"),
        ({"messages": MESSAGES, "bogus": 1}, "bogus", "Unrecognized request argument"),
        ({"messages": []}, "messages", "at least 1"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role", "must be one of"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages.0.content", "text"),
        ({"messages": MESSAGES, "tools": [{"type": "retrieval"}]}, "tools.0", "function tools"),
    ],
)
async def test_bad_chat_bodies_are_400(
    served: Served, body: dict[str, Any], param: str, fragment: str
) -> None:
    attempt_id = (await running_attempt(served.store)).attempt.attempt_id
    with pytest.raises(openai.BadRequestError) as caught:
        rest = dict(body)
        messages = rest.pop("messages")
        await served.client(attempt_id).chat.completions.create(model="p", messages=messages, extra_body=rest)
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["param"] == param
    assert fragment in error["message"]
    assert served.backend.requests == [], "a rejected request never reaches the backend"


async def test_bad_responses_and_completions_bodies_are_400(served: Served) -> None:
    attempt_id = (await running_attempt(served.store)).attempt.attempt_id
    client = served.client(attempt_id)
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        await client.responses.create(model="p", input="x", previous_response_id="resp_1")
    with pytest.raises(openai.BadRequestError, match=r"tools\.0"):
        await client.responses.create(model="p", input="x", tools=[{"type": "web_search"}])  # type: ignore[list-item]
    with pytest.raises(openai.BadRequestError, match="batched prompts"):
        await client.completions.create(model="p", prompt=["a", "b"])
    with pytest.raises(openai.BadRequestError, match="echo"):
        await client.completions.create(model="p", prompt="a", echo=True)


async def test_malformed_json_and_wrong_shapes_are_400(served: Served) -> None:
    attempt_id = (await running_attempt(served.store)).attempt.attempt_id
    headers = {**served.headers(attempt_id), "Content-Type": "application/json"}
    path = f"/r/{attempt_id}/v1/chat/completions"
    for content, fragment in [(b"{not json", "not valid JSON"), (b"[1, 2]", "JSON object"), (b"", "empty")]:
        response = post(served, path, content=content, headers=headers)
        assert response.status_code == 400, content
        assert fragment in response.json()["error"]["message"]
    for reward in [{"reward": "high"}, {"reward": 1, "extra": True}, {}]:
        response = post(served, f"/r/{attempt_id}/reward", json=reward, headers=served.headers(attempt_id))
        assert response.status_code == 400, reward
    response = post(served, f"/r/{attempt_id}/reward", content=b'{"reward": NaN}', headers=headers)
    assert response.status_code == 400


async def test_oversize_body_is_413(tokenizer: Any) -> None:
    for served in serve(ScriptedBackend(tokenizer, ["ok"]), max_body_bytes=2000):
        attempt_id = (await running_attempt(served.store)).attempt.attempt_id
        big = [{"role": "user", "content": "x" * 5000}]
        with pytest.raises(openai.APIStatusError) as caught:
            await served.client(attempt_id).chat.completions.create(model="p", messages=big)  # type: ignore[arg-type]
        assert caught.value.status_code == 413
        # Chunked upload without Content-Length is cut off too.
        chunks = iter([b'{"messages": [{"role": "user", "content": "', b"y" * 3000, b'"}]}'])
        response = post(
            served, f"/r/{attempt_id}/v1/chat/completions", content=chunks, headers=served.headers(attempt_id)
        )
        assert response.status_code == 413
        assert "limit" in response.json()["error"]["message"]


async def test_unknown_route_is_openai_shaped_404(served: Served) -> None:
    response = httpx.get(served.url + "/v2/whatever", timeout=10)
    assert response.status_code == 404
    assert "/r/<attempt_id>/v1" in response.json()["error"]["message"]
    response = httpx.get(served.url + "/r/x/v1/chat/completions", timeout=10)
    assert response.status_code == 405
    assert "error" in response.json()


async def test_backend_refusal_is_400_and_breaks_a_stream_cleanly(tokenizer: Any) -> None:
    def refuse(request: Any) -> str:
        raise InvalidRequestError("the prompt is longer than the model's 2048-token context")

    for served in serve(ScriptedBackend(tokenizer, refuse)):
        attempt_id = (await running_attempt(served.store)).attempt.attempt_id
        client = served.client(attempt_id)
        with pytest.raises(openai.BadRequestError, match="2048-token context"):
            await client.chat.completions.create(model="p", messages=MESSAGES)  # type: ignore[arg-type]
        stream = await client.chat.completions.create(model="p", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
        with pytest.raises(openai.APIError, match="2048-token context"):
            async for _ in stream:
                pass
        assert served.gateway.in_flight == 0
        await served.gateway.flush(attempt_id)
        assert (await served.store.query_spans(SpanQuery(attempt_id=attempt_id))).total == 0
