"""In-process agents: a decorated function or an `Agent` subclass.

    @reinforge.agent(name="solver")
    async def solve(task: dict, llm: reinforge.LLM) -> float | None: ...

    class Solver(reinforge.Agent):
        name = "solver"
        def rollout(self, task, llm): ...

Sync agents run in the runner's thread pool and async agents on its event loop; either may return the
reward, or None and emit it (`reinforge.emit_reward(..., final=True)`, or a POST to the reward URL).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Awaitable, Callable
from types import ModuleType
from typing import Any, overload

from reinforge.errors import InvalidRequestError
from reinforge.runner.llm import LLM

RolloutResult = float | int | None
AgentFunction = Callable[[dict[str, Any], LLM], RolloutResult | Awaitable[RolloutResult]]


class Agent:
    """Base class of in-process agents: override `rollout` (sync or async).

    `name` tags the agent's LLM calls (selective training); `timeout_s` bounds one attempt.
    """

    name: str | None = None
    timeout_s: float | None = None

    def rollout(self, task: dict[str, Any], llm: LLM) -> RolloutResult | Awaitable[RolloutResult]:
        raise NotImplementedError(f"{type(self).__name__} must override rollout(self, task, llm)")

    @property
    def is_async(self) -> bool:
        """Whether `rollout` is a coroutine function (it then runs on the event loop, not in a thread)."""
        return inspect.iscoroutinefunction(self.rollout)


class FunctionAgent(Agent):
    """A function made into an agent by `@reinforge.agent`; still callable as the function."""

    def __init__(self, fn: AgentFunction, name: str | None = None, timeout_s: float | None = None) -> None:
        if not callable(fn):
            raise InvalidRequestError(f"@reinforge.agent needs a function, got {fn!r}")
        self.fn = fn
        self.name = name
        self.timeout_s = timeout_s
        functools.update_wrapper(self, fn)

    def rollout(self, task: dict[str, Any], llm: LLM) -> RolloutResult | Awaitable[RolloutResult]:
        return self.fn(task, llm)

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def __call__(self, task: dict[str, Any], llm: LLM) -> RolloutResult | Awaitable[RolloutResult]:
        return self.fn(task, llm)


@overload
def agent(fn: AgentFunction, /) -> FunctionAgent: ...
@overload
def agent(
    *, name: str | None = None, timeout_s: float | None = None
) -> Callable[[AgentFunction], FunctionAgent]: ...
def agent(
    fn: AgentFunction | None = None, /, *, name: str | None = None, timeout_s: float | None = None
) -> FunctionAgent | Callable[[AgentFunction], FunctionAgent]:
    """Make `(task, llm) -> reward | None` (sync or async) trainable; usable bare or with options."""
    if fn is not None:
        return FunctionAgent(fn, name=name, timeout_s=timeout_s)
    return lambda f: FunctionAgent(f, name=name, timeout_s=timeout_s)


def as_agent(obj: object) -> Agent:
    """An `Agent` from what a user hands the runner: an Agent (instance or class) or a plain function."""
    if isinstance(obj, Agent):
        return obj
    if isinstance(obj, type) and issubclass(obj, Agent):
        return obj()
    if callable(obj):
        return FunctionAgent(obj)
    raise InvalidRequestError(f"not an agent: {obj!r}; use @reinforge.agent or subclass reinforge.Agent")


def load_agent(spec: str) -> Agent:
    """`module:attribute` (as in `reinforge runner --agent pkg.mod:solve`) resolved to an Agent.

    The module may also be a script's path (`path/to/train.py:solve`): it is imported under another
    name than `__main__`, so its `if __name__ == "__main__":` block does not run again.
    """
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise InvalidRequestError(f"--agent must look like 'package.module:function', got {spec!r}")
    module = _import_script(module_name) if module_name.endswith(".py") else _import_module(module_name)
    obj = attribute_at(module, attr)
    if obj is _MISSING:
        raise InvalidRequestError(f"module {module_name!r} has no attribute {attr!r}")
    return as_agent(obj)


_MISSING = object()


def attribute_at(obj: object, dotted: str) -> object:
    """`obj.a.b` for `dotted` "a.b", or `_MISSING` when a part is absent."""
    for part in dotted.split("."):
        obj = getattr(obj, part, _MISSING)
        if obj is _MISSING:
            break
    return obj


def _import_module(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise InvalidRequestError(f"cannot import agent module {name!r}: {e}") from e


def _import_script(path: str) -> ModuleType:
    name = "__reinforge_agent_script__"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None or not os.path.isfile(path):
        raise InvalidRequestError(f"cannot import agent script {path!r}: no such file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up while it executes
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        raise InvalidRequestError(f"cannot import agent script {path!r}: {type(e).__name__}: {e}") from e
    return module
