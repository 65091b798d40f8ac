"""Each framework's streaming mode through the gateway, served by the real engine and calc model.

Every call the framework streams is recorded with the engine's token ids: the completion ids decode
to the text the framework received, and a conversation's later prompts extend the earlier calls'
tokens (the history each framework sends back renders as generated), so its calls merge.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from reinforge import semconv
from reinforge.access import attempt_token
from reinforge.demo.calculator import CALCULATOR_TOOL, call_calculator
from reinforge.demo.warm_start import load_warm_start
from reinforge.engine import Engine
from reinforge.engine.engine_backend import EngineBackend
from reinforge.gateway import create_gateway_app
from reinforge.net.background import BackgroundServer
from reinforge.runner.llm import LLM
from reinforge.store.memory import MemoryStore
from reinforge.types import RolloutSpec, SpanQuery

SECRET = "streaming-secret"
QUESTION = "8*16-20"


def calculator(expression: str) -> str:
    """Compute a op b"""
    return str(call_calculator(json.dumps({"expression": expression})))


@pytest.fixture(scope="module")
def served() -> Any:
    model, tokenizer = load_warm_start()
    engine = Engine(model, tokenizer, max_batch_size=4, seed=0)
    store = MemoryStore()
    app = create_gateway_app(store, EngineBackend(engine), SECRET)
    with BackgroundServer(app) as server:
        yield server.url, store, app.state.gateway, tokenizer
    engine.stop()


@pytest.fixture
async def attempt(served: Any) -> AsyncIterator[LLM]:
    url, store, _, _ = served
    await store.enqueue_rollouts([RolloutSpec(task={"question": QUESTION})])
    (leased,) = await store.lease_rollouts("streaming-test", max_rollouts=1)
    attempt_id = leased.attempt.attempt_id
    yield LLM.for_attempt(url, attempt_id, attempt_token(SECRET, attempt_id), "policy")


async def langgraph_stream(llm: LLM) -> None:
    pytest.importorskip("langgraph")
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent

    model = ChatOpenAI(
        base_url=llm.base_url, api_key=llm.api_key, model=llm.model, temperature=0, max_tokens=48
    )
    graph = create_react_agent(model, [tool(calculator)])
    async for _ in graph.astream({"messages": [("user", QUESTION)]}, stream_mode="messages"):
        pass


async def openai_agents_stream(llm: LLM) -> None:
    pytest.importorskip("agents")
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key)
    agent = Agent(
        name="calc",
        tools=[function_tool(calculator)],
        model=OpenAIResponsesModel(model=llm.model, openai_client=client),
        model_settings=ModelSettings(temperature=0, max_tokens=48),
    )
    result = Runner.run_streamed(agent, QUESTION, max_turns=4)
    async for _ in result.stream_events():
        pass


async def autogen_stream(llm: LLM) -> None:
    pytest.importorskip("autogen_agentchat")
    from autogen_agentchat.agents import AssistantAgent
    from autogen_ext.models.openai import OpenAIChatCompletionClient

    info = {
        "vision": False,
        "function_calling": True,
        "json_output": False,
        "family": "unknown",
        "structured_output": False,
    }
    client = OpenAIChatCompletionClient(
        model=llm.model,
        base_url=llm.base_url,
        api_key=llm.api_key,
        model_info=info,
        temperature=0,
        max_tokens=48,
    )
    agent = AssistantAgent(
        "calc",
        model_client=client,
        tools=[calculator],
        system_message=None,
        model_client_stream=True,
        max_tool_iterations=4,
    )
    try:
        async for _ in agent.run_stream(task=QUESTION):
            pass
    finally:
        await client.close()


async def anthropic_stream(llm: LLM) -> None:
    anthropic = pytest.importorskip("anthropic")
    tools = [
        {
            "name": "calculator",
            "description": "Compute a op b",
            "input_schema": CALCULATOR_TOOL["function"]["parameters"],
        }
    ]
    client = anthropic.AsyncAnthropic(base_url=llm.base_url.removesuffix("/v1"), api_key=llm.api_key)
    messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    for _ in range(3):
        async with client.messages.stream(
            model=llm.model, max_tokens=48, messages=messages, tools=tools, extra_body={"temperature": 0}
        ) as stream:
            reply = await stream.get_final_message()
        messages.append({"role": "assistant", "content": reply.content})
        uses = [b for b in reply.content if b.type == "tool_use"]
        if not uses:
            return
        results = [
            {"type": "tool_result", "tool_use_id": u.id, "content": calculator(**u.input)} for u in uses
        ]
        messages.append({"role": "user", "content": results})


def answer_text(response: dict[str, Any]) -> str:
    """The text of a recorded answer, whichever API format it is in (tool calls left out)."""
    if "choices" in response:  # chat completions
        return str(response["choices"][0]["message"].get("content") or "")
    items = response.get("output") or response.get("content") or []  # responses, Anthropic messages
    texts = [
        part.get("text", "")
        for item in items
        for part in item.get("content", [item])
        if isinstance(part, dict)
    ]
    return "".join(t for t in texts if isinstance(t, str))


STREAMS: dict[str, Callable[[LLM], Awaitable[None]]] = {
    "langgraph": langgraph_stream,
    "openai_agents_responses": openai_agents_stream,
    "autogen": autogen_stream,
    "anthropic": anthropic_stream,
}


@pytest.mark.parametrize("framework", list(STREAMS))
async def test_streamed_calls_are_recorded_with_the_engines_tokens(
    served: Any, attempt: LLM, framework: str
) -> None:
    _, store, gateway, tokenizer = served
    await STREAMS[framework](attempt)
    attempt_id = attempt.attempt_root.rpartition("/r/")[2]
    await gateway.flush(attempt_id)
    page = await store.query_spans(SpanQuery(attempt_id=attempt_id, name=semconv.SPAN_LLM_CALL))
    calls = sorted((s.attributes for s in page.items), key=lambda a: a[semconv.ATTR_SEQUENCE_IN_ATTEMPT])
    assert len(calls) >= 2, "the calc model calls the calculator, then answers"
    for call in calls:
        completion = call[semconv.ATTR_COMPLETION_TOKEN_IDS]
        assert len(call[semconv.ATTR_COMPLETION_LOGPROBS]) == len(completion) > 0
        decoded = tokenizer.decode(completion, skip_special_tokens=True)
        streamed = answer_text(call[semconv.ATTR_LLM_RESPONSE])
        assert streamed.strip() in decoded  # what the framework was streamed is what the engine wrote
    for before, after in itertools.pairwise(calls):
        generated = before[semconv.ATTR_PROMPT_TOKEN_IDS] + before[semconv.ATTR_COMPLETION_TOKEN_IDS]
        assert after[semconv.ATTR_PROMPT_TOKEN_IDS][: len(generated)] == generated
