"""The hooks themselves, outside a runner: they record inside an attempt that asks for it and
nowhere else, install once, and never import a framework that is not installed."""

from __future__ import annotations

from typing import Any

import pytest

from reinforge import semconv
from reinforge.runner import frameworks
from reinforge.runner.frameworks import _Framework, _installed, instrument_frameworks
from reinforge.tracing import attempt_scope
from reinforge.types import SpanStatusCode

from .collect import Collected, attempt


def _tool_graph() -> Any:
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode

    @tool
    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression."""
        return str(eval(expression, {"__builtins__": {}}))

    graph = StateGraph(MessagesState)
    graph.add_node("tools", ToolNode([calculator], handle_tool_errors=True))
    graph.add_edge(START, "tools")
    graph.add_edge("tools", END)
    call = {"name": "calculator", "args": {"expression": "1/0"}, "id": "call_1"}
    return graph.compile(), {"messages": [AIMessage(content="", tool_calls=[call])]}


def _our_hooks() -> list[Any]:
    from langchain_core.tracers.context import _configure_hooks

    return [var for var, *_ in _configure_hooks if type(var).__name__ == "_HandlerInAttempt"]


def test_langchain_tool_runs_are_recorded_only_inside_an_attempt_that_asks() -> None:
    pytest.importorskip("langgraph")
    pytest.importorskip("langchain_core.callbacks")  # the agent's own import: what gets hooked
    instrument_frameworks()
    instrument_frameworks()
    (hook,) = _our_hooks()  # once, however often it is turned on
    graph, state = _tool_graph()

    outside = Collected()
    assert hook.get() is None
    result = graph.invoke(state)
    assert result["messages"][-1].status == "error"  # ToolNode made the error a message
    with attempt_scope(attempt(outside, framework_telemetry=False)):
        assert hook.get() is None
        graph.invoke(state)
    assert outside.spans == []

    inside = Collected()
    with attempt_scope(attempt(inside)):
        assert hook.get() is not None
        graph.invoke(state)
    # A node that calls no model is no role (roles are named from chat model runs).
    assert [s for s in inside.spans if s.attributes.get(semconv.ATTR_STEP_KIND) == semconv.STEP_AGENT] == []
    (tool,) = [s for s in inside.spans if s.attributes.get(semconv.ATTR_STEP_KIND) == semconv.STEP_TOOL]
    assert (tool.name, tool.attributes[semconv.ATTR_AIR_SIGNAL]) == ("calculator", semconv.AIR_TOOL_ERROR)
    assert tool.status.code == SpanStatusCode.error
    assert (tool.rollout_id, tool.attempt_id) == ("r-hooks", "a-hooks")


def test_langgraph_control_flow_is_no_tool_failure() -> None:
    pytest.importorskip("langgraph")
    from langgraph.errors import GraphInterrupt

    from reinforge.runner.frameworks.langchain import _failure

    assert _failure(GraphInterrupt()) is None
    assert _failure(KeyboardInterrupt()) is None
    error = ValueError("bad")
    assert _failure(error) is error


def test_a_framework_that_is_not_installed_is_never_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    imported: list[str] = []
    missing = _Framework(
        "missing", "reinforge_no_such_module", "reinforge-no-such-dist", lambda: imported.append("x")
    )
    shadowed = _Framework("shadowed", "reinforge", "reinforge-no-such-dist", lambda: imported.append("y"))
    assert not _installed(missing)
    assert not _installed(shadowed)  # a module of that name, but not from the framework's package
    monkeypatch.setattr(frameworks, "_FRAMEWORKS", (missing, shadowed))
    assert "missing" not in instrument_frameworks()
    assert imported == []


def test_a_hook_that_fails_to_install_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> None:
        raise RuntimeError("incompatible version")

    present = _Framework("broken", "reinforge", "pydantic", broken)
    monkeypatch.setattr(frameworks, "_FRAMEWORKS", (present,))
    assert "broken" not in instrument_frameworks()
