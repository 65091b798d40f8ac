"""LangGraph agents as their docs write them, run by the real runner: tool errors become AIR signals
and node names become agent names, with no reinforge code in the agent."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("langgraph")
pytest.importorskip("langchain_openai")

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, create_react_agent

import reinforge
from reinforge import semconv
from reinforge.credit import CreditConfig, build_transitions
from reinforge.runner import LLM, Runner
from reinforge.types import RolloutSpec, SpanQuery, SpanStatusCode

from .conftest import AIR, ANSWER, FAILING_CALL, SECRET, run_one

# The docs' form; LangGraph 1.x points to langchain.agents.create_agent, which is not installed here.
pytestmark = pytest.mark.filterwarnings("ignore:create_react_agent has been moved")


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    return str(eval(expression, {"__builtins__": {}}))  # raises ZeroDivisionError on 1/0


def chat(llm: LLM) -> ChatOpenAI:
    return ChatOpenAI(model=llm.model, base_url=llm.base_url, api_key=llm.api_key, max_retries=0)


@reinforge.agent
async def react_agent(task: dict[str, Any], llm: LLM) -> float:
    graph = create_react_agent(chat(llm), ToolNode([calculator], handle_tool_errors=True))
    result = await graph.ainvoke({"messages": [("user", task["question"])]})
    return 1.0 if "42" in result["messages"][-1].content else 0.0


async def test_a_failing_tool_in_a_react_agent_is_an_air_signal_on_the_call_that_made_it(serve: Any) -> None:
    stack = serve([FAILING_CALL, ANSWER])
    run = await run_one(stack, react_agent)

    (tool_step,) = run.steps(semconv.STEP_TOOL)
    assert tool_step.attributes[semconv.ATTR_TOOL_NAME] == "calculator"
    assert tool_step.attributes[semconv.ATTR_AIR_SIGNAL] == semconv.AIR_TOOL_ERROR
    assert tool_step.attributes[semconv.ATTR_FRAMEWORK] == "langchain"
    assert tool_step.status.code == SpanStatusCode.error
    assert tool_step.status.message == "ZeroDivisionError: division by zero"
    # create_react_agent's "agent" node called the model twice (the "tools" node calls none).
    roles = run.steps(semconv.STEP_AGENT)
    assert [r.attributes[semconv.ATTR_AGENT_NAME] for r in roles] == ["agent", "agent"]

    transitions, metrics = run.credit(AIR)
    assert len(transitions) == 2
    assert [t.reward_sources for t in transitions] == [
        {"equal": 1.0, "air": -0.2},
        {"equal": 1.0, "air": 0.0},
    ]
    assert [t.agent_name for t in transitions] == ["agent", "agent"]
    assert metrics.air_signals == {semconv.AIR_TOOL_ERROR: 1}
    assert (metrics.calls_named_by_role, metrics.calls_role_ambiguous) == (2, 0)


class Draft(MessagesState):
    pass


@reinforge.agent
async def writer_checker(task: dict[str, Any], llm: LLM) -> float:
    model = chat(llm)

    async def writer(state: Draft) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    async def checker(state: Draft) -> dict[str, Any]:
        review = [*state["messages"], ("user", "Check the draft.")]
        return {"messages": [await model.ainvoke(review)]}

    graph = StateGraph(Draft)
    graph.add_node("writer", writer)
    graph.add_node("checker", checker)
    graph.add_edge(START, "writer")
    graph.add_edge("writer", "checker")
    graph.add_edge("checker", END)
    result = await graph.compile().ainvoke({"messages": [("user", task["question"])]})
    return 1.0 if "correct" in result["messages"][-1].content else 0.0


async def test_two_roles_of_a_graph_name_their_calls_and_train_selectively(serve: Any) -> None:
    stack = serve(["Draft: the answer is 42.", "Checked: the draft is correct."])
    run = await run_one(stack, writer_checker)

    roles = run.steps(semconv.STEP_AGENT)
    assert [r.attributes[semconv.ATTR_AGENT_NAME] for r in roles] == ["writer", "checker"]
    calls = sorted((s for s in run.spans if s.name == semconv.SPAN_LLM_CALL), key=lambda s: s.start_time)
    # No name on the wire: the gateway records the calls unnamed, credit names them.
    assert [semconv.ATTR_AGENT_NAME in c.attributes for c in calls] == [False, False]
    for role, call in zip(roles, calls, strict=True):
        assert role.start_time <= call.start_time and call.end_time is not None
        assert role.end_time is not None and call.end_time <= role.end_time

    every, metrics = run.credit(CreditConfig())
    assert [t.agent_name for t in every] == ["writer", "checker"]
    assert metrics.calls_named_by_role == 2
    writer_only, metrics = run.credit(CreditConfig(agents=["writer"]))
    assert [t.agent_name for t in writer_only] == ["writer"]
    assert writer_only[0].response_ids == every[0].response_ids
    assert (metrics.calls_trained, metrics.calls_filtered) == (1, 1)


async def test_turned_off_the_runner_records_no_framework_steps(serve: Any) -> None:
    stack = serve([FAILING_CALL, ANSWER])
    run = await run_one(stack, react_agent, instrument_frameworks=False)

    assert run.steps(semconv.STEP_TOOL) == [] and run.steps(semconv.STEP_AGENT) == []
    transitions, metrics = run.credit(AIR)
    assert [t.agent_name for t in transitions] == [None, None]
    assert metrics.air_signals == {}


async def test_an_explicit_agent_name_wins_over_the_node_name(serve: Any) -> None:
    stack = serve(["Draft: the answer is 42.", "Checked: the draft is correct."])
    named = reinforge.agent(name="solver")(writer_checker.fn)
    run = await run_one(stack, named)

    assert len(run.steps(semconv.STEP_AGENT)) == 2
    transitions, metrics = run.credit(CreditConfig())
    assert [t.agent_name for t in transitions] == ["solver", "solver"]
    assert metrics.calls_named_by_role == 0


@tool("calculator")
def wrapped_calculator(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    with reinforge.span("calculator", kind="tool"):  # how agents recorded tool errors before the hooks
        return str(eval(expression, {"__builtins__": {}}))


@reinforge.agent
async def wrapped_react_agent(task: dict[str, Any], llm: LLM) -> float:
    graph = create_react_agent(chat(llm), ToolNode([wrapped_calculator], handle_tool_errors=True))
    result = await graph.ainvoke({"messages": [("user", task["question"])]})
    return 1.0 if "42" in result["messages"][-1].content else 0.0


async def test_a_tool_error_the_agent_also_records_itself_is_charged_once(serve: Any) -> None:
    stack = serve([FAILING_CALL, ANSWER])
    run = await run_one(stack, wrapped_react_agent)

    failed = [s for s in run.steps(semconv.STEP_TOOL) if s.status.code == SpanStatusCode.error]
    assert sorted(semconv.ATTR_FRAMEWORK in s.attributes for s in failed) == [False, True]
    transitions, metrics = run.credit(AIR)
    assert metrics.air_signals == {semconv.AIR_TOOL_ERROR: 1}
    assert [t.reward_sources["air"] for t in transitions] == [-0.2, 0.0]


@reinforge.agent
def sync_writer_checker(task: dict[str, Any], llm: LLM) -> float:
    model = chat(llm)

    def writer(state: Draft) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    def checker(state: Draft) -> dict[str, Any]:
        return {"messages": [model.invoke([*state["messages"], ("user", "Check the draft.")])]}

    graph = StateGraph(Draft)
    graph.add_node("writer", writer)
    graph.add_node("checker", checker)
    graph.add_edge(START, "writer")
    graph.add_edge("writer", "checker")
    graph.add_edge("checker", END)
    graph.compile().invoke({"messages": [("user", task["question"])]})
    return 1.0


async def test_concurrent_sync_graphs_keep_their_roles_in_their_own_attempts(serve: Any) -> None:
    stack = serve(["Draft: the answer is 42.", "Checked: the draft is correct."])
    rollouts = await stack.store.enqueue_rollouts([RolloutSpec(task={"question": f"q{i}"}) for i in range(3)])
    runner = Runner(stack.store, sync_writer_checker, stack.gateway_url, SECRET, concurrency=3)
    stats = await runner.run(max_rollouts=3)
    assert (stats.succeeded, stats.errors) == (3, [])

    for rollout in await stack.store.wait_for_rollouts([r.rollout_id for r in rollouts], 10.0):
        spans = (await stack.store.query_spans(SpanQuery(rollout_id=rollout.rollout_id, limit=100))).items
        roles = sorted(
            (s for s in spans if s.attributes.get(semconv.ATTR_STEP_KIND) == semconv.STEP_AGENT),
            key=lambda s: s.start_time,
        )
        assert [r.attributes[semconv.ATTR_AGENT_NAME] for r in roles] == ["writer", "checker"]
        transitions, metrics = build_transitions(rollout, spans, CreditConfig())
        assert [t.agent_name for t in transitions] == ["writer", "checker"]
        assert metrics.calls_role_ambiguous == 0
