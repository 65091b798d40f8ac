"""The real `openai` client against the gateway on 127.0.0.1, with a real store and tokenizer."""

from __future__ import annotations

import json
from typing import Any

import pytest

from reinforge import semconv
from reinforge.inference import ScriptedBackend, ScriptedReply, ScriptedToolCall
from reinforge.types import Span, SpanQuery

from .conftest import Served, running_attempt, serve

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "Evaluate an arithmetic expression",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]


async def llm_spans(served: Served, attempt_id: str) -> list[Span]:
    await served.gateway.flush(attempt_id)
    page = await served.store.query_spans(SpanQuery(attempt_id=attempt_id, name=semconv.SPAN_LLM_CALL))
    return page.items


def expected_ids(
    tokenizer: Any, messages: list[dict[str, Any]], reply: str, tools: Any = None
) -> tuple[list, list]:
    text = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    prompt = tokenizer.encode(text, add_special_tokens=False)
    completion = [*tokenizer.encode(reply, add_special_tokens=False), tokenizer.eos_token_id]
    return prompt, completion


async def test_chat_records_exact_token_ids(served: Served, tokenizer: Any) -> None:
    leased = await running_attempt(served.store)
    attempt_id = leased.attempt.attempt_id
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+3?"}]
    client = served.client(attempt_id)
    response = await client.chat.completions.create(
        model="policy",
        messages=messages,
        temperature=0.7,
        max_tokens=64,
        logprobs=True,
        seed=3,
        extra_body={"return_token_ids": True},
    )
    choice = response.choices[0]
    assert choice.message.content == "The answer is 5."
    assert choice.finish_reason == "stop"
    prompt, completion = expected_ids(tokenizer, messages, "The answer is 5.")
    assert response.usage is not None
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (len(prompt), len(completion))
    extra = response.model_extra or {}
    assert extra["prompt_token_ids"] == prompt

    [span] = await llm_spans(served, attempt_id)
    attrs = span.attributes
    assert span.rollout_id == leased.rollout.rollout_id
    assert attrs[semconv.ATTR_PROMPT_TOKEN_IDS] == prompt
    assert attrs[semconv.ATTR_COMPLETION_TOKEN_IDS] == completion
    assert choice.logprobs is not None and choice.logprobs.content is not None
    assert [t.logprob for t in choice.logprobs.content] == attrs[semconv.ATTR_COMPLETION_LOGPROBS]
    assert [t.token for t in choice.logprobs.content] == [tokenizer.decode([i]) for i in completion]
    assert attrs[semconv.ATTR_LLM_ENDPOINT] == "chat.completions"
    assert attrs[semconv.ATTR_FINISH_REASON] == "stop"
    assert attrs[semconv.ATTR_POLICY_VERSION] == 0
    assert attrs[semconv.ATTR_STEP_KIND] == semconv.STEP_LLM
    assert attrs[semconv.ATTR_MALFORMED_TOOL_CALL] is False
    assert attrs[semconv.ATTR_SEQUENCE_IN_ATTEMPT] == 0
    assert attrs[semconv.ATTR_LATENCY_MS] >= 0
    assert attrs[semconv.ATTR_LLM_REQUEST]["messages"] == messages
    assert attrs[semconv.ATTR_LLM_REQUEST]["seed"] == 3
    assert attrs[semconv.ATTR_LLM_RESPONSE]["choices"][0]["message"]["content"] == "The answer is 5."
    # Sampling parameters reach the backend as given.
    sampling = served.backend.requests[-1].sampling
    assert (sampling.temperature, sampling.max_tokens, sampling.seed) == (0.7, 64, 3)


async def test_chat_stream_assembles_and_records(served: Served, tokenizer: Any) -> None:
    attempt_id = (await running_attempt(served.store)).attempt.attempt_id
    messages = [{"role": "user", "content": "Hello there"}]
    stream = await served.client(attempt_id).chat.completions.create(
        model="policy",
        messages=messages,
        stream=True,
        stream_options={"include_usage": True},
        logprobs=True,
        extra_body={"return_token_ids": True},
    )
    pieces, finish, usage, logprobs, token_ids = [], None, None, [], []
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                pieces.append(choice.delta.content)
            if choice.logprobs is not None and choice.logprobs.content:
                logprobs += [t.logprob for t in choice.logprobs.content]
            token_ids += (choice.model_extra or {}).get("token_ids") or []
            finish = choice.finish_reason or finish
    assert "".join(pieces) == "The answer is 5."
    assert len(pieces) > 1, "the text should arrive in several deltas"
    assert finish == "stop"
    prompt, completion = expected_ids(tokenizer, messages, "The answer is 5.")
    assert usage is not None and usage.completion_tokens == len(completion)
    [span] = await llm_spans(served, attempt_id)
    assert span.attributes[semconv.ATTR_PROMPT_TOKEN_IDS] == prompt
    assert span.attributes[semconv.ATTR_COMPLETION_TOKEN_IDS] == completion == token_ids
    assert span.attributes[semconv.ATTR_COMPLETION_LOGPROBS] == logprobs
    assert served.gateway.in_flight == 0
    response = span.attributes[semconv.ATTR_LLM_RESPONSE]
    assert response["object"] == "chat.completion"
    assert response["choices"][0]["message"]["content"] == "The answer is 5."


