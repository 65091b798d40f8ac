"""An OpenAI Agents SDK agent as its docs write it, run by the real runner: its failing function tool
is an AIR signal on the call that asked for it, its agent name names the calls, and nothing is
uploaded to api.openai.com."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("agents")

import agents
from agents import Agent, OpenAIResponsesModel, Runner, function_tool
from agents.tracing import get_trace_provider
from agents.tracing import processors as sdk_processors
from openai import AsyncOpenAI

import reinforge
from reinforge import semconv
from reinforge.credit import CreditConfig
from reinforge.runner import LLM
from reinforge.runner.frameworks import instrument_frameworks
from reinforge.types import SpanStatusCode

from .conftest import AIR, ANSWER, FAILING_CALL, run_one


@function_tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    return str(eval(expression, {"__builtins__": {}}))  # raises ZeroDivisionError on 1/0


@reinforge.agent
async def calc_agent(task: dict[str, Any], llm: LLM) -> float:
    client = AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    agent = Agent(
        name="calc_agent",
        instructions="Use the calculator.",
        tools=[calculator],
        model=OpenAIResponsesModel(model=llm.model, openai_client=client),
    )
    result = await Runner.run(agent, task["question"])
    return 1.0 if "42" in str(result.final_output) else 0.0


def _processors() -> list[Any]:
    return list(get_trace_provider()._multi_processor._processors)  # type: ignore[attr-defined]


def _uploaders() -> list[Any]:
    return [
        p
        for p in _processors()
        if isinstance(p, sdk_processors.BatchTraceProcessor)
        and isinstance(p._exporter, sdk_processors.BackendSpanExporter)
    ]


async def test_a_failing_function_tool_is_an_air_signal_and_the_agent_names_its_calls(serve: Any) -> None:
    stack = serve([FAILING_CALL, ANSWER])
    run = await run_one(stack, calc_agent)

    (tool_step,) = run.steps(semconv.STEP_TOOL)
    assert tool_step.attributes[semconv.ATTR_TOOL_NAME] == "calculator"
    assert tool_step.attributes[semconv.ATTR_AIR_SIGNAL] == semconv.AIR_TOOL_ERROR
    assert tool_step.attributes[semconv.ATTR_FRAMEWORK] == "openai_agents"
    assert tool_step.status.code == SpanStatusCode.error
    assert tool_step.status.message is not None
    assert tool_step.status.message.startswith("Error running tool (non-fatal)")
    (role,) = run.steps(semconv.STEP_AGENT)
    assert role.attributes[semconv.ATTR_AGENT_NAME] == "calc_agent"
    assert tool_step.parent_id == role.span_id  # through the SDK's turn span, which is not recorded

    transitions, metrics = run.credit(AIR)
    assert [t.reward_sources for t in transitions] == [
        {"equal": 1.0, "air": -0.2},
        {"equal": 1.0, "air": 0.0},
    ]
    assert [t.agent_name for t in transitions] == ["calc_agent", "calc_agent"]
    assert metrics.air_signals == {semconv.AIR_TOOL_ERROR: 1}
    kept, _ = run.credit(CreditConfig(agents=["someone_else"]))
    assert kept == []
    # The SDK's uploader never started its export thread: no upload was attempted.
    uploader = sdk_processors._global_processor
    assert uploader is None or uploader._worker_thread is None


def test_the_uploading_processor_is_gone_and_a_users_processor_stays() -> None:
    class Mine(agents.TracingProcessor):
        def on_trace_start(self, trace: Any) -> None: ...
        def on_trace_end(self, trace: Any) -> None: ...
        def on_span_start(self, span: Any) -> None: ...
        def on_span_end(self, span: Any) -> None: ...
        def shutdown(self) -> None: ...
        def force_flush(self) -> None: ...

    mine = Mine()
    agents.add_trace_processor(mine)
    instrument_frameworks()
    instrument_frameworks()  # idempotent
    assert _uploaders() == []
    assert mine in _processors()
    ours = [p for p in _processors() if type(p).__name__ == "ReinforgeTracingProcessor"]
    assert len(ours) == 1
    agents.set_trace_processors([p for p in _processors() if p is not mine])
