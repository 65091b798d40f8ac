"""A command agent's own OpenTelemetry SDK exports to the gateway with only the environment the runner
gives it: its spans land in the store under its attempt, and a failed tool is an AIR signal."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from reinforge import semconv
from reinforge.access import attempt_token
from reinforge.credit import CreditConfig, build_transitions
from reinforge.runner import CommandAgent, Runner
from reinforge.runner.llm import LLM
from reinforge.types import AttemptQuery, RolloutStatus, SpanQuery, SpanStatusCode

from .conftest import GATEWAY_SECRET, Stack, enqueue, wait_final

pytest.importorskip("opentelemetry.exporter.otlp.proto.http.trace_exporter")

AGENT = """
import json, os, urllib.request

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

# No endpoint, key or service name here: the exporter reads OTEL_EXPORTER_OTLP_TRACES_* from the env.
provider = TracerProvider()
provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
trace.set_tracer_provider(provider)
tracer = trace.get_tracer("calc.agent")


def chat(question):
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps({"model": os.environ["OPENAI_MODEL"],
                         "messages": [{"role": "user", "content": question}]}).encode(),
        headers={"Content-Type": "application/json",
                 "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]},
    )
    with urllib.request.urlopen(request) as response:
        return json.load(response)["choices"][0]["message"]["content"]


task = json.loads(os.environ["REINFORGE_TASK"])
with tracer.start_as_current_span(
    "invoke_agent calc", attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "calc"}
):
    chat(task["question"])
    try:
        with tracer.start_as_current_span(
            "execute_tool calculator",
            attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "calculator"},
        ):
            1 / 0  # the tool fails: the SDK records the exception and sets error status
    except ZeroDivisionError:
        pass
provider.shutdown()  # exports what is left, before the process exits
print("REINFORGE_REWARD=1")
"""


async def test_a_command_s_otel_spans_reach_the_store_and_credit(stack: Stack, tmp_path: Path) -> None:
    script = tmp_path / "otel_agent.py"
    script.write_text(AGENT)
    agent = CommandAgent([sys.executable, str(script)], timeout_s=60, name="calc")
    rollouts = await enqueue(stack.store, {"question": "what is 2 + 2?"})
    stats = await Runner(stack.store, agent, stack.gateway_url, GATEWAY_SECRET).run(max_rollouts=1)
    assert stats.succeeded == 1, stats.errors
    (done,) = await wait_final(stack.store, rollouts)
    assert done.status == RolloutStatus.succeeded and done.reward == 1.0

    attempts = (await stack.store.query_attempts(AttemptQuery(rollout_id=done.rollout_id))).items
    spans = (await stack.store.query_spans(SpanQuery(rollout_id=done.rollout_id))).items
    by_name = {s.name: s for s in spans}
    assert set(by_name) == {
        semconv.SPAN_LLM_CALL,
        "invoke_agent calc",
        "execute_tool calculator",
    }
    tool, agent_span = by_name["execute_tool calculator"], by_name["invoke_agent calc"]
    assert {tool.attempt_id, agent_span.attempt_id} == {attempts[0].attempt_id}
    assert tool.parent_id == agent_span.span_id and tool.trace_id == agent_span.trace_id
    assert tool.status.code is SpanStatusCode.error
    assert [e.name for e in tool.events] == ["exception"]
    assert tool.events[0].attributes["exception.type"] == "ZeroDivisionError"
    assert tool.attributes[semconv.ATTR_STEP_KIND] == semconv.STEP_TOOL
    assert tool.attributes[semconv.ATTR_TOOL_NAME] == "calculator"
    assert tool.attributes[semconv.ATTR_AIR_SIGNAL] == semconv.AIR_TOOL_ERROR
    assert agent_span.attributes[semconv.ATTR_AGENT_NAME] == "calc"
    assert tool.attributes["service.name"] == "calc"  # OTEL_SERVICE_NAME: the agent's name
    assert tool.attributes["otel.scope.name"] == "calc.agent"

    transitions, metrics = build_transitions(
        done, spans, CreditConfig(assignment="equal+air"), attempts=attempts
    )
    assert metrics.air_signals == {semconv.AIR_TOOL_ERROR: 1}
    [transition] = transitions
    assert transition.reward_sources == {"equal": 1.0, "air": pytest.approx(-0.2)}


def _llm(attempt_id: str) -> LLM:
    token = attempt_token(GATEWAY_SECRET, attempt_id)
    return LLM.for_attempt("http://127.0.0.1:9/gateway", attempt_id, token, "policy")


def test_the_runner_sets_the_exporter_s_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    llm = _llm("a1")
    env = CommandAgent(["true"]).build_env({}, llm, "r1", "a1")
    assert env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] == "http://127.0.0.1:9/gateway/r/a1/v1/traces"
    assert env["OTEL_EXPORTER_OTLP_TRACES_HEADERS"] == f"Authorization=Bearer%20{llm.api_key}"
    assert env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"
    assert env["OTEL_SERVICE_NAME"] == "reinforge-agent"
    # A runner's own OTEL_* settings are not inherited unless passed.
    monkeypatch.setenv("OTEL_SERVICE_NAME", "runner-itself")
    assert (
        CommandAgent(["true"], name="solver").build_env({}, llm, "r1", "a1")["OTEL_SERVICE_NAME"] == "solver"
    )


def test_the_user_s_own_settings_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://collector:4318/v1/traces")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "my-service")
    agent = CommandAgent(["true"], pass_env=["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SERVICE_NAME"])
    env = agent.build_env({}, _llm("a2"), "r2", "a2")
    assert env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] == "http://collector:4318/v1/traces"
    assert env["OTEL_SERVICE_NAME"] == "my-service"
    # The attempt's key is not sent to someone else's collector, nor a protocol forced on it.
    assert "OTEL_EXPORTER_OTLP_TRACES_HEADERS" not in env
    assert "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL" not in env

    explicit = CommandAgent(["true"], env={"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"})
    env = explicit.build_env({}, _llm("a3"), "r3", "a3")
    assert env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/json"
    assert env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"].endswith("/r/a3/v1/traces")
