"""What Codex CLI sends to the Responses API, over real HTTP: its request fields are accepted, a
custom (freeform) tool's call is answered as a `custom_tool_call` with the free text as `input` and
comes back as history, and a stream that fails ends with `response.failed`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from reinforge.inference import ScriptedBackend
from reinforge.inference.scripted import ScriptedReply, ScriptedToolCall

from .conftest import Served, running_attempt, serve

PATCH = "*** Begin Patch\n*** Add File: hello.txt\n+Hello\n*** End Patch\n"
TOOLS = [
    {"type": "function", "name": "exec_command", "strict": False, "parameters": {"type": "object"}},
    {
        "type": "custom",
        "name": "apply_patch",
        "description": "Edit files. This is a FREEFORM tool.",
        "format": {"type": "grammar", "syntax": "lark", "definition": "start: begin_patch"},
    },
]


def codex_body(items: list[dict[str, Any]]) -> dict[str, Any]:
    """A request shaped as Codex 0.171.0 sends it (fields taken from a captured request)."""
    return {
        "model": "policy",
        "stream": True,
        "input": [
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": "Be Codex."}],
            },
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say hello"}]},
            *items,
        ],
        "tools": TOOLS,
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"summary": "auto"},
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "01a24c24",
        "text": {"verbosity": "low"},
        "client_metadata": {"session_id": "01a24c24", "turn_id": "t1"},
    }


def events(response: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")]


@pytest.fixture
def codex_served(tokenizer: Any) -> Iterator[Served]:
    replies = [
        ScriptedReply(text="", tool_calls=[ScriptedToolCall(name="apply_patch", arguments={"input": PATCH})]),
        ScriptedReply(text="Done."),
    ]
    yield from serve(ScriptedBackend(tokenizer, replies))


async def test_a_custom_tool_call_round_trips_as_codex_sends_it(codex_served: Served) -> None:
    served = codex_served
    attempt_id = (await running_attempt(served.store)).attempt.attempt_id
    url = f"{served.url}/r/{attempt_id}/v1/responses"
    async with httpx.AsyncClient(headers=served.headers(attempt_id)) as http:
        first = await http.post(url, json=codex_body([]))
        assert first.status_code == 200, first.text
        stream = events(first)
        kinds = [e["type"] for e in stream]
        assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
        [done] = [e["item"] for e in stream if e["type"] == "response.output_item.done"]
        assert done["type"] == "custom_tool_call" and done["name"] == "apply_patch"
        assert done["input"] == PATCH
        assert "response.custom_tool_call_input.done" in kinds
        # The call and its result come back in the next request, as Codex sends its history.
        history = [
            {"type": "reasoning", "summary": [], "encrypted_content": None},
            {"type": "custom_tool_call", "call_id": done["call_id"], "name": "apply_patch", "input": PATCH},
            {"type": "custom_tool_call_output", "call_id": done["call_id"], "output": "Exit code: 0"},
        ]
        second = await http.post(url, json=codex_body(history))
        assert second.status_code == 200, second.text
        assert events(second)[-1]["response"]["output"][0]["content"][0]["text"] == "Done."
    request = served.backend.requests[-1]
    assert request.messages is not None
    assert [m["role"] for m in request.messages] == ["system", "user", "assistant", "tool"]
    call = request.messages[2]["tool_calls"][0]["function"]
    assert call["name"] == "apply_patch" and json.loads(call["arguments"]) == {"input": PATCH}
    offered = served.backend.requests[0].tools
    assert offered is not None
    assert offered[1]["function"]["parameters"]["required"] == ["input"]


async def test_a_reasoning_effort_is_refused_and_a_failed_stream_ends_with_response_failed(
    tokenizer: Any,
) -> None:
    for served in serve(ScriptedBackend(tokenizer, ["The answer is 5."], max_seq_len=64)):
        attempt_id = (await running_attempt(served.store)).attempt.attempt_id
        url = f"{served.url}/r/{attempt_id}/v1/responses"
        async with httpx.AsyncClient(headers=served.headers(attempt_id)) as http:
            refused = await http.post(url, json={**codex_body([]), "reasoning": {"effort": "high"}})
            assert refused.status_code == 400 and "reasoning.effort" in refused.text
            long = codex_body([{"type": "message", "role": "user", "content": "Hello there " * 200}])
            failed = await http.post(url, json=long)
        assert failed.status_code == 200  # the stream had started
        stream = events(failed)
        assert [e["type"] for e in stream][-1] == "response.failed"
        response = stream[-1]["response"]
        assert response["status"] == "failed" and "64" in response["error"]["message"]
