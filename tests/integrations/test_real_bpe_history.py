"""Token-faithful history with a real BPE and a chat template that renders no tools (SmolLM2's):
the demo's calc agent and a LangGraph ReAct agent, run by the real runner through the real gateway,
give transitions whose calls all merge (merge rate 1.0) with no history turn left unmatched.

The scripted backend writes each reply as a model does (its text and its tool-call markup tokenized
apart, then EOS), and renders prompts through `ChatRenderer` like the engine: tools in the default
form, the policy's earlier turns as the ids it generated. Both agents send their calls back
re-serialised (the demo compacts the arguments, LangChain re-dumps them with spaces). The Anthropic
Messages and OpenAI Responses tool loops get the same default form and merge the same way.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from reinforge.access import attempt_token
from reinforge.credit import CreditConfig, CreditMetrics, build_transitions
from reinforge.demo.agent import TOOL_ERROR_TEXT, calc_agent, parse_answer
from reinforge.demo.calculator import calculate
from reinforge.gateway.app import create_gateway_app
from reinforge.inference import GenerationRequest, ScriptedBackend, ScriptedReply, ScriptedToolCall
from reinforge.net.background import BackgroundServer
from reinforge.runner import LLM, Runner, agent
from reinforge.store.memory import MemoryStore
from reinforge.types import (
    AttemptOutcome,
    AttemptQuery,
    AttemptStatus,
    RolloutSpec,
    RolloutStatus,
    SpanQuery,
)

from .conftest import SECRET, Stack

ROLLOUTS = 3
TASKS = [
    {"question": f"What is ({a} + {b}) * 2?", "answer": (a + b) * 2} for a, b in [(12, 30), (7, 8), (100, 5)]
]


@pytest.fixture
def serve_smollm2() -> Iterator[Any]:
    """`serve_smollm2(compact_json)`: a gateway whose scripted backend, on SmolLM2's tokenizer,
    answers `two_calls_then_answer`."""
    from inference.real_tokenizer import smollm2_tokenizer

    servers: list[BackgroundServer] = []

    def start(compact_json: bool) -> Stack:
        store = MemoryStore()
        backend = ScriptedBackend(smollm2_tokenizer(), two_calls_then_answer, compact_json=compact_json)
        server = BackgroundServer(create_gateway_app(store, backend, SECRET))
        servers.append(server)
        return Stack(store=store, backend=backend, gateway_url=server.start().url)

    yield start
    for server in servers:
        server.stop()


def two_calls_then_answer(request: GenerationRequest) -> ScriptedReply:
    """(a + b) * 2 in two calculator calls, then the answer: three calls per rollout."""
    messages = request.messages or []
    results = [str(m["content"]) for m in messages if m["role"] == "tool"]
    if not results:
        question = str(messages[0]["content"])
        a, b = question.removeprefix("What is (").split(")")[0].split(" + ")
        call = ScriptedToolCall(name="calculator", arguments={"expression": f"{a} + {b}"})
        return ScriptedReply(text="Let me add first.", tool_calls=[call])
    if len(results) == 1:
        call = ScriptedToolCall(name="calculator", arguments={"expression": f"{results[0]} * 2"})
        return ScriptedReply(tool_calls=[call])
    return ScriptedReply(text=f"ANSWER: {results[-1]}")


async def run_rollouts(stack: Stack, agent: Any) -> CreditMetrics:
    """Run the tasks with a real runner; the credit metrics (merged mode) of every rollout, summed."""
    rollouts = await stack.store.enqueue_rollouts([RolloutSpec(task=t) for t in TASKS[:ROLLOUTS]])
    runner = Runner(stack.store, agent, stack.gateway_url, SECRET, timeout_s=60, concurrency=ROLLOUTS)
    stats = await runner.run(max_rollouts=ROLLOUTS)
    assert (stats.succeeded, stats.errors) == (ROLLOUTS, []), stats
    total = CreditMetrics()
    for rollout in await stack.store.wait_for_rollouts([r.rollout_id for r in rollouts], 10.0):
        assert rollout.status == RolloutStatus.succeeded and rollout.reward == 1.0
        attempts = (await stack.store.query_attempts(AttemptQuery(rollout_id=rollout.rollout_id))).items
        spans = (await stack.store.query_spans(SpanQuery(rollout_id=rollout.rollout_id, limit=1000))).items
        _, metrics = build_transitions(rollout, spans, CreditConfig(mode="merged"), attempts=attempts)
        total += metrics
    return total


def assert_token_faithful(metrics: CreditMetrics, backend: ScriptedBackend) -> None:
    flat = metrics.as_dict()
    assert (metrics.calls, metrics.transitions) == (3 * ROLLOUTS, ROLLOUTS)  # one sample per rollout
    assert (flat["credit/merge_rate"], metrics.merge_mismatches) == (1.0, 0)
    # Each call's earlier turns came back re-serialised and were put back as generated (1 + 2 a rollout).
    assert (metrics.history_unmatched, metrics.history_respelled) == (0, 3 * ROLLOUTS)
    # The prompts really carried the tools in the default form and the earlier calls as generated.
    last = backend.requests[-1]
    assert last.generated_turns and len(last.generated_turns) == 2
    text = backend.decode(backend.prompt_ids(last))
    assert "<tools>" in text and text.count("<tool_response>\n") == 2


async def test_the_demo_agent_merges_every_call_with_the_real_bpe(serve_smollm2: Any) -> None:
    stack = serve_smollm2(compact_json=False)  # the agent sends the arguments back compacted
    assert_token_faithful(await run_rollouts(stack, calc_agent), stack.backend)


@agent
async def langgraph_calc_agent(task: dict[str, Any], llm: LLM) -> float:
    """examples/frameworks/langgraph_calc.py's agent: a ReAct graph with a `@tool` calculator."""
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import ToolNode, create_react_agent

    @tool
    def calculator(expression: str) -> str:
        """Compute a op b"""
        return str(calculate(expression))

    model = ChatOpenAI(base_url=llm.base_url, api_key=llm.api_key, model=llm.model, max_retries=0)
    graph = create_react_agent(model, ToolNode([calculator], handle_tool_errors=TOOL_ERROR_TEXT))
    state = await graph.ainvoke({"messages": [("user", str(task["question"]))]}, {"recursion_limit": 9})
    return 1.0 if parse_answer(str(state["messages"][-1].content)) == int(task["answer"]) else 0.0


