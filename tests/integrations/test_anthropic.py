"""The Anthropic SDK's own OpenTelemetry, against the recorded canned server: its failing tool is a
tool step with the AIR signal, and the `traceparent` on each request names a span stored for the
attempt, so the gateway's LLM span hangs under the SDK's spans."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("anthropic")

import anthropic
from anthropic import beta_tool

from reinforge import semconv
from reinforge.runner.frameworks import instrument_frameworks
from reinforge.tracing import attempt_scope
from reinforge.types import SpanStatusCode

from .collect import Collected, attempt

recorder = pytest.importorskip("fixtures.frameworks.recorder")


@pytest.fixture
def server() -> Any:
    served = recorder.RecordingServer().start()
    yield served
    served.stop()


def test_tool_runner_spans_become_steps_and_requests_carry_their_parent(server: Any) -> None:
    @beta_tool
    def calculator(expression: str, precision: int = 2) -> str:
        """Evaluate an arithmetic expression and round the result."""
        return recorder.calculate(expression, precision)

    instrument_frameworks()
    sink = Collected()
    with attempt_scope(attempt(sink)):
        client = anthropic.Anthropic(base_url=server.root, api_key="sk-local", max_retries=0)
        runner = client.beta.messages.tool_runner(
            model=recorder.MODEL,
            max_tokens=256,
            tools=[calculator],
            messages=[{"role": "user", "content": recorder.QUESTION}],
            thread=False,
        )
        runner.until_done()

    by_id = {s.span_id: s for s in sink.spans}
    tools = [s for s in sink.spans if s.attributes.get(semconv.ATTR_STEP_KIND) == semconv.STEP_TOOL]
    assert [(t.attributes[semconv.ATTR_TOOL_NAME], t.status.code) for t in tools] == [
        ("calculator", SpanStatusCode.error),
        ("calculator", SpanStatusCode.ok),
    ]
    assert tools[0].attributes[semconv.ATTR_AIR_SIGNAL] == semconv.AIR_TOOL_ERROR
    assert semconv.ATTR_AIR_SIGNAL not in tools[1].attributes
    # The tool runner's invoke_agent span is an agent step that names no agent: no role for credit.
    (runner_step,) = [s for s in sink.spans if s.attributes.get(semconv.ATTR_STEP_KIND) == semconv.STEP_AGENT]
    assert runner_step.name == "anthropic.messages.tool_runner"
    assert semconv.ATTR_AGENT_NAME not in runner_step.attributes
    assert all(t.parent_id == runner_step.span_id for t in tools)

    requests = server.take()
    assert len(requests) == 3
    for request in requests:
        _, trace_id, parent_id, _ = request["headers"]["traceparent"].split("-")
        create = by_id[parent_id]
        assert (create.name, create.trace_id) == ("anthropic.messages.create", trace_id)
        assert (
            create.parent_id is not None and by_id[create.parent_id].name == "anthropic.messages.tool_runner"
        )
