"""Reading an attempt's spans: which attempt counts, its LLM calls in order (named after their
agent role when no name was given), and the rewards and system signals that happened after each
call."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from reinforge import semconv
from reinforge.credit.roles import join_roles
from reinforge.types import Attempt, AttemptStatus, Rollout, RolloutStatus, Span, SpanStatusCode


@dataclass
class LLMCall:
    """One recorded LLM call, plus the credit events that the spans after it attach to it."""

    span: Span
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    policy_version: int
    agent_name: str | None
    emitted: float = 0.0
    air: dict[str, int] = field(default_factory=dict)
    """AIR signal → how many times this call caused it."""


@dataclass
class AttemptCalls:
    """What credit/ needs from one attempt."""

    calls: list[LLMCall]
    skipped: int
    dropped_events: int
    """Emitted rewards or signals that arrived before any usable LLM call."""
    named_by_role: int = 0
    """Calls without an explicit agent name that were named after their framework role."""
    role_ambiguous: int = 0
    """Calls without an agent name inside overlapping roles of different names (left unnamed)."""


def select_attempt(rollout: Rollout, spans: Sequence[Span], attempts: Sequence[Attempt]) -> str | None:
    """The attempt whose spans are trained on: the last succeeded one, else the last one.

    Without attempt records, the attempt whose first span started last is taken: a retry starts after
    the attempt it replaces.
    """
    mine = [a for a in attempts if a.rollout_id == rollout.rollout_id]
    if mine:
        succeeded = [a for a in mine if a.status == AttemptStatus.succeeded]
        return max(succeeded or mine, key=lambda a: a.attempt_no).attempt_id
    first_start: dict[str, tuple[float, int]] = {}
    for span in spans:
        if span.rollout_id != rollout.rollout_id:
            continue
        key = (span.start_time, span.sequence if span.sequence is not None else -1)
        first_start[span.attempt_id] = min(first_start.get(span.attempt_id, key), key)
    if not first_start:
        return None
    return max(first_start, key=lambda attempt_id: first_start[attempt_id])


def _int_list(value: Any) -> list[int] | None:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return None
    return list(value)


def _float_list(value: Any, length: int) -> list[float] | None:
    if not isinstance(value, list) or len(value) != length:
        return None
    out: list[float] = []
    for v in value:
        if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v) or v > 1e-3:
            return None
        # log_softmax can round a near-certain token to a hair above 0.
        out.append(min(float(v), 0.0))
    return out


def _order_key(span: Span) -> tuple[float, float, int]:
    seq = span.attributes.get(semconv.ATTR_SEQUENCE_IN_ATTEMPT)
    writer_seq = float(seq) if isinstance(seq, int | float) and not isinstance(seq, bool) else math.inf
    return (writer_seq, span.start_time, span.sequence if span.sequence is not None else -1)


def _time_key(span: Span) -> tuple[float, int]:
    return (span.start_time, span.sequence if span.sequence is not None else -1)


def _is_llm_call(span: Span) -> bool:
    return span.name == semconv.SPAN_LLM_CALL or (
        span.attributes.get(semconv.ATTR_STEP_KIND) == semconv.STEP_LLM
        and semconv.ATTR_COMPLETION_TOKEN_IDS in span.attributes
    )


def _to_call(span: Span) -> LLMCall | None:
    """None when the span lacks what training needs (token ids, one logprob per token)."""
    attrs = span.attributes
    prompt = _int_list(attrs.get(semconv.ATTR_PROMPT_TOKEN_IDS))
    response = _int_list(attrs.get(semconv.ATTR_COMPLETION_TOKEN_IDS))
    if not prompt or not response:
        return None
    logprobs = _float_list(attrs.get(semconv.ATTR_COMPLETION_LOGPROBS), len(response))
    if logprobs is None:
        return None
    version = attrs.get(semconv.ATTR_POLICY_VERSION, 0)
    agent = attrs.get(semconv.ATTR_AGENT_NAME)
    call = LLMCall(
        span=span,
        prompt_ids=prompt,
        response_ids=response,
        logprobs=logprobs,
        policy_version=version if isinstance(version, int) and version >= 0 else 0,
        agent_name=agent if isinstance(agent, str) and agent else None,
    )
    if attrs.get(semconv.ATTR_MALFORMED_TOOL_CALL) is True:
        call.air[semconv.AIR_MALFORMED_TOOL_CALL] = 1
    return call


def _reward_value(span: Span) -> float | None:
    value = span.attributes.get(semconv.ATTR_REWARD_VALUE)
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _air_signal(span: Span) -> str | None:
    signal = span.attributes.get(semconv.ATTR_AIR_SIGNAL)
    if signal in (semconv.AIR_TOOL_ERROR, semconv.AIR_MALFORMED_TOOL_CALL, semconv.AIR_TIMEOUT):
        return str(signal)
    is_tool = span.attributes.get(semconv.ATTR_STEP_KIND) == semconv.STEP_TOOL
    if is_tool and span.status.code == SpanStatusCode.error:
        return semconv.AIR_TOOL_ERROR
    return None


def attempt_timed_out(rollout: Rollout, attempts: Sequence[Attempt], attempt_id: str) -> bool:
    """Whether the trained attempt ended by running out of time (lease expiry or a timeout error)."""
    for attempt in attempts:
        if attempt.attempt_id == attempt_id:
            if attempt.status == AttemptStatus.timeout:
                return True
            return attempt.status == AttemptStatus.failed and _mentions_timeout(attempt.error)
    return rollout.status == RolloutStatus.failed and _mentions_timeout(rollout.error)


def _mentions_timeout(error: str | None) -> bool:
    text = (error or "").lower()
    return "timeout" in text or "timed out" in text


def read_attempt(spans: Sequence[Span], attempt_id: str) -> AttemptCalls:
    """The attempt's usable LLM calls in order, with emitted rewards and AIR signals attached to the
    call that preceded them (by start time). Final-reward spans are not read: the attempt's final
    reward is its stored outcome (`Rollout.reward`)."""
    own = [s for s in spans if s.attempt_id == attempt_id]
    llm_spans = sorted((s for s in own if _is_llm_call(s)), key=_order_key)
    calls: list[LLMCall] = []
    skipped = 0
    for span in llm_spans:
        call = _to_call(span)
        if call is None:
            skipped += 1
        else:
            calls.append(call)
    named, ambiguous = _name_by_role(own, calls)
    charged_elsewhere = _inner_tool_errors(own)

    dropped = 0
    for span in sorted((s for s in own if not _is_llm_call(s)), key=_time_key):
        emitted = _reward_value(span) if span.name == semconv.SPAN_REWARD else None
        signal = _air_signal(span)
        if signal == semconv.AIR_TOOL_ERROR and span.span_id in charged_elsewhere:
            signal = None
        if emitted is None and signal is None:
            continue
        # Different writers keep different per-attempt counters, so the wall clock (then store order)
        # is what relates a reward or tool span to the LLM calls.
        before = [c for c in calls if _time_key(c.span) <= _time_key(span)]
        if not before:
            dropped += 1
            continue
        owner = max(before, key=lambda c: _time_key(c.span))
        if emitted is not None:
            owner.emitted += emitted
        if signal is not None:
            owner.air[signal] = owner.air.get(signal, 0) + 1
    return AttemptCalls(
        calls=calls,
        skipped=skipped,
        dropped_events=dropped,
        named_by_role=named,
        role_ambiguous=ambiguous,
    )


def _inner_tool_errors(own: Sequence[Span]) -> set[str]:
    """The agent's own failed tool spans (`reinforge.span(kind="tool")`) that ran inside a failed tool
    step of a framework hook: one failure that two layers recorded, charged once, to the framework's
    step. Framework steps never absorb one another, so parallel tool calls each still count."""
    failed = [
        s
        for s in own
        if s.attributes.get(semconv.ATTR_STEP_KIND) == semconv.STEP_TOOL
        and _air_signal(s) == semconv.AIR_TOOL_ERROR
    ]
    outer = [s for s in failed if semconv.ATTR_FRAMEWORK in s.attributes]
    if not outer:
        return set()

    def end(span: Span) -> float:
        return span.end_time if span.end_time is not None else math.inf

    return {
        s.span_id
        for s in failed
        if semconv.ATTR_FRAMEWORK not in s.attributes
        and any(o.start_time <= s.start_time and end(s) <= end(o) for o in outer)
    }


def _name_by_role(own: Sequence[Span], calls: list[LLMCall]) -> tuple[int, int]:
    """Give unnamed calls their framework role's name (an explicit name always wins); returns how
    many were named and how many were ambiguous."""
    unnamed = [c for c in calls if c.agent_name is None]
    if not unnamed:
        return 0, 0
    join = join_roles(own, (c.span for c in unnamed))
    for call in unnamed:
        call.agent_name = join.names.get(call.span.span_id)
    return len(join.names), join.ambiguous
