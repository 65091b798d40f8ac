"""The pure pieces: tool-call parsing, request conversion, tokens, the scripted backend."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from reinforge._headers import bearer_token
from reinforge.access import attempt_token, token_matches
from reinforge.gateway.errors import GatewayHTTPError
from reinforge.gateway.openai_bodies import ResponsesBody, parse_body, responses_request
from reinforge.inference import ScriptedBackend, parse_tool_calls
from reinforge.inference.contract import GenerationRequest, SamplingParams
from reinforge.semconv import trace_id_for


def test_parse_tool_calls() -> None:
    parsed = parse_tool_calls(
        'Sure.<tool_call>{"name": "calc", "arguments": {"x": 1}}</tool_call>'
        '<tool_call>{"name": "echo", "arguments": "{\\"y\\": 2}"}</tool_call>'
    )
    assert (parsed.text, parsed.malformed) == ("Sure.", False)
    # The arguments are the exact text the model wrote, so the next prompt extends its tokens.
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("calc", '{"x": 1}'), ("echo", '{"y": 2}')]
    compact = parse_tool_calls('<tool_call>{"name":"calc","arguments":{"expression":"7+36"}}</tool_call>')
    assert compact.tool_calls[0].arguments == '{"expression":"7+36"}'
    assert (parse_tool_calls("plain").text, parse_tool_calls("plain").tool_calls) == ("plain", [])
    for broken in [
        '<tool_call>{"name": "calc", "arguments": {</tool_call>',
        "<tool_call>{",
        '<tool_call>{"a": 1}</tool_call>',
    ]:
        result = parse_tool_calls(broken)
        assert (result.text, result.tool_calls, result.malformed) == (broken, [], True)


def test_tokens_are_per_attempt() -> None:
    assert attempt_token("s", "a") != attempt_token("s", "b") != attempt_token("t", "a")
    assert token_matches(attempt_token("s", "a"), attempt_token("s", "a"))
    assert not token_matches(attempt_token("s", "a"), None)
    assert (
        bearer_token("Bearer abc") == "abc"
        and bearer_token("Basic abc") is None
        and bearer_token(None) is None
    )
    with pytest.raises(ValueError):
        attempt_token("", "a")
    assert trace_id_for("0123456789abcdef0123456789ABCDEF") == "0123456789abcdef0123456789abcdef"
    assert len(trace_id_for("attempt-1")) == 32


def test_responses_input_becomes_chat_messages() -> None:
    body = parse_body(
        ResponsesBody,
        {
            "input": [
                {"role": "developer", "content": [{"type": "input_text", "text": "Be terse."}]},
                {"type": "message", "role": "user", "content": "2+3?"},
                {"type": "function_call", "call_id": "c1", "name": "calc", "arguments": '{"e": "2+3"}'},
                {"type": "function_call", "call_id": "c2", "name": "calc", "arguments": '{"e": "1"}'},
                {"type": "function_call_output", "call_id": "c1", "output": "5"},
            ],
            "tools": [{"type": "function", "name": "calc", "parameters": {"type": "object"}}],
            "tool_choice": {"type": "function", "name": "calc"},
            "max_output_tokens": 20,
        },
    )
    request = responses_request(body)
    assert request.messages is not None
    assert [m["role"] for m in request.messages] == ["system", "user", "assistant", "tool"]
    assert [c["id"] for c in request.messages[2]["tool_calls"]] == ["c1", "c2"]
    assert request.tools == [
        {"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}
    ]
    assert request.tool_choice == {"type": "function", "function": {"name": "calc"}}
    assert request.sampling.max_tokens == 20
    with pytest.raises(GatewayHTTPError, match="max_output_tokens"):
        responses_request(parse_body(ResponsesBody, {"input": "x", "max_output_tokens": 0}))


def test_scripted_backend_truncates_and_stops(tokenizer: Any) -> None:
    backend = ScriptedBackend(tokenizer, ["Hello there, how are you"])

    async def run(**sampling: Any) -> Any:
        return await backend.generate(GenerationRequest(prompt="Hi", sampling=SamplingParams(**sampling)))

    full = asyncio.run(run())
    assert full.completion_token_ids[-1] == tokenizer.eos_token_id
    assert len(full.logprobs) == len(full.completion_token_ids)
    assert all(lp < 0 for lp in full.logprobs)
    assert asyncio.run(run()).logprobs == full.logprobs, "logprobs are deterministic per reply"
    cut = asyncio.run(run(max_tokens=2))
    assert (cut.finish_reason, cut.completion_token_ids) == ("length", full.completion_token_ids[:2])
    stopped = asyncio.run(run(stop=[","]))
    assert (stopped.text, stopped.finish_reason) == ("Hello there", "stop")
    assert stopped.completion_token_ids == tokenizer.encode("Hello there", add_special_tokens=False)


def test_the_tiny_models_chat_template_uses_the_parsers_markers() -> None:
    from reinforge.inference import tool_calls
    from reinforge.models import TOOL_CALL_END, TOOL_CALL_START

    assert (TOOL_CALL_START, TOOL_CALL_END) == (tool_calls.TOOL_CALL_START, tool_calls.TOOL_CALL_END)
