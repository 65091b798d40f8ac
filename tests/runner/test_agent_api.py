"""The agent-facing API without a runner: decorator, class form, loading by name, LLM endpoints."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

import reinforge
from reinforge.errors import InvalidRequestError
from reinforge.runner import LLM, Agent, FunctionAgent, as_agent, load_agent, model_from_resources


def test_decorator_keeps_the_function_callable_and_records_options() -> None:
    @reinforge.agent(name="solver", timeout_s=5)
    def solve(task: dict[str, Any], llm: LLM) -> float:
        """Solve it."""
        return float(task["x"])

    assert isinstance(solve, FunctionAgent) and isinstance(solve, Agent)
    assert (solve.name, solve.timeout_s, solve.is_async) == ("solver", 5, False)
    assert solve.__doc__ == "Solve it." and solve.__name__ == "solve"
    assert solve({"x": 2}, LLM("u", "k", "m")) == 2.0

    @reinforge.agent
    async def bare(task: dict[str, Any], llm: LLM) -> None:
        return None

    assert bare.is_async and bare.name is None
    assert asyncio.run(bare({}, LLM("u", "k", "m"))) is None  # type: ignore[arg-type]


def test_class_form_and_conversions() -> None:
    class Solver(reinforge.Agent):
        name = "s"

        async def rollout(self, task: dict[str, Any], llm: LLM) -> float:
            return 1.0

    assert as_agent(Solver).name == "s" and as_agent(Solver).is_async
    instance = Solver()
    assert as_agent(instance) is instance
    assert isinstance(as_agent(lambda task, llm: 0.0), FunctionAgent)
    with pytest.raises(InvalidRequestError, match="not an agent"):
        as_agent("solve")
    with pytest.raises(NotImplementedError, match="must override rollout"):
        reinforge.Agent().rollout({}, LLM("u", "k", "m"))


def test_load_agent_by_module_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_agents.py").write_text(
        "import reinforge\n\n"
        "@reinforge.agent(name='a')\n"
        "def solve(task, llm):\n    return 1.0\n\n"
        "class Planner(reinforge.Agent):\n    name = 'p'\n\n"
        "    def rollout(self, task, llm):\n        return 0.0\n\n"
        "class Holder:\n    agent = solve\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert load_agent("my_agents:solve").name == "a"
        assert load_agent("my_agents:Planner").name == "p"
        assert load_agent("my_agents:Holder.agent").name == "a"
        with pytest.raises(InvalidRequestError, match="has no attribute"):
            load_agent("my_agents:missing")
        with pytest.raises(InvalidRequestError, match=r"package\.module:function"):
            load_agent("my_agents")
        with pytest.raises(InvalidRequestError, match="cannot import"):
            load_agent("not_a_module_anywhere:solve")
    finally:
        sys.modules.pop("my_agents", None)


def test_llm_endpoints_for_an_attempt() -> None:
    llm = LLM.for_attempt("http://gw:1/gateway/", "att/1", "key", "m", {"p": 1}, 3)
    assert llm.base_url == "http://gw:1/gateway/v1"  # one URL for every attempt: the key names it
    assert llm.reward_url == "http://gw:1/gateway/r/att%2F1/reward"
    tagged = llm.for_agent("critic")
    assert tagged.base_url == "http://gw:1/gateway/agents/critic/v1"
    assert (tagged.agent_name, tagged.api_key, tagged.resources, tagged.resources_version) == (
        "critic", "key", {"p": 1}, 3,
    )  # fmt: skip
    assert tagged.for_agent("judge").base_url == "http://gw:1/gateway/agents/judge/v1"
    with pytest.raises(InvalidRequestError, match="agent name"):
        llm.for_agent("a/b")
    with pytest.raises(InvalidRequestError, match="not made by a runner"):
        LLM("http://x/v1", "k", "m").for_agent("a")


def test_model_name_from_resources() -> None:
    assert model_from_resources({"llm": {"model": "a"}, "model": "b"}, "d") == "a"
    assert model_from_resources({"model": "b"}, "d") == "b"
    assert model_from_resources({"llm": "not a dict"}, "d") == "d"
