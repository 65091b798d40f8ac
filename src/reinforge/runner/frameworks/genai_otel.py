"""Frameworks with native OpenTelemetry (AutoGen, the Anthropic SDK): their GenAI-convention spans
become reinforge steps.

Their spans already reach the store through the global tracer provider (the runner installs
reinforge's, or adds its processor to the application's); what they lack is reinforge's step
attributes. `execute_tool` spans become tool steps (failed: the `tool_error` signal) and
`invoke_agent` spans agent steps. A span that already is a reinforge step is left alone.
"""

from __future__ import annotations

from typing import Any

from reinforge.runner.frameworks.steps import agent_step_attributes, tool_step_attributes
from reinforge.semconv import ATTR_STEP_KIND
from reinforge.tracing.provider import add_span_translator, install_global_tracer_provider
from reinforge.types import Span, SpanStatusCode

FRAMEWORK = "otel_genai"
OPERATION = "gen_ai.operation.name"
TOOL_NAME = "gen_ai.tool.name"
AGENT_NAME = "gen_ai.agent.name"
ERROR_TYPE = "error.type"


def _name(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def genai_steps(span: Span) -> Span:
    """`span` with reinforge's step attributes when it is a GenAI tool or agent run.

    The same mapping as the gateway's OTLP receiver gives a command agent's spans: a tool execution
    (`execute_tool`, or any span naming `gen_ai.tool.name`) is a tool step, failed when its status is
    an error or it names an `error.type`; `invoke_agent` is an agent step, a role for credit once
    `gen_ai.agent.name` names it (the Anthropic tool runner's names none).
    """
    attrs = span.attributes
    if ATTR_STEP_KIND in attrs:
        return span
    operation = attrs.get(OPERATION)
    tool = _name(attrs.get(TOOL_NAME))
    agent = _name(attrs.get(AGENT_NAME))
    if operation == "execute_tool" or tool is not None:
        failed = span.status.code == SpanStatusCode.error or ERROR_TYPE in attrs
        name = tool or span.name.removeprefix("execute_tool ")
        added = tool_step_attributes(name, FRAMEWORK, agent, failed=failed)
    elif operation == "invoke_agent":
        added = agent_step_attributes(agent, FRAMEWORK)
    else:
        return span
    return span.model_copy(update={"attributes": {**attrs, **added}})


def install() -> None:
    """Route global OpenTelemetry spans to the store and translate them (idempotent)."""
    install_global_tracer_provider()
    add_span_translator(genai_steps)