@pytest.fixture
def tool_served(tokenizer: Any):  # type: ignore[no-untyped-def]
    replies = [
        ScriptedReply(text="", tool_calls=[ScriptedToolCall(name="calc", arguments={"expression": "2+3"})]),
        ScriptedReply(text="It is 5."),
    ]
    yield from serve(ScriptedBackend(tokenizer, replies))


async def test_tool_call_round_trip(tool_served: Served, tokenizer: Any) -> None:
    served = tool_served
    attempt_id = (await running_attempt(served.store)).attempt.attempt_id
    client = served.client(attempt_id)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 2+3?"}]
    first = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)  # type: ignore[arg-type]
    message = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls"
    assert message.tool_calls is not None and len(message.tool_calls) == 1
    call = message.tool_calls[0]
    assert call.function.name == "calc"
    assert json.loads(call.function.arguments) == {"expression": "2+3"}
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "5"},
    ]
    second = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)  # type: ignore[arg-type]
    assert second.choices[0].message.content == "It is 5."

    spans = await llm_spans(served, attempt_id)
    assert [s.attributes[semconv.ATTR_SEQUENCE_IN_ATTEMPT] for s in spans] == [0, 1]
    markup = '<tool_call>{"name": "calc", "arguments": {"expression": "2+3"}}</tool_call>'
    markup_ids = tokenizer.encode(markup, add_special_tokens=False)
    assert spans[0].attributes[semconv.ATTR_COMPLETION_TOKEN_IDS] == [*markup_ids, tokenizer.eos_token_id]
    assert spans[0].attributes[semconv.ATTR_FINISH_REASON] == "tool_calls"
    # The second prompt holds the first call through the chat template, tool result included.
    prompt_text = tokenizer.decode(spans[1].attributes[semconv.ATTR_PROMPT_TOKEN_IDS])
    assert "<tool_call>" in prompt_text and "<|tool|>5</s>" in prompt_text


async def test_tool_call_stream_deltas(tool_served: Served) -> None:
    served = tool_served
    attempt_id = (await running_attempt(served.store)).attempt.attempt_id
    stream = await served.client(attempt_id).chat.completions.create(
        model="policy",
        messages=[{"role": "user", "content": "2+3?"}],
        tools=TOOLS,
        stream=True,  # type: ignore[arg-type]
    )
    calls: dict[int, dict[str, str]] = {}
    finish = None
    async for chunk in stream:
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                slot = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                slot["id"] += delta.id or ""
                if delta.function is not None:
                    slot["name"] += delta.function.name or ""
                    slot["arguments"] += delta.function.arguments or ""
            finish = choice.finish_reason or finish
    assert finish == "tool_calls"
    assert calls[0]["name"] == "calc" and json.loads(calls[0]["arguments"]) == {"expression": "2+3"}
    [span] = await llm_spans(served, attempt_id)
    recorded = span.attributes[semconv.ATTR_LLM_RESPONSE]["choices"][0]["message"]["tool_calls"]
    assert recorded[0]["id"] == calls[0]["id"]


async def test_responses_api_text_and_function_tools(tool_served: Served, tokenizer: Any) -> None:
    served = tool_served
    attempt_id = (await running_attempt(served.store)).attempt.attempt_id
    client = served.client(attempt_id)
    tools = [
        {
            "type": "function",
            "name": "calc",
            "description": "Evaluate",
            "parameters": TOOLS[0]["function"]["parameters"],
        }
    ]
    first = await client.responses.create(
        model="policy",
        instructions="Use tools.",
        input="What is 2+3?",
        tools=tools,
        max_output_tokens=50,  # type: ignore[arg-type]
    )
    assert first.status == "completed"
    [item] = first.output
    assert item.type == "function_call"
    assert item.name == "calc" and json.loads(item.arguments) == {"expression": "2+3"}
    second = await client.responses.create(
        model="policy",
        instructions="Use tools.",
        input=[
            {"role": "user", "content": "What is 2+3?"},
            {"type": "function_call", "call_id": item.call_id, "name": "calc", "arguments": item.arguments},
            {"type": "function_call_output", "call_id": item.call_id, "output": "5"},
        ],
        tools=tools,  # type: ignore[arg-type]
    )
    assert second.output_text == "It is 5."
    assert second.usage is not None and second.usage.output_tokens > 0

    spans = await llm_spans(served, attempt_id)
    assert [s.attributes[semconv.ATTR_LLM_ENDPOINT] for s in spans] == ["responses", "responses"]
    request = served.backend.requests[-1]
    assert request.messages is not None
    assert [m["role"] for m in request.messages] == ["system", "user", "assistant", "tool"]
    assert request.messages[2]["tool_calls"][0]["function"]["name"] == "calc"
    reply_ids = tokenizer.encode("It is 5.", add_special_tokens=False)
    assert spans[1].attributes[semconv.ATTR_COMPLETION_TOKEN_IDS] == [*reply_ids, tokenizer.eos_token_id]


