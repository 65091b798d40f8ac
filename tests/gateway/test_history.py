"""Token-faithful history: a turn sent back in another spelling renders as the model generated it.

Served by the real engine with the shipped calc model and its chat template, so "the next prompt
extends the tokens generated" is checked on real token ids, the condition credit/ merges calls on.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from reinforge import semconv
from reinforge.access import attempt_token
from reinforge.demo.calculator import CALCULATOR_TOOL
from reinforge.demo.warm_start import load_warm_start
from reinforge.engine import Engine
from reinforge.engine.engine_backend import EngineBackend
from reinforge.gateway import create_gateway_app
from reinforge.gateway.history import TurnMemory
from reinforge.gateway.tool_schemas import canonical_tools
from reinforge.inference.contract import GenerationRequest, GenerationResult, ToolCall
from reinforge.net.background import BackgroundServer
from reinforge.store.memory import MemoryStore
from reinforge.types import SpanQuery

from .conftest import SECRET, running_attempt

QUESTION = "8*16-20"


class RecordingBackend(EngineBackend):
    """The engine's backend, keeping each request the gateway hands it."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self.requests: list[GenerationRequest] = []

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        self.requests.append(request)
        return await super().generate(request)


@pytest.fixture(scope="module")
def backend() -> Iterator[RecordingBackend]:
    model, tokenizer = load_warm_start()
    engine = Engine(model, tokenizer, max_batch_size=4, seed=0)
    yield RecordingBackend(engine)
    engine.stop()


@pytest.fixture(scope="module")
def engine_served(backend: RecordingBackend) -> Iterator[tuple[str, MemoryStore]]:
    store = MemoryStore()
    app = create_gateway_app(store, backend, SECRET)
    with BackgroundServer(app) as server:
        yield server.url, store


