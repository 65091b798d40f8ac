"""The calc agent end to end through a real runner, store server and gateway (scripted model replies)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import pytest
import torch

from reinforge import semconv
from reinforge.demo.agent import calc_agent, compact, parse_answer
from reinforge.demo.calculator import CALCULATOR_TOOL
from reinforge.demo.tasks import generate_tasks, make_task
from reinforge.demo.traces import corpus_text, synthetic_traces
from reinforge.gateway.app import create_gateway_app
from reinforge.inference.contract import GenerationRequest
from reinforge.inference.scripted import ScriptedBackend, ScriptedReply, ScriptedToolCall
from reinforge.models import build_tokenizer
from reinforge.net.background import BackgroundServer
from reinforge.runner import Runner
from reinforge.store.http.server import create_store_app
from reinforge.store.memory import MemoryStore
from reinforge.types import RolloutSpec, RolloutStatus, SpanQuery, SpanStatusCode

torch.set_num_threads(1)
SECRET = "calc-test-secret-0123456789"


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    traces = synthetic_traces(generate_tasks("train", 300, seed=0))
    return build_tokenizer(corpus_text(traces, [CALCULATOR_TOOL]), vocab_size=300)


def scripted(expressions: list[str], answer: int) -> Callable[[GenerationRequest], ScriptedReply]:
    """Reply with the next calculator call while any remain, then the answer."""

    def reply(request: GenerationRequest) -> ScriptedReply:
        done = sum(1 for m in request.messages or [] if m["role"] == "tool")
        if done < len(expressions):
            return ScriptedReply(
                tool_calls=[ScriptedToolCall(name="calculator", arguments={"expression": expressions[done]})]
            )
        return ScriptedReply(text=f"ANSWER: {answer}")

    return reply


async def run_agent(
    tokenizer: Any, task: dict[str, Any], replies: Callable[[GenerationRequest], ScriptedReply]
):
    store = MemoryStore()
    backend = ScriptedBackend(tokenizer, replies)
    app = create_store_app(store, "store-token-0123456789")
    app.mount("/gateway", create_gateway_app(store, backend, SECRET))
    with BackgroundServer(app) as server:
        [rollout] = await store.enqueue_rollouts([RolloutSpec(task=task, max_attempts=1)])
        runner = Runner(store, calc_agent, server.url + "/gateway", SECRET, concurrency=1, poll_seconds=0.1)
        stats = await asyncio.wait_for(runner.run(max_rollouts=1), 60)
        final = await store.get_rollout(rollout.rollout_id)
        spans = (await store.query_spans(SpanQuery(rollout_id=rollout.rollout_id))).items
    return stats, final, spans, backend


async def test_agent_solves_with_two_calls_and_is_rewarded(tokenizer: Any) -> None:
    task = make_task(7, "+", 18, "*", 2)
    stats, rollout, spans, backend = await run_agent(
        tokenizer, task.as_task(), scripted(["18*2", "7+36"], 43)
    )
    assert stats.succeeded == 1
    assert rollout.status == RolloutStatus.succeeded and rollout.reward == 1.0
    llm_spans = [s for s in spans if s.name == semconv.SPAN_LLM_CALL]
    assert len(llm_spans) == 3
    assert all(s.attributes[semconv.ATTR_AGENT_NAME] == "calc" for s in llm_spans)
    # The agent offers the calculator on every call and feeds results back as tool messages.
    last = backend.requests[-1]
    assert last.tools and last.tools[0]["function"]["name"] == "calculator"
    assert [m["content"] for m in last.messages or [] if m["role"] == "tool"] == ["36", "43"]
    tool_spans = [s for s in spans if s.attributes.get(semconv.ATTR_STEP_KIND) == semconv.STEP_TOOL]
    assert len(tool_spans) == 2 and all(s.status.code != SpanStatusCode.error for s in tool_spans)


async def test_answering_early_gets_no_reward(tokenizer: Any) -> None:
    task = make_task(7, "+", 18, "*", 2)
    _, rollout, _, _ = await run_agent(tokenizer, task.as_task(), scripted(["18*2"], 36))
    assert rollout.reward == 0.0


async def test_refused_calculator_call_is_an_air_signal(tokenizer: Any) -> None:
    task = make_task(7, "+", 18, "*", 2)
    _, rollout, spans, backend = await run_agent(tokenizer, task.as_task(), scripted(["7+18*2"], 43))
    assert rollout.reward == 1.0  # the answer was right; the bad call is penalised by AIR, not here
    [tool] = [s for s in spans if s.attributes.get(semconv.ATTR_STEP_KIND) == semconv.STEP_TOOL]
    assert tool.status.code == SpanStatusCode.error
    assert tool.attributes[semconv.ATTR_AIR_SIGNAL] == semconv.AIR_TOOL_ERROR
    assert backend.requests[-1].messages[-1]["content"].startswith("error:")  # type: ignore[index]


def test_answer_parsing_and_compact_arguments() -> None:
    assert parse_answer("ANSWER: 153") == 153
    assert parse_answer("so ANSWER:-4") == -4
    assert parse_answer("153") is None and parse_answer(None) is None
    assert compact('{"expression": "58*2"}') == '{"expression":"58*2"}'
    assert compact("not json") == "not json"


def test_tasks_for_the_agent_are_plain_json() -> None:
    task = generate_tasks("train", 1, seed=random.Random(0).randint(0, 9))[0].as_task()
    assert isinstance(task["question"], str) and isinstance(task["answer"], int)
