"""Record a framework's tool and agent runs as reinforge steps of the current attempt.

A framework hook sees a run start and end as two callbacks, often on different tasks, so a step is an
OpenTelemetry span that is started without being made current (there is nothing to detach) and ended
by whichever callback sees the run finish. reinforge's own tracer starts it, so it belongs to the
attempt current at its start and reaches the store through that attempt's writer, as a
`reinforge.span` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from reinforge.semconv import (
    AIR_TOOL_ERROR,
    ATTR_AGENT_NAME,
    ATTR_AIR_SIGNAL,
    ATTR_FRAMEWORK,
    ATTR_STEP_KIND,
    ATTR_TOOL_NAME,
    STEP_AGENT,
    STEP_TOOL,
)
from reinforge.tracing.context import AttemptContext, current_attempt
from reinforge.tracing.processor import encode_attributes
from reinforge.tracing.provider import get_tracer


def recording_attempt() -> AttemptContext | None:
    """The current attempt if it records framework telemetry; hooks do nothing when this is None."""
    attempt = current_attempt()
    return attempt if attempt is not None and attempt.framework_telemetry else None


@dataclass(frozen=True, slots=True)
class Step:
    """One open tool or agent step."""

    otel: trace.Span
    is_tool: bool

    def end(self, error: BaseException | str | None = None) -> None:
        """End the step; an error marks it failed (and a tool step with the `tool_error` signal)."""
        if error is not None:
            if isinstance(error, BaseException):
                self.otel.record_exception(error)
                message = f"{type(error).__name__}: {error}"
            else:
                message = error
            self.otel.set_status(Status(StatusCode.ERROR, message))
            if self.is_tool:
                self.otel.set_attribute(ATTR_AIR_SIGNAL, AIR_TOOL_ERROR)
        self.otel.end()


def tool_step_attributes(
    name: str, framework: str, agent: str | None, *, failed: bool = False
) -> dict[str, Any]:
    """What makes a span a tool step of `agent` (a failed one carries AIR's `tool_error` signal):
    the one mapping for framework hooks and for translated GenAI spans."""
    attrs: dict[str, Any] = {ATTR_STEP_KIND: STEP_TOOL, ATTR_TOOL_NAME: name, ATTR_FRAMEWORK: framework}
    if failed:
        attrs[ATTR_AIR_SIGNAL] = AIR_TOOL_ERROR
    return _with_agent(attrs, agent)


def agent_step_attributes(name: str | None, framework: str) -> dict[str, Any]:
    """What makes a span an agent step; credit names the calls inside it `name` when there is one."""
    return _with_agent({ATTR_STEP_KIND: STEP_AGENT, ATTR_FRAMEWORK: framework}, name)


def _with_agent(attrs: dict[str, Any], agent: str | None) -> dict[str, Any]:
    if agent is not None:
        attrs[ATTR_AGENT_NAME] = agent
    return attrs


def start_tool(name: str, framework: str, parent: Step | None = None) -> Step | None:
    """A tool step of the current attempt, or None outside a recording attempt."""
    attempt = recording_attempt()
    if attempt is None:
        return None
    return _start(name, tool_step_attributes(name, framework, attempt.agent_name), parent, is_tool=True)


def start_agent(name: str, framework: str, parent: Step | None = None) -> Step | None:
    """An agent-role step (credit names the LLM calls inside it `name`), or None outside a recording
    attempt."""
    if recording_attempt() is None:
        return None
    return _start(name, agent_step_attributes(name, framework), parent, is_tool=False)


def _start(name: str, attrs: dict[str, Any], parent: Step | None, *, is_tool: bool) -> Step:
    context = trace.set_span_in_context(parent.otel) if parent is not None else None
    otel = get_tracer().start_span(name, context=context, attributes=encode_attributes(attrs))
    return Step(otel, is_tool)
