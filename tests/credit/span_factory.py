"""Spans shaped exactly as the gateway and tracing layers write them (reinforge.semconv)."""

from __future__ import annotations

from typing import Any

from reinforge import semconv
from reinforge.types import Rollout, RolloutStatus, Span, SpanStatus, SpanStatusCode


def rollout(
    rollout_id: str = "r1",
    reward: float | None = 1.0,
    status: RolloutStatus = RolloutStatus.succeeded,
    group_id: str | None = "g1",
    error: str | None = None,
) -> Rollout:
    return Rollout(
        rollout_id=rollout_id, task_id="t1", group_id=group_id, status=status, reward=reward, error=error
    )


def llm_span(
    prompt: list[int],
    completion: list[int],
    *,
    t: float,
    rollout_id: str = "r1",
    attempt_id: str = "a1",
    logprobs: list[float] | None = None,
    agent: str | None = None,
    seq: int | None = None,
    version: int = 0,
    malformed: bool = False,
    store_seq: int | None = None,
    parent_id: str | None = None,
    duration: float = 0.1,
) -> Span:
    attrs: dict[str, Any] = {
        semconv.ATTR_STEP_KIND: semconv.STEP_LLM,
        semconv.ATTR_PROMPT_TOKEN_IDS: prompt,
        semconv.ATTR_COMPLETION_TOKEN_IDS: completion,
        semconv.ATTR_COMPLETION_LOGPROBS: logprobs if logprobs is not None else [-0.5] * len(completion),
        semconv.ATTR_POLICY_VERSION: version,
        semconv.ATTR_LLM_ENDPOINT: "chat.completions",
    }
    if agent is not None:
        attrs[semconv.ATTR_AGENT_NAME] = agent
    if seq is not None:
        attrs[semconv.ATTR_SEQUENCE_IN_ATTEMPT] = seq
    if malformed:
        attrs[semconv.ATTR_MALFORMED_TOOL_CALL] = True
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        name=semconv.SPAN_LLM_CALL,
        kind="client",
        start_time=t,
        end_time=t + duration,
        attributes=attrs,
        sequence=store_seq,
        parent_id=parent_id,
    )


def tool_span(*, t: float, error: bool = False, rollout_id: str = "r1", attempt_id: str = "a1") -> Span:
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        name="calculator",
        start_time=t,
        end_time=t + 0.01,
        attributes={semconv.ATTR_STEP_KIND: semconv.STEP_TOOL, semconv.ATTR_TOOL_NAME: "calculator"},
        status=SpanStatus(code=SpanStatusCode.error if error else SpanStatusCode.ok, message="bad expr"),
    )


def reward_span(
    value: float, *, t: float, final: bool = False, rollout_id: str = "r1", attempt_id: str = "a1"
) -> Span:
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        name=semconv.SPAN_FINAL_REWARD if final else semconv.SPAN_REWARD,
        start_time=t,
        end_time=t,
        attributes={semconv.ATTR_STEP_KIND: semconv.STEP_REWARD, semconv.ATTR_REWARD_VALUE: value},
    )


def signal_span(signal: str, *, t: float, rollout_id: str = "r1", attempt_id: str = "a1") -> Span:
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        name="reinforge.signal",
        start_time=t,
        end_time=t,
        attributes={semconv.ATTR_AIR_SIGNAL: signal},
    )


def role_span(
    name: str,
    *,
    t: float,
    end: float | None,
    parent_id: str | None = None,
    rollout_id: str = "r1",
    attempt_id: str = "a1",
) -> Span:
    """An agent-role step as the framework hooks record it (a LangGraph node, an SDK agent)."""
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        name=name,
        start_time=t,
        end_time=end,
        parent_id=parent_id,
        attributes={semconv.ATTR_STEP_KIND: semconv.STEP_AGENT, semconv.ATTR_AGENT_NAME: name},
    )


def client_span(name: str, *, t: float, parent_id: str | None, attempt_id: str = "a1") -> Span:
    """A span of the agent's own instrumentation with no reinforge step kind (an SDK's CLIENT span)."""
    return Span(
        rollout_id="r1", attempt_id=attempt_id, name=name, start_time=t, end_time=t + 0.2, parent_id=parent_id
    )