def _chat(url: str, attempt_id: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    response = httpx.post(
        f"{url}/r/{attempt_id}/v1/chat/completions",
        json={"messages": messages, "tools": [CALCULATOR_TOOL], "temperature": 0, "max_tokens": 48},
        headers={"Authorization": f"Bearer {attempt_token(SECRET, attempt_id)}"},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def _calls(store: MemoryStore, attempt_id: str) -> list[dict[str, Any]]:
    page = await store.query_spans(SpanQuery(attempt_id=attempt_id, name=semconv.SPAN_LLM_CALL))
    return [
        s.attributes for s in sorted(page.items, key=lambda s: s.attributes[semconv.ATTR_SEQUENCE_IN_ATTEMPT])
    ]


async def _two_turns(url: str, store: MemoryStore, respell: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    attempt_id = (await running_attempt(store)).attempt.attempt_id
    first = _chat(url, attempt_id, [{"role": "user", "content": QUESTION}])
    message = first["choices"][0]["message"]
    assert message["tool_calls"], "the calc model answers a product with a calculator call"
    sent_back = respell(message)
    history = [{"role": "user", "content": QUESTION}, sent_back]
    history.append({"role": "tool", "tool_call_id": sent_back["tool_calls"][0]["id"], "content": "128"})
    _chat(url, attempt_id, history)
    app_gateway_flush = httpx.post(
        f"{url}/r/{attempt_id}/flush",
        headers={"Authorization": f"Bearer {attempt_token(SECRET, attempt_id)}"},
    )
    assert app_gateway_flush.status_code == 200
    one, two = await _calls(store, attempt_id)
    return one, two


def langchain_spelling(message: dict[str, Any]) -> dict[str, Any]:
    """What LangChain sends back: arguments re-dumped with spaces, keys content/role/tool_calls."""
    calls = [
        {
            "type": "function",
            "id": c["id"],
            "function": {
                "name": c["function"]["name"],
                "arguments": json.dumps(json.loads(c["function"]["arguments"])),
            },
        }
        for c in message["tool_calls"]
    ]
    return {"content": None, "role": "assistant", "tool_calls": calls}


def extends(one: dict[str, Any], two: dict[str, Any]) -> bool:
    generated = one[semconv.ATTR_PROMPT_TOKEN_IDS] + one[semconv.ATTR_COMPLETION_TOKEN_IDS]
    eos_dropped = generated[:-1]  # a turn that ended on its stop token renders that token too
    prompt = two[semconv.ATTR_PROMPT_TOKEN_IDS]
    return prompt[: len(generated)] == generated or prompt[: len(eos_dropped)] == eos_dropped


async def test_a_respelled_tool_call_renders_as_generated(
    engine_served: tuple[str, MemoryStore], backend: RecordingBackend
) -> None:
    url, store = engine_served
    one, two = await _two_turns(url, store, langchain_spelling)
    assert '{"expression": ' in json.dumps(two[semconv.ATTR_LLM_REQUEST])  # recorded as sent
    assert (two[semconv.ATTR_HISTORY_MATCHED], two[semconv.ATTR_HISTORY_RESPELLED]) == (1, 1)
    assert two[semconv.ATTR_HISTORY_UNMATCHED] == 0
    assert extends(one, two)
    # The backend got the turn's generated ids too (kept as ids where its template spells it otherwise).
    assert backend.requests[-1].generated_turns == {1: one[semconv.ATTR_COMPLETION_TOKEN_IDS]}


async def test_a_turn_the_gateway_did_not_produce_renders_as_sent(
    engine_served: tuple[str, MemoryStore], backend: RecordingBackend
) -> None:
    url, store = engine_served

    def foreign(message: dict[str, Any]) -> dict[str, Any]:
        respelled = langchain_spelling(message)
        respelled["tool_calls"][0]["id"] = "call_someone_else"
        return respelled

    one, two = await _two_turns(url, store, foreign)
    assert (two[semconv.ATTR_HISTORY_MATCHED], two[semconv.ATTR_HISTORY_UNMATCHED]) == (0, 1)
    assert backend.requests[-1].generated_turns == {}  # not ours: nothing to keep
    assert not extends(one, two)  # the spaced arguments are not the tokens the model wrote


def _result(text: str, calls: list[ToolCall]) -> GenerationResult:
    return GenerationResult(
        text=text,
        prompt_token_ids=[1],
        completion_token_ids=[2],
        logprobs=[-0.1],
        finish_reason="tool_calls" if calls else "stop",
        tool_calls=calls,
    )


def test_memory_restores_only_what_means_the_same() -> None:
    memory = TurnMemory()
    call = ToolCall(id="call_1", name="calculator", arguments='{"expression":"1*3"}')
    memory.remember(_result("Let me compute.", [call]))
    memory.remember(_result("ANSWER: 3", []))
    sent = [
        {"role": "user", "content": "1*3?"},
        {
            "role": "assistant",
            "content": "Let me compute. ",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "calculator", "arguments": '{"expression": "1*3"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "3"},
        {"role": "assistant", "content": [{"type": "text", "text": "ANSWER: 3"}]},
        {"role": "assistant", "content": "ANSWER: 4"},  # edited by the agent: not ours
    ]
    restored = memory.restore(sent)
    assert (restored.matched, restored.respelled, restored.unmatched) == (2, 1, 1)  # text parts render alike
    assert restored.messages[1]["content"] == "Let me compute."
    assert restored.messages[1]["tool_calls"][0]["function"]["arguments"] == '{"expression":"1*3"}'
    assert restored.messages[3]["content"] == "ANSWER: 3"
    assert restored.messages[4] == sent[4]
    assert restored.token_ids == {1: [2], 3: [2]}  # each restored turn's generated ids, by index
    changed = [
        dict(
            sent[1],
            tool_calls=[
                {
                    **sent[1]["tool_calls"][0],
                    "function": {"name": "calculator", "arguments": '{"expression": "2*3"}'},
                }
            ],
        )
    ]
    assert memory.restore(changed).unmatched == 1


def test_a_call_sent_back_with_schema_defaults_added_is_the_same_call() -> None:
    """Claude Code sends its Edit calls back with `"replace_all": false` (its schema's default) added."""
    memory = TurnMemory()
    call = ToolCall(id="toolu_1", name="Edit", arguments='{"file_path": "/w/a.py", "old_string": "a"}')
    memory.remember(_result("", [call]))
    schema = {"type": "object", "properties": {"replace_all": {"type": "boolean", "default": False}}}
    tools = [{"type": "function", "function": {"name": "Edit", "parameters": schema}}]

    def sent(arguments: str) -> list[dict[str, Any]]:
        function = {"name": "Edit", "arguments": arguments}
        return [{"role": "assistant", "content": "", "tool_calls": [{"id": "toolu_1", "function": function}]}]

    echoed = sent('{"replace_all": false, "file_path": "/w/a.py", "old_string": "a"}')
    restored = memory.restore(echoed, tools)
    assert (restored.matched, restored.unmatched) == (1, 0)
    assert restored.messages[0]["tool_calls"][0]["function"]["arguments"] == call.arguments
    assert memory.restore(echoed).unmatched == 1  # without the schema, an added key is a change
    assert (
        memory.restore(
            sent('{"replace_all": true, "file_path": "/w/a.py", "old_string": "a"}'), tools
        ).unmatched
        == 1
    )
    assert memory.restore(sent('{"file_path": "/w/a.py", "old_string": "a", "x": 1}'), tools).unmatched == 1


def test_the_same_tool_renders_the_same_whoever_sends_it() -> None:
    """The calculator as LangChain, the Agents SDK and the Anthropic SDK spell it (recorded)."""
    langchain = {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "Compute.",
            "parameters": {
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
                "type": "object",
            },
        },
    }
    agents_sdk = {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "Compute.",
            "strict": True,
            "parameters": {
                "properties": {"expression": {"title": "Expression", "type": "string"}},
                "required": ["expression"],
                "title": "calc_args",
                "type": "object",
            },
        },
    }
    assert json.dumps(canonical_tools([langchain])) == json.dumps(canonical_tools([agents_sdk]))