async def test_responses_stream_events(served: Served) -> None:
    attempt_id = (await running_attempt(served.store)).attempt.attempt_id
    stream = await served.client(attempt_id).responses.create(
        model="policy", input="Hello there", stream=True, include=["message.output_text.logprobs"]
    )
    kinds, text, final = [], [], None
    async for event in stream:
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            text.append(event.delta)
        if event.type == "response.completed":
            final = event.response
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.output_item.added" in kinds and "response.output_text.done" in kinds
    assert "".join(text) == "The answer is 5."
    assert final is not None and final.output_text == "The answer is 5."
    [span] = await llm_spans(served, attempt_id)
    assert span.attributes[semconv.ATTR_LLM_RESPONSE]["output"][0]["content"][0]["text"] == "The answer is 5."
    content = final.output[0].content[0]  # type: ignore[union-attr]
    recorded = span.attributes[semconv.ATTR_COMPLETION_LOGPROBS]
    assert [t.logprob for t in content.logprobs] == recorded  # type: ignore[union-attr]


async def test_completions_with_text_and_token_prompts(served: Served, tokenizer: Any) -> None:
    attempt_id = (await running_attempt(served.store)).attempt.attempt_id
    client = served.client(attempt_id)
    response = await client.completions.create(model="policy", prompt="Hello there", max_tokens=3, logprobs=0)
    choice = response.choices[0]
    assert choice.finish_reason == "length"
    assert choice.logprobs is not None and choice.logprobs.token_logprobs is not None
    assert len(choice.logprobs.token_logprobs) == 3
    ids = tokenizer.encode("Hello there", add_special_tokens=False)
    streamed = await client.completions.create(model="policy", prompt=ids, stream=True)
    text = "".join([c.choices[0].text async for c in streamed if c.choices])
    assert text == "The answer is 5."
    first, second = await llm_spans(served, attempt_id)
    assert first.attributes[semconv.ATTR_PROMPT_TOKEN_IDS] == ids
    assert (
        first.attributes[semconv.ATTR_COMPLETION_TOKEN_IDS]
        == tokenizer.encode("The answer is 5.", add_special_tokens=False)[:3]
    )
    assert first.attributes[semconv.ATTR_COMPLETION_LOGPROBS] == choice.logprobs.token_logprobs
    assert second.attributes[semconv.ATTR_PROMPT_TOKEN_IDS] == ids
    assert second.attributes[semconv.ATTR_LLM_ENDPOINT] == "completions"


async def test_models_list(served: Served) -> None:
    attempt_id = (await running_attempt(served.store)).attempt.attempt_id
    models = await served.client(attempt_id).models.list()
    assert [m.id for m in models.data] == ["reinforge-scripted"]


async def test_agent_name_from_path_and_header(served: Served) -> None:
    attempt_id = (await running_attempt(served.store)).attempt.attempt_id
    messages = [{"role": "user", "content": "hi"}]
    await served.client(attempt_id, agent="planner").chat.completions.create(model="p", messages=messages)  # type: ignore[arg-type]
    await served.client(attempt_id).chat.completions.create(
        model="p",
        messages=messages,
        extra_headers={"X-Reinforge-Agent": "critic"},  # type: ignore[arg-type]
    )
    await served.client(attempt_id).chat.completions.create(model="p", messages=messages)  # type: ignore[arg-type]
    spans = await llm_spans(served, attempt_id)
    assert [s.attributes.get(semconv.ATTR_AGENT_NAME) for s in spans] == ["planner", "critic", None]


async def test_policy_version_and_malformed_flag(tokenizer: Any) -> None:
    backend = ScriptedBackend(
        tokenizer, [ScriptedReply(text="Let me call", malformed=True)], policy_version=4
    )
    for served in serve(backend):
        attempt_id = (await running_attempt(served.store)).attempt.attempt_id
        client = served.client(attempt_id)
        response = await client.chat.completions.create(
            model="p", messages=[{"role": "user", "content": "x"}]
        )
        assert "<tool_call>" in (response.choices[0].message.content or "")
        backend.policy_version = 5
        await client.chat.completions.create(model="p", messages=[{"role": "user", "content": "x"}])
        spans = await llm_spans(served, attempt_id)
        assert [s.attributes[semconv.ATTR_POLICY_VERSION] for s in spans] == [4, 5]
        assert all(s.attributes[semconv.ATTR_MALFORMED_TOOL_CALL] for s in spans)
        assert spans[0].attributes[semconv.ATTR_AIR_SIGNAL] == semconv.AIR_MALFORMED_TOOL_CALL