@pytest.mark.filterwarnings("ignore:create_react_agent has been moved")
async def test_a_langgraph_agent_merges_every_call_with_the_real_bpe(serve_smollm2: Any) -> None:
    pytest.importorskip("langgraph")
    pytest.importorskip("langchain_openai")
    stack = serve_smollm2(compact_json=True)  # LangChain sends the arguments back with spaces
    assert_token_faithful(await run_rollouts(stack, langgraph_calc_agent), stack.backend)


SCHEMA = {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}


async def anthropic_turns(url: str, attempt_id: str, key: str) -> None:
    """A tool loop with the Anthropic SDK: a tool_use, its tool_result, the answer."""
    import anthropic

    base = f"{url}/r/{attempt_id}"
    client = anthropic.AsyncAnthropic(base_url=base, api_key=key, max_retries=0)
    tools = [{"name": "calculator", "description": "Compute a op b", "input_schema": SCHEMA}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": TASKS[0]["question"]}]
    try:
        for _ in range(3):
            reply = await client.messages.create(
                model="policy",
                max_tokens=64,
                tools=tools,
                messages=messages,  # type: ignore[arg-type]
            )
            messages.append({"role": "assistant", "content": reply.content})
            uses = [b for b in reply.content if b.type == "tool_use"]
            if not uses:
                return
            results = [
                {"type": "tool_result", "tool_use_id": u.id, "content": str(calculate(**u.input))}
                for u in uses
            ]  # type: ignore[arg-type]
            messages.append({"role": "user", "content": results})
    finally:
        await client.close()


async def responses_turns(url: str, attempt_id: str, key: str) -> None:
    """A tool loop with the OpenAI Responses API: a function_call, its output, the answer."""
    import openai

    base = f"{url}/r/{attempt_id}/v1"
    client = openai.AsyncOpenAI(base_url=base, api_key=key, max_retries=0)
    tools = [
        {"type": "function", "name": "calculator", "description": "Compute a op b", "parameters": SCHEMA}
    ]
    items: list[dict[str, Any]] = [{"role": "user", "content": TASKS[0]["question"]}]
    try:
        for _ in range(3):
            reply = await client.responses.create(model="policy", input=items, tools=tools)  # type: ignore[arg-type]
            calls = [o for o in reply.output if o.type == "function_call"]
            if not calls:
                return
            items += [
                o.model_dump(exclude_none=True) for o in reply.output
            ]  # text and calls, as the SDK shows
            for call in calls:
                output = str(calculate(json.loads(call.arguments)["expression"]))
                items.append({"type": "function_call_output", "call_id": call.call_id, "output": output})
    finally:
        await client.close()


@pytest.mark.parametrize("turns", [anthropic_turns, responses_turns], ids=["anthropic", "responses"])
async def test_anthropic_and_responses_tool_loops_get_the_default_form_and_merge(turns: Any) -> None:
    from gateway.conftest import SECRET as GATEWAY_SECRET
    from gateway.conftest import running_attempt, serve
    from inference.real_tokenizer import smollm2_tokenizer

    backend = ScriptedBackend(smollm2_tokenizer(), two_calls_then_answer)
    for served in serve(backend):
        leased = await running_attempt(served.store, TASKS[0])
        attempt_id = leased.attempt.attempt_id
        await turns(served.url, attempt_id, attempt_token(GATEWAY_SECRET, attempt_id))
        await served.gateway.flush(attempt_id)
        await served.store.finish_attempt(
            attempt_id, AttemptOutcome(status=AttemptStatus.succeeded, reward=1.0)
        )
        (rollout,) = await served.store.wait_for_rollouts([leased.rollout.rollout_id], 10.0)
        spans = (await served.store.query_spans(SpanQuery(attempt_id=attempt_id, limit=1000))).items
        _, metrics = build_transitions(rollout, spans, CreditConfig(mode="merged"))
        assert (metrics.calls, metrics.transitions, metrics.merge_mismatches) == (3, 1, 0)
        assert (metrics.as_dict()["credit/merge_rate"], metrics.history_unmatched) == (1.0, 0)
        last = backend.requests[-1]
        text = backend.decode(backend.prompt_ids(last))
        assert '<tools>\n{"type": "function", "function": {"name": "calculator"' in text
        assert text.count("<tool_call>{") == 3 and text.count("<tool_response>\n") == 2
