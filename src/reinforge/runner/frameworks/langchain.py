"""LangChain and LangGraph: tool runs become tool steps, and each chat model run inside a LangGraph
node an agent step named after the node.

Why the chat model runs and not the node runs: LangChain reports a chain event for every runnable of
a graph (dozens per turn), and handling them made a LangGraph agent's rollouts 10-14% slower
(benchmarks/frameworks_bench.py); a node's name also comes with the metadata of the chat model runs
it makes, which are what credit names. So the handler asks for no chain events at all.

LangChain has no OpenTelemetry of its own, but every run asks the configure hooks for extra callback
handlers. The hook registered here answers with reinforge's handler only inside an attempt that
records framework telemetry, so runs outside attempts carry no extra handler at all. `on_tool_error`
fires even when a `ToolNode(handle_tool_errors=True)` turns the error into a message for the model,
which is exactly the failure an AIR signal should see.
"""

from __future__ import annotations

import threading
from typing import Any
from uuid import UUID

from reinforge.runner.frameworks.steps import Step, recording_attempt, start_agent, start_tool

FRAMEWORK = "langchain"
_NODE_KEY = "langgraph_node"
_HIDDEN_TAG = "langsmith:hidden"
_CONTROL_FLOW = "GraphBubbleUp"
"""LangGraph's base of interrupts and `Command` jumps: raised through tools and nodes on purpose."""

_lock = threading.Lock()
_installed = False


def _failure(error: BaseException) -> BaseException | None:
    """The error as a step failure, or None when it is control flow or a cancellation."""
    if not isinstance(error, Exception):
        return None
    if any(cls.__name__ == _CONTROL_FLOW for cls in type(error).__mro__):
        return None
    return error


class _Callbacks:
    """The handler's logic; `install` combines it with LangChain's `BaseCallbackHandler`, so this
    module imports nothing of LangChain's until a runner turns the hook on."""

    run_inline = True
    """Called where the run happens, in the attempt's context and in order (not in an executor)."""
    raise_error = False
    ignore_chain = True
    """No chain events (see the module docstring): nodes are named from their chat model runs."""

    def __init__(self) -> None:
        self._steps: dict[UUID, Step] = {}
        """Run id -> the step it started."""
        self._nearest: dict[UUID, Step] = {}
        """Run id -> the innermost step at or above it, so steps nest through runs in between (a
        node that invokes a subgraph, a tool that runs an agent)."""

    def _parent(self, parent_run_id: UUID | None) -> Step | None:
        return self._nearest.get(parent_run_id) if parent_run_id is not None else None

    def _open(self, run_id: UUID, step: Step | None, parent: Step | None) -> None:
        if step is not None:
            self._steps[run_id] = step
        nearest = step if step is not None else parent
        if nearest is not None:
            self._nearest[run_id] = nearest

    def _close(self, run_id: UUID) -> Step | None:
        self._nearest.pop(run_id, None)
        return self._steps.pop(run_id, None)

    def on_chat_model_start(
        self,
        serialized: dict[str, Any] | None,
        messages: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        node = (metadata or {}).get(_NODE_KEY)
        parent = self._parent(parent_run_id)
        step = None
        if (
            isinstance(node, str)
            and node
            and not node.startswith("__")
            and not (tags and _HIDDEN_TAG in tags)
        ):
            step = start_agent(node, FRAMEWORK, parent)
        self._open(run_id, step, parent)

    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        step = self._close(run_id)
        if step is not None:
            step.end()

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        step = self._close(run_id)
        if step is not None:
            step.end(_failure(error))

    def on_tool_start(
        self,
        serialized: dict[str, Any] | None,
        input_str: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        name = kwargs.get("name") or (serialized or {}).get("name") or "tool"
        parent = self._parent(parent_run_id)
        self._open(run_id, start_tool(str(name), FRAMEWORK, parent), parent)

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        step = self._close(run_id)
        if step is not None:
            # A tool may report its own failure as a ToolMessage with status "error".
            failed = getattr(output, "status", None) == "error"
            step.end(f"tool returned an error: {getattr(output, 'content', '')}" if failed else None)

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        step = self._close(run_id)
        if step is not None:
            step.end(_failure(error))


class _HandlerInAttempt:
    """Stands in for the ContextVar that `register_configure_hook` takes (LangChain only calls its
    `get()`): it yields the handler only while an attempt records framework telemetry."""

    def __init__(self, handler: Any) -> None:
        self._handler = handler

    def get(self) -> Any:
        return self._handler if recording_attempt() is not None else None


def install() -> None:
    """Register the configure hook once per process."""
    global _installed
    with _lock:
        if _installed:
            return
        from langchain_core.callbacks import BaseCallbackHandler
        from langchain_core.tracers.context import register_configure_hook

        handler_class = type("ReinforgeCallbackHandler", (_Callbacks, BaseCallbackHandler), {})
        hook: Any = _HandlerInAttempt(handler_class())  # typed as a ContextVar by LangChain
        register_configure_hook(hook, inheritable=True)
        _installed = True
