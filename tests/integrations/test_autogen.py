"""An AutoGen `AssistantAgent` as its docs write it, run by the real runner: AutoGen's own
OpenTelemetry spans (through the global tracer provider) give the AIR signal and the agent name."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("autogen_agentchat")
pytest.importorskip("autogen_ext.models.openai")

from autogen_agentchat.agents import AssistantAgent
from autogen_ext.models.openai import OpenAIChatCompletionClient

import reinforge
from reinforge import semconv
from reinforge.runner import LLM
from reinforge.types import SpanStatusCode

from .conftest import AIR, ANSWER, FAILING_CALL, run_one

# The scripted backend answers under its own model name.
pytestmark = pytest.mark.filterwarnings("ignore:Resolved model mismatch")

MODEL_INFO = {
    "vision": False,
    "function_calling": True,
    "json_output": False,
    "family": "unknown",
    "structured_output": False,
}


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    return str(eval(expression, {"__builtins__": {}}))  # raises ZeroDivisionError on 1/0


@reinforge.agent
async def calc_agent(task: dict[str, Any], llm: LLM) -> float:
    client = OpenAIChatCompletionClient(
        model=llm.model, base_url=llm.base_url, api_key=llm.api_key, model_info=MODEL_INFO, max_retries=0
    )
    agent = AssistantAgent("calc_agent", model_client=client, tools=[calculator], reflect_on_tool_use=True)
    result = await agent.run(task=task["question"])
    await client.close()
    return 1.0 if "42" in str(result.messages[-1].content) else 0.0


async def test_autogen_tool_error_and_agent_name_come_from_its_own_otel_spans(serve: Any) -> None:
    stack = serve([FAILING_CALL, ANSWER])
    run = await run_one(stack, calc_agent)

    (tool_step,) = run.steps(semconv.STEP_TOOL)
    assert tool_step.name == "execute_tool calculator"
    assert tool_step.attributes[semconv.ATTR_TOOL_NAME] == "calculator"
    assert tool_step.attributes[semconv.ATTR_AIR_SIGNAL] == semconv.AIR_TOOL_ERROR
    assert tool_step.attributes[semconv.ATTR_FRAMEWORK] == "otel_genai"
    assert tool_step.status.code == SpanStatusCode.error
    (role,) = run.steps(semconv.STEP_AGENT)
    assert (role.name, role.attributes[semconv.ATTR_AGENT_NAME]) == ("invoke_agent calc_agent", "calc_agent")
    assert tool_step.parent_id == role.span_id

    transitions, metrics = run.credit(AIR)
    assert [t.reward_sources for t in transitions] == [
        {"equal": 1.0, "air": -0.2},
        {"equal": 1.0, "air": 0.0},
    ]
    assert [t.agent_name for t in transitions] == ["calc_agent", "calc_agent"]
    assert metrics.air_signals == {semconv.AIR_TOOL_ERROR: 1}


async def test_turned_off_autogen_spans_are_stored_untranslated(serve: Any) -> None:
    stack = serve([FAILING_CALL, ANSWER])
    run = await run_one(stack, calc_agent, instrument_frameworks=False)

    tool = next(s for s in run.spans if s.name == "execute_tool calculator")
    assert semconv.ATTR_STEP_KIND not in tool.attributes
    transitions, metrics = run.credit(AIR)
    assert [t.agent_name for t in transitions] == [None, None]
    assert metrics.air_signals == {}
